#!/usr/bin/env bash
# qemu-kernel.sh: make one of Debian's kernels, qemu and a static busybox ready
# for e2e/qemu, and print where they are.
#
# Our product reads exit statuses with pidfd on Linux 6.15+ and with ptrace
# before that, on amd64 and arm64 nodes. The tests boot real Debian kernels
# under qemu (software emulation) to exercise both paths on both
# architectures. The kernels are named in e2e/versions.env (QEMU_KERNEL_<name>:
# suite, architecture, version, packages); this script:
#   - installs qemu for the kernel's architecture (qemu-system-x86 or
#     qemu-system-arm) and busybox-static (apt, the machine's sources),
#   - downloads the kernel's packages with `apt-get download` through a
#     sources list of the tests' own, under the cache (bookworm, trixie and sid
#     with their updates and security archives, amd64 and arm64), never the
#     machine's, and unpacks vmlinuz, its config and its module tree (when the
#     package has one) into $(cached kernel/<name> ...), once; the .debs are not
#     kept; an amd64 kernel is also decompressed to an ELF vmlinux,
#   - for a guest of another architecture than this machine's, unpacks
#     bookworm's busybox-static for it the same way,
#   - prints KEY=VALUE lines on stdout (the Go package e2e/qemu parses them):
#       NAME=     the kernel's name, e.g. sid-arm64
#       ARCH=     its Go architecture: amd64 or arm64
#       KERNEL=   the kernel to pass to qemu -kernel: for amd64 the
#                 uncompressed ELF (vmlinux, booted via PVH, much faster under
#                 TCG) when it could be extracted, else the bzImage; for arm64
#                 the Image (Debian's arm64 vmlinuz is not compressed)
#       RELEASE=  its `uname -r`
#       QEMU=     qemu-system-x86_64 or qemu-system-aarch64
#       BUSYBOX=  a static busybox of the guest's architecture
#
# Idempotent and safe to run concurrently (locks around apt and the unpack); a
# warm run only checks dpkg and a stamp file. Needs root for the apt steps on a
# cold machine. Logs go to stderr.
#
# Usage: e2e/scripts/qemu-kernel.sh [NAME]      (default bookworm-amd64)
#        e2e/scripts/qemu-kernel.sh --names     the names e2e/versions.env defines
#        e2e/scripts/qemu-kernel.sh --list NAME the kernel packages Debian serves
#                                               now for NAME's suite and
#                                               architecture, to bump a pin

. "$(dirname "$0")/lib.sh"

# names: the kernel names versions.env defines.
names() {
	compgen -v QEMU_KERNEL_ | sed 's/^QEMU_KERNEL_//; s/_/-/g'
}

# check_name NAME: die unless versions.env defines NAME. (Not in spec: a
# die in a command substitution would end only the subshell.)
check_name() {
	local var="QEMU_KERNEL_${1//-/_}"
	[ -n "${!var:-}" ] || die "unknown kernel name '$1': e2e/versions.env defines $(names | tr '\n' ' ')"
}

# spec NAME: "SUITE ARCH VERSION PACKAGE..." from versions.env.
spec() {
	local var="QEMU_KERNEL_${1//-/_}"
	printf '%s\n' "${!var}"
}

# --- Debian's archive through the tests' own sources list ---------------------

APT_DIR="$CACHE/debian-apt"

# apt_own [apt-cache] ARGS...: apt-get (or apt-cache) with the tests' own
# sources list, package lists, download cache and architectures (amd64 and
# arm64), apart from the machine's apt state. The machine's apt.conf.d still
# applies (proxies, the archive's validity settings).
apt_own() {
	local tool=apt-get sandbox=()
	if [ "$1" = apt-cache ]; then
		tool=apt-cache
		shift
	fi
	# As root, apt fetches as user _apt, which cannot write into root's
	# private cache and says so in a warning; fetch as root instead.
	[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)
	"$tool" -q \
		-o Dir::Etc::SourceList="$APT_DIR/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
		-o Dir::State="$APT_DIR/state" -o Dir::State::status=/dev/null -o Dir::Cache="$APT_DIR/cache" \
		-o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o APT::Architectures::=arm64 \
		-o Acquire::Languages=none -o Debug::NoLocking=true \
		-o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
		-o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false \
		-o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false \
		"${sandbox[@]}" "$@"
}

