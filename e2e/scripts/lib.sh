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
# shellcheck source=../versions.env
. "$E2E_DIR/versions.env"

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# apt_install PKG...: install the Debian packages that are missing, once.
# Idempotent and quiet when everything is present. apt-get update runs at most
# once per machine boot (a stamp under /run).
apt_install() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || die "Debian packages missing: ${missing[*]} (run as root, or: apt-get install ${missing[*]})"
	if [ ! -e /run/sidecar-supervisor-apt-updated ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		touch /run/sidecar-supervisor-apt-updated
	fi
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# cached NAME VERSION: print the cache directory for NAME at VERSION (created).
cached() {
	local d="$CACHE/$1/$2"
	mkdir -p "$d"
	printf '%s\n' "$d"
}
