#!/usr/bin/env bash
# Build the real binaries of sidecars other than Istio's that the Go module
# proxy serves, into the tool cache:
#
#   cloud-sql-proxy  Google's Cloud SQL Auth Proxy v2, the program of module
#                    github.com/GoogleCloudPlatform/cloud-sql-proxy/v2 at
#                    CLOUD_SQL_PROXY_VERSION (e2e/versions.env); ~100 s cold
#                    on 2 cores, 38 MB. Static (CGO_ENABLED=0), as its image
#                    has it, so it runs in a root filesystem of its own.
#
# `go install PKG@VERSION` builds with the module's own go.mod and go.sum, so
# the build does not depend on e2e/go.mod (the proxy's dependencies would
# otherwise move pilot-agent's). Prints NAME=PATH lines on stdout (logs go to
# stderr), so a caller can `eval "$(e2e/scripts/build-sidecars.sh)"`.
# Idempotent: a warm run only checks that the file exists.
. "$(dirname "$0")/lib.sh"

build_sidecars_main() {
	local dir
	dir="$(cached cloud-sql-proxy "$CLOUD_SQL_PROXY_VERSION")"
	if [ ! -x "$dir/cloud-sql-proxy" ]; then
		cache_lock cloud-sql-proxy
		[ -x "$dir/cloud-sql-proxy" ] ||
			go_install "$dir" github.com/GoogleCloudPlatform/cloud-sql-proxy/v2 "$CLOUD_SQL_PROXY_VERSION" cloud-sql-proxy
	fi
	printf 'CLOUD_SQL_PROXY=%s\n' "$dir/cloud-sql-proxy"
}

# go_install DIR PKG VERSION NAME: build PKG@VERSION statically into DIR/NAME,
# atomically (an interrupted run never leaves a half-written binary there).
go_install() {
	local dir="$1" pkg="$2" version="$3" name="$4" tmp start=$SECONDS
	tmp="$(mktemp -d "$dir/.build.XXXXXX")"
	log "building $pkg@$version -> $dir/$name"
	# Outside any module: go install PKG@VERSION then uses only the module's own.
	(cd "$tmp" && GOBIN="$tmp" GOFLAGS=-trimpath CGO_ENABLED=0 go install "$pkg@$version") ||
		{ rm -rf "$tmp"; die "go install $pkg@$version failed"; }
	mv -f "$tmp/$(go_binary_name "$pkg")" "$dir/$name"
	rm -rf "$tmp"
	log "built $pkg@$version in $((SECONDS - start))s"
}

# go_binary_name PKG: the file go install writes for PKG: its last element,
# or the one before when the last is a major version suffix (v2).
go_binary_name() {
	local last="${1##*/}" rest="${1%/*}"
	if [[ "$last" =~ ^v[0-9]+$ ]]; then
		last="${rest##*/}"
	fi
	printf '%s\n' "$last"
}

build_sidecars_main "$@"