# apt_own_update: write the sources list and fetch the package lists.
apt_own_update() {
	mkdir -p "$APT_DIR/state/lists/partial" "$APT_DIR/cache/archives/partial"
	local suite
	{
		printf '# Written by e2e/scripts/qemu-kernel.sh: the archives its kernels come from.\n'
		for suite in bookworm bookworm-updates trixie trixie-updates sid; do
			printf 'deb [arch=amd64,arm64] http://deb.debian.org/debian %s main\n' "$suite"
		done
		for suite in bookworm-security trixie-security; do
			printf 'deb [arch=amd64,arm64] http://deb.debian.org/debian-security %s main\n' "$suite"
		done
	} >"$APT_DIR/sources.list"
	log "apt-get update (the tests' own sources list, $APT_DIR)"
	apt_own update >&2 || die "apt-get update with $APT_DIR/sources.list failed (is Debian's archive reachable?)"
	touch "$APT_DIR/updated"
}

# apt_own_download DIR PKG...: download PKGs (name:arch=version or
# name:arch/suite) into DIR, refreshing the package lists once if they are
# missing or stale. Serialised: two updates at once would corrupt the lists.
apt_own_download() {
	local dir="$1"
	shift
	mkdir -p "$CACHE"
	exec 8>"$CACHE/debian-apt.lock"
	flock -w 600 8 || die "timed out waiting for $CACHE/debian-apt.lock"
	[ -e "$APT_DIR/updated" ] || apt_own_update
	if ! (cd "$dir" && apt_own download "$@" >&2); then
		apt_own_update
		(cd "$dir" && apt_own download "$@" >&2) || return 1
	fi
	exec 8>&-
}

# --- kernel images --------------------------------------------------------

# elf_complete FILE: FILE is an ELF whose section headers lie within it (a
# decompression cut short leaves a header without the rest).
elf_complete() {
	[ "$(head -c 4 "$1")" = $'\x7fELF' ] || return 1
	local shoff shentsize shnum size
	shoff="$(od -An -tu8 -j40 -N8 "$1" | tr -d ' ')"
	shentsize="$(od -An -tu2 -j58 -N2 "$1" | tr -d ' ')"
	shnum="$(od -An -tu2 -j60 -N2 "$1" | tr -d ' ')"
	size="$(stat -c %s "$1")"
	[ "$size" -ge $((shoff + shentsize * shnum)) ]
}

# extract_vmlinux BZIMAGE OUT: write the uncompressed ELF kernel inside a
# bzImage. qemu boots such an ELF straight at its PVH entry point (Debian
# builds with CONFIG_PVH), which skips the firmware's kernel loading and the
# in-guest decompression: under TCG that cuts a boot from about 8 s to 3 s.
# Debian's 6.1 kernels are xz-compressed, 6.12 and later zstd; anything else
# keeps the bzImage.
extract_vmlinux() {
	local off
	for off in $(LC_ALL=C grep -abo $'\xfd7zXZ' "$1" | cut -d: -f1); do
		# xz stops reading after the stream, so tail may die of SIGPIPE:
		# under pipefail that must not count as a failure.
		if { tail -c +$((off + 1)) "$1" || true; } | xz -dc --single-stream >"$2.tmp" 2>/dev/null &&
			elf_complete "$2.tmp"; then
			mv "$2.tmp" "$2"
			return 0
		fi
	done
	for off in $(LC_ALL=C grep -abo $'\x28\xb5\x2f\xfd' "$1" | cut -d: -f1); do
		# zstd decodes the frame, then fails on the bytes the bzImage
		# appends after it: judge the output, not the exit code.
		{ tail -c +$((off + 1)) "$1" || true; } | zstd -dcq >"$2.tmp" 2>/dev/null || true
		if elf_complete "$2.tmp"; then
			mv "$2.tmp" "$2"
			return 0
		fi
	done
	rm -f "$2.tmp"
	log "no xz- or zstd-compressed ELF kernel inside $1; booting the bzImage (slower)"
}

