#!/usr/bin/env bash
# qemu-kernel.sh: make Debian's 6.1 kernel and qemu ready for e2e/qemu, and
# print where they are.
#
# Our product reads exit statuses with ptrace on kernels older than 6.15 (no
# PIDFD_INFO_EXIT there). This machine runs a newer kernel, so the tests boot a
# real Debian 6.1 kernel under qemu. This script:
#   - installs qemu-system-x86 and busybox-static (apt),
#   - downloads $KERNEL_61_PKG=$KERNEL_61_VERSION (e2e/versions.env) with
#     `apt-get download` and unpacks vmlinuz, its config and the whole module
#     tree into $(cached kernel-6.1 ...), once; the .deb is not kept; the
#     kernel is also decompressed to an ELF vmlinux,
#   - prints KEY=VALUE lines on stdout (the Go package e2e/qemu parses them):
#       KERNEL=   the kernel to pass to qemu -kernel: the uncompressed ELF
#                 (vmlinux, booted via PVH, much faster under TCG) when it
#                 could be extracted, else the bzImage
#       MODULES=  /lib/modules/<release> of that kernel, with a modules.dep
#       RELEASE=  its `uname -r`
#       QEMU=     qemu-system-x86_64
#       BUSYBOX=  a static busybox for the guest's userland
#
# Idempotent and safe to run concurrently (a lock around the unpack); a warm
# run only checks dpkg and a stamp file. Needs root for the apt steps on a
# cold machine. Logs go to stderr.
#
# Usage: e2e/scripts/qemu-kernel.sh

. "$(dirname "$0")/lib.sh"

: "${KERNEL_61_PKG:?KERNEL_61_PKG missing from e2e/versions.env}"
: "${KERNEL_61_VERSION:?KERNEL_61_VERSION missing from e2e/versions.env}"

apt_install qemu-system-x86 busybox-static xz-utils

qemu="$(command -v qemu-system-x86_64)" || die "qemu-system-x86_64 not on PATH after installing qemu-system-x86"
busybox=/bin/busybox
# busybox-static conflicts with (replaces) the dynamically linked busybox
# package, so once it is installed /bin/busybox runs without a libc.
[ -x "$busybox" ] || die "$busybox missing after installing busybox-static"

# The cache key carries the ABI name and the Debian revision: both change
# independently (a rebuild of the same ABI gets a new revision).
dir="$(cached kernel-6.1 "${KERNEL_61_PKG#linux-image-}_${KERNEL_61_VERSION}")"
stamp="$dir/.complete"

# extract_vmlinux BZIMAGE OUT: write the uncompressed ELF kernel inside a
# bzImage. qemu boots such an ELF straight at its PVH entry point (Debian
# builds with CONFIG_PVH), which skips the firmware's kernel loading and the
# in-guest xz decompression: under TCG that cuts a boot from about 8 s to 3 s.
# Debian's 6.1 kernels are xz-compressed; anything else keeps the bzImage.
extract_vmlinux() {
	local off
	for off in $(LC_ALL=C grep -abo $'\xfd7zXZ' "$1" | cut -d: -f1); do
		# xz stops reading after the stream, so tail may die of SIGPIPE:
		# under pipefail that must not count as a failure.
		if { tail -c +$((off + 1)) "$1" || true; } | xz -dc --single-stream >"$2.tmp" 2>/dev/null &&
			[ "$(head -c 4 "$2.tmp")" = $'\x7fELF' ]; then
			mv "$2.tmp" "$2"
			return 0
		fi
	done
	rm -f "$2.tmp"
	log "no xz-compressed ELF kernel inside $1; booting the bzImage (slower)"
}

fetch() {
	local tmp deb
	# An unpack interrupted halfway leaves no stamp; start it again from scratch.
	rm -rf "$dir/boot" "$dir/lib" "$dir/vmlinuz" "$dir/vmlinux" "$dir/config" "$dir/release" "$dir"/.tmp.*
	tmp="$(mktemp -d "$dir/.tmp.XXXXXX")"
	# As root, apt fetches as user _apt, which cannot write into root's
	# private cache and says so in a warning; fetch as root instead.
	local sandbox=
	[ "$(id -u)" -ne 0 ] || sandbox='-o APT::Sandbox::User=root'
	log "apt-get download $KERNEL_61_PKG=$KERNEL_61_VERSION"
	if ! (cd "$tmp" && apt-get download -q $sandbox "$KERNEL_61_PKG=$KERNEL_61_VERSION" >&2); then
		# apt-get update runs at most once per boot (lib.sh): a stale list is
		# the usual cause on a long-lived machine, so refresh once and retry.
		log "apt-get update (the package list may be stale)"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || true
		if ! (cd "$tmp" && apt-get download -q $sandbox "$KERNEL_61_PKG=$KERNEL_61_VERSION" >&2); then
			rm -rf "$tmp"
			die "cannot download $KERNEL_61_PKG=$KERNEL_61_VERSION from Debian's archive (is it reachable? Debian removes superseded kernels: pick a current one with \`apt-cache search 'linux-image-6.1.0-.*-amd64-unsigned'\` and \`apt-cache policy PKG\`, then update KERNEL_61_PKG and KERNEL_61_VERSION in e2e/versions.env)"
		fi
	fi
	deb="$(ls "$tmp"/*.deb)"
	log "unpack $(basename "$deb")"
	# Only the kernel image, its config and the modules: the rest of the
	# package (docs, System.map) is not needed to boot it.
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*' './boot/config-*' './lib/modules/*'
	rm -f "$deb"
	local vmlinuz release
	vmlinuz="$(ls "$tmp"/boot/vmlinuz-*)"
	release="${vmlinuz##*/vmlinuz-}"
	[ -d "$tmp/lib/modules/$release" ] || die "package has no /lib/modules/$release"
	# The package leaves modules.dep to depmod at install time; busybox's
	# depmod writes the same format (kmod's depmod is not installed here).
	log "depmod $release"
	"$busybox" depmod -b "$tmp" "$release"
	mv "$tmp/boot" "$tmp/lib" "$dir/"
	rmdir "$tmp"
	ln -sfn "boot/vmlinuz-$release" "$dir/vmlinuz"
	extract_vmlinux "$dir/boot/vmlinuz-$release" "$dir/vmlinux"
	ln -sfn "boot/config-$release" "$dir/config"
	printf '%s\n' "$release" >"$dir/release"
	touch "$stamp"
}

if [ ! -e "$stamp" ]; then
	# Several test processes may call this at once (go test runs packages in
	# parallel); the second waits for the first one's unpack.
	exec 9>"$dir/.lock"
	flock -w 600 9 || die "timed out waiting for the lock on $dir"
	[ -e "$stamp" ] || fetch
	exec 9>&-
fi

release="$(cat "$dir/release")"
kernel="$dir/vmlinuz"
[ ! -e "$dir/vmlinux" ] || kernel="$dir/vmlinux"
printf 'KERNEL=%s\n' "$kernel"
printf 'MODULES=%s\n' "$dir/lib/modules/$release"
printf 'RELEASE=%s\n' "$release"
printf 'QEMU=%s\n' "$qemu"
printf 'BUSYBOX=%s\n' "$busybox"
