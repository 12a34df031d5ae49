#!/usr/bin/env bash
# Build the Istio pieces the e2e tests run for real, into the tool cache:
#
#   pilot-agent  the real Istio agent, from the Go module pinned in e2e/go.mod
#                (ISTIO_VERSION in e2e/versions.env); ~70 s cold on 2 cores.
#   envoy        the stand-in envoy from e2e/cmd/envoy (no real envoy binary can
#                be had here); cached under a hash of its source, so editing it
#                rebuilds it and nothing else.
#   bootstrap    Istio's envoy bootstrap template, copied from the istio module:
#                pilot-agent reads it at run time and we must not commit it.
#
# Prints one NAME=PATH line per artefact on stdout (logs go to stderr), so a
# caller can `eval "$(e2e/scripts/build-tools.sh)"`. Idempotent: a warm run
# only checks that the files exist.
. "$(dirname "$0")/lib.sh"

build_tools_main() {
	local pa_dir pa_deps env_dir hash
	pa_dir="$(cached pilot-agent "$ISTIO_VERSION")"
	pa_deps="$(pilot_agent_deps)"
	if [ ! -x "$pa_dir/pilot-agent" ] || [ ! -s "$pa_dir/envoy_bootstrap_tmpl.json" ] ||
		[ "$(cat "$pa_dir/modules.txt" 2>/dev/null)" != "$pa_deps" ]; then
		build_pilot_agent "$pa_dir"
		printf '%s\n' "$pa_deps" >"$pa_dir/modules.txt"
	fi

	hash="$(envoy_standin_hash)"
	env_dir="$(cached envoy-standin "$hash")"
	if [ ! -x "$env_dir/envoy" ]; then
		go_build "$env_dir/envoy" ./cmd/envoy
	fi

	printf 'PILOT_AGENT=%s\n' "$pa_dir/pilot-agent"
	printf 'ENVOY=%s\n' "$env_dir/envoy"
	printf 'ENVOY_BOOTSTRAP_TMPL=%s\n' "$pa_dir/envoy_bootstrap_tmpl.json"
}

# go_build OUT PKG: static build from the e2e module into OUT, atomically (a
# concurrent or interrupted run never leaves a half-written binary at OUT).
go_build() {
	local out="$1" pkg="$2" start=$SECONDS
	log "building $pkg -> $out"
	# Not -trimpath: the e2e module's vet and tests (CGO_ENABLED=0, real
	# paths) compile the same packages, so a cold build finds them cached.
	(cd "$E2E_DIR" && CGO_ENABLED=0 go build -o "$out.tmp.$$" "$pkg")
	mv -f "$out.tmp.$$" "$out"
	log "built $pkg in $((SECONDS - start))s"
}

build_pilot_agent() {
	local dir="$1" moddir
	go_build "$dir/pilot-agent" istio.io/istio/pilot/cmd/pilot-agent
	# The module directory is known only after the build made sure it is downloaded.
	moddir="$(cd "$E2E_DIR" && go list -m -f '{{.Dir}}' istio.io/istio)"
	[ -n "$moddir" ] || die "go list found no directory for istio.io/istio"
	install -m 0644 "$moddir/tools/packaging/common/envoy_bootstrap.json" "$dir/envoy_bootstrap_tmpl.json.tmp.$$"
	mv -f "$dir/envoy_bootstrap_tmpl.json.tmp.$$" "$dir/envoy_bootstrap_tmpl.json"
}

# pilot_agent_deps: the module versions pilot-agent is built from. The cache
# dir is keyed by ISTIO_VERSION alone, but e2e/go.mod is shared and another
# engineer's `go get` can move a dependency that pilot-agent links (grpc,
# x/net, ...); a changed list triggers a rebuild in place. ~0.3 s when warm.
pilot_agent_deps() {
	(cd "$E2E_DIR" && go list -deps -f '{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}{{end}}' \
		istio.io/istio/pilot/cmd/pilot-agent) | LC_ALL=C sort -u
}

# envoy_standin_hash: a short hash of the Go version and of every source file of
# the stand-in and of the module's own packages it imports (its record format
# lives in istioproxy/record), so an edit or a toolchain bump yields a new
# cache directory and a stale stand-in is never reused.
envoy_standin_hash() {
	(
		cd "$E2E_DIR"
		go env GOVERSION
		go list -deps -f '{{if not .Standard}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}' ./cmd/envoy |
			sed "s|^$E2E_DIR/||" | LC_ALL=C sort | xargs sha256sum
	) | sha256sum | cut -c1-16
}

build_tools_main "$@"