# fetch_kernel DIR ARCH VERSION PKG...: download and unpack into DIR.
fetch_kernel() {
	local dir="$1" arch="$2" version="$3" tmp deb p
	shift 3
	# An unpack interrupted halfway leaves no stamp; start it again from scratch.
	find "$dir" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
	tmp="$(mktemp -d "$dir/.tmp.XXXXXX")"
	local want=()
	for p in "$@"; do want+=("$p:$arch=$version"); done
	log "apt-get download ${want[*]}"
	apt_own_download "$tmp" "${want[@]}" ||
		die "cannot download ${want[*]} from Debian's archive (is it reachable? Debian removes superseded kernels: \`e2e/scripts/qemu-kernel.sh --list $name\` lists the current ones; update QEMU_KERNEL_${name//-/_} in e2e/versions.env)"
	mkdir -p "$tmp/root"
	for deb in "$tmp"/*.deb; do
		log "unpack $(basename "$deb")"
		# Only the kernel image and its config: the rest (modules, docs,
		# System.map, device trees) is not needed to boot it, the guests
		# loading no module. Packages up to 6.12 put them under /boot;
		# sid's under /usr/lib/modules/<release>.
		dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp/root" --wildcards \
			--exclude './usr/share' --exclude './usr/lib/linux-image-*' --exclude '*/dtb' --exclude '*/System.map*' \
			--exclude '*/modules/*/kernel' ||
			die "cannot unpack $deb"
		rm -f "$deb"
	done
	local vmlinuz config release
	vmlinuz="$(find "$tmp/root" \( -path '*/boot/vmlinuz-*' -o -path '*/modules/*/vmlinuz' \) -type f -print -quit)"
	[ -n "$vmlinuz" ] || die "$* hold no vmlinuz"
	case "$vmlinuz" in
	*/boot/vmlinuz-*) release="${vmlinuz##*/vmlinuz-}" ;;
	*) release="$(basename "$(dirname "$vmlinuz")")" ;;
	esac
	config="$(find "$tmp/root" \( -path "*/boot/config-$release" -o -path "*/modules/$release/config" \) -type f -print -quit)"
	[ -n "$config" ] || die "$* hold no config for $release (a sid kernel needs its linux-base-* package too)"
	mv "$vmlinuz" "$dir/vmlinuz"
	mv "$config" "$dir/config"
	rm -rf "$tmp"
	if [ "$arch" = amd64 ]; then
		extract_vmlinux "$dir/vmlinuz" "$dir/vmlinux"
	fi
	printf '%s\n' "$release" >"$dir/release"
	touch "$dir/.complete"
}

# fetch_busybox DIR ARCH: bookworm's static busybox for ARCH, unpacked.
fetch_busybox() {
	local dir="$1" arch="$2" tmp
	tmp="$(mktemp -d "$dir/.tmp.XXXXXX")"
	log "apt-get download busybox-static:$arch/bookworm"
	apt_own_download "$tmp" "busybox-static:$arch/bookworm" ||
		die "cannot download busybox-static:$arch from bookworm (is Debian's archive reachable?)"
	dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" ./bin/busybox
	mv "$tmp/bin/busybox" "$dir/busybox"
	rm -rf "$tmp"
	touch "$dir/.complete"
}

