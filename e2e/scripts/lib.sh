# Shared shell helpers for the e2e scripts. Source it; do not run it.
#
#   . "$(dirname "$0")/lib.sh"
#
# Everything the tests build or download is cached under $CACHE/<name>/<version>
# (CACHE defaults to ~/.cache/sidecar-supervisor-e2e, override with
# SUPERVISOR_E2E_CACHE), so a warm run rebuilds nothing and bumping a version in
# e2e/versions.env rebuilds exactly that tool.

set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(cd "$E2E_DIR/.." && pwd)"
CACHE="${SUPERVISOR_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecar-supervisor-e2e}"
# Every Go program here is static, and built as e2e/test.sh builds the e2e
# module: so bench.sh, k8sbench.sh and soak.sh's `go run` take the
# packages test.sh compiled from Go's build cache (demo.sh too, alone).
export CGO_ENABLED=0
# shellcheck source=../versions.env
. "$E2E_DIR/versions.env"
# Another Kubernetes for the one-node cluster, one the module proxy serves
# (it serves 1.34 to 1.37; the kubelet settings of cluster-up.sh need 1.31+).
if [ -n "${SUPERVISOR_E2E_KUBERNETES_VERSION:-}" ]; then
	[[ "$SUPERVISOR_E2E_KUBERNETES_VERSION" =~ ^v1\.3[4-9]\.[0-9]+$ ]] ||
		{ printf 'SUPERVISOR_E2E_KUBERNETES_VERSION=%s: want v1.34.0 or later, as v1.34.4\n' \
			"$SUPERVISOR_E2E_KUBERNETES_VERSION" >&2; exit 2; }
	KUBERNETES_VERSION="$SUPERVISOR_E2E_KUBERNETES_VERSION"
fi

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# apt_install PKG...: install the Debian packages that are missing, once.
# Idempotent and quiet when everything is present. apt-get update runs at most
# once per machine boot (a stamp under /run). Safe to run concurrently: the
# test lanes and the guests side by side each install what they need, and a
# second apt-get beside another fails on dpkg's lock at once, so the installs
# take turns under a lock of ours, and what the one before installed is not
# installed again.
apt_missing() {
	local p
	for p in "$@"; do
		[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || printf '%s\n' "$p"
	done
}
apt_install() {
	local missing=()
	mapfile -t missing < <(apt_missing "$@")
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || die "Debian packages missing: ${missing[*]} (run as root, or: apt-get install ${missing[*]})"
	exec 7>/run/sidecar-supervisor-apt-install.lock
	flock -w 900 7 || die "timed out (15 min) waiting for /run/sidecar-supervisor-apt-install.lock to install ${missing[*]}"
	mapfile -t missing < <(apt_missing "$@")
	if [ ${#missing[@]} -eq 0 ]; then
		exec 7>&-
		return 0
	fi
	if [ ! -e /run/sidecar-supervisor-apt-updated ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		touch /run/sidecar-supervisor-apt-updated
	fi
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
	exec 7>&-
}

# cached NAME VERSION: print the cache directory for NAME at VERSION (created).
cached() {
	local d="$CACHE/$1/$2"
	mkdir -p "$d"
	printf '%s\n' "$d"
}

# --- container images without a Docker engine (buildah + skopeo) -------------

# Private containers-storage for every image build: vfs (no overlay mounts to
# leak), under the cache, apart from any other buildah or podman user.
BUILDAH_ROOT="$CACHE/buildah/root"
BUILDAH_RUNROOT="$CACHE/buildah/runroot"

# oci_build REF CONTAINERFILE CONTEXT OUT [BUD-ARG...]: build CONTAINERFILE with
# buildah (chroot isolation, so no runc or daemon is needed), tag it REF and
# write it as an OCI archive to OUT (atomically: OUT exists only when complete).
# The image is removed from the build storage afterwards; OUT is the artefact.
oci_build() {
	local ref="$1" file="$2" ctx="$3" out="$4"
	shift 4
	apt_install buildah skopeo
	local store=(--root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver vfs)
	local iid
	mkdir -p "$(dirname "$out")"
	# A unique temporary tag, so concurrent builds of the same REF don't collide.
	local tmpref="localhost/e2e-build/tmp-$$-$RANDOM:latest"
	iid="$(buildah "${store[@]}" bud --quiet --isolation chroot --format oci \
		--layers=false --pull-never -f "$file" -t "$tmpref" "$@" "$ctx" | tail -n1)" ||
		die "buildah bud of $file failed"
	skopeo --insecure-policy copy --quiet \
		"containers-storage:[vfs@$BUILDAH_ROOT+$BUILDAH_RUNROOT]$tmpref" \
		"oci-archive:$out.tmp.$$:$ref" >&2 || die "skopeo copy of $ref failed"
	buildah "${store[@]}" rmi "$tmpref" >/dev/null 2>&1 || true
	mv -f "$out.tmp.$$" "$out"
	log "image $ref -> $out ($(du -h "$out" | cut -f1), id ${iid:0:12})"
}

# oci_index REF OUT ARCHIVE...: write the multi-platform image index REF, made
# of the single-platform OCI archives given (each built with --platform, so
# its configuration names its os and architecture), as an OCI archive to OUT
# (atomically): an OCI image index whose manifests are those images,
# digest for digest, and their blobs. This is what `docker buildx build
# --platform ... --push` would put in a registry, without one.
oci_index() {
	local ref="$1" out="$2"
	shift 2
	apt_install buildah skopeo
	local store=(--root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver vfs)
	local list="localhost/e2e-build/index-$$-$RANDOM:latest" a
	buildah "${store[@]}" manifest create "$list" >/dev/null || die "buildah manifest create failed"
	for a in "$@"; do
		buildah "${store[@]}" manifest add "$list" "oci-archive:$a" >/dev/null ||
			{ buildah "${store[@]}" manifest rm "$list" >/dev/null 2>&1; die "buildah manifest add $a failed"; }
	done
	buildah "${store[@]}" manifest push --all --format oci --quiet "$list" "oci-archive:$out.tmp.$$:$ref" >&2 ||
		{ buildah "${store[@]}" manifest rm "$list" >/dev/null 2>&1; die "buildah manifest push of $ref failed"; }
	buildah "${store[@]}" manifest rm "$list" >/dev/null 2>&1 || true
	mv -f "$out.tmp.$$" "$out"
	log "index $ref ($#) -> $out ($(du -h "$out" | cut -f1))"
}

# inputs_hash FILE...: a short hash of the named files' contents and paths plus
# the Go toolchain version, for cache keys of things built from repo sources.
inputs_hash() {
	{
		go env GOVERSION
		sha256sum "$@"
	} | sha256sum | cut -c1-16
}

# cache_lock NAME: take an exclusive lock on $CACHE/NAME.lock, held on file
# descriptor 9 until the calling script exits, so that two test binaries
# building the same thing at once take turns (the second then finds it built).
# Waits at most an hour: a cold Kubernetes build takes many minutes.
cache_lock() {
	mkdir -p "$CACHE"
	exec 9>"$CACHE/$1.lock"
	flock -w 3600 9 || die "waited an hour for $CACHE/$1.lock"
}