# locked DIR FUNC ARGS...: run FUNC unless DIR/.complete exists, under a lock
# on DIR so that concurrent callers (go test runs packages in parallel) wait
# for the first one's work instead of repeating it.
locked() {
	local dir="$1"
	shift
	[ ! -e "$dir/.complete" ] || return 0
	exec 9>"$dir/.lock"
	flock -w 600 9 || die "timed out waiting for the lock on $dir"
	[ -e "$dir/.complete" ] || "$@"
	exec 9>&-
}

main() {
	case "${1:-}" in
	--names)
		names
		return
		;;
	--list)
		[ -n "${2:-}" ] || die "usage: $0 --list NAME"
		check_name "$2"
		local suite arch p=()
		read -r suite arch _ <<<"$(spec "$2")"
		mkdir -p "$CACHE"
		exec 8>"$CACHE/debian-apt.lock"
		flock -w 600 8 || die "timed out waiting for $CACHE/debian-apt.lock"
		apt_own_update
		# "PACKAGE | VERSION | ARCHIVE SUITE/main ARCH" for each kernel
		# image package of the architecture, in NAME's suite.
		# (One apt-cache call for all: each call parses every list.)
		mapfile -t p < <(apt_own apt-cache search --names-only "^linux-(image|binary|base)-[0-9][^ ]*[0-9]-$arch(-unsigned)?\$" | cut -d' ' -f1 | sed "s/\$/:$arch/")
		[ ${#p[@]} -eq 0 ] || apt_own apt-cache madison "${p[@]}" | grep -E " $suite(-security|-updates)?/" | sort -V || true
		return
		;;
	esac

	name="${1:-bookworm-amd64}"
	check_name "$name"
	local suite arch version pkgs
	read -r suite arch version pkgs <<<"$(spec "$name")"
	local qemu_pkg qemu_bin
	case "$arch" in
	amd64) qemu_pkg=qemu-system-x86 qemu_bin=qemu-system-x86_64 ;;
	arm64) qemu_pkg=qemu-system-arm qemu_bin=qemu-system-aarch64 ;;
	*) die "QEMU_KERNEL_${name//-/_}: architecture '$arch' is neither amd64 nor arm64" ;;
	esac
	[ -n "$suite" ] && [ -n "$version" ] && [ -n "$pkgs" ] ||
		die "QEMU_KERNEL_${name//-/_} in e2e/versions.env must read \"SUITE ARCH VERSION PACKAGE...\""

	apt_install "$qemu_pkg" busybox-static xz-utils zstd
	local qemu busybox=/bin/busybox
	qemu="$(command -v "$qemu_bin")" || die "$qemu_bin not on PATH after installing $qemu_pkg"
	# busybox-static conflicts with (replaces) the dynamically linked busybox
	# package, so once it is installed /bin/busybox runs without a libc.
	[ -x "$busybox" ] || die "$busybox missing after installing busybox-static"
	if [ "$arch" != "$(dpkg --print-architecture)" ]; then
		local bdir
		bdir="$(cached busybox-static "bookworm-$arch")"
		locked "$bdir" fetch_busybox "$bdir" "$arch"
		busybox="$bdir/busybox"
	fi

	# The cache key carries the packages (with the ABI name) and the Debian
	# revision: both change independently.
	local dir
	# shellcheck disable=SC2086 # one word per package
	dir="$(cached "kernel/$name" "$(printf '%s_' $pkgs)$version")"
	# shellcheck disable=SC2086
	locked "$dir" fetch_kernel "$dir" "$arch" "$version" $pkgs

	local kernel="$dir/vmlinuz"
	[ ! -e "$dir/vmlinux" ] || kernel="$dir/vmlinux"
	printf 'NAME=%s\n' "$name"
	printf 'ARCH=%s\n' "$arch"
	printf 'KERNEL=%s\n' "$kernel"
	printf 'RELEASE=%s\n' "$(cat "$dir/release")"
	printf 'QEMU=%s\n' "$qemu"
	printf 'BUSYBOX=%s\n' "$busybox"
}

main "$@"
