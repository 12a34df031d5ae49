#!/usr/bin/env bash
# Build the product image, ghcr.io/sidecar-supervisor/sidecar-supervisor:v0.1.0
# (SUPERVISOR_IMAGE in e2e/versions.env), from the repo's Dockerfile without a
# Docker engine or a registry: `FROM golang:1.26` cannot be pulled here.
#
#   build stage    its `RUN CGO_ENABLED=0 go build ... -o /out/...` line, read
#                  from the Dockerfile, runs with the local Go toolchain into a
#                  staging directory that mirrors the build stage's paths
#                  (out/sidecar-supervisor, etc/ssl/certs/ca-certificates.crt);
#   runtime stage  the Dockerfile's last stage, derived mechanically: each
#                  `COPY --from=build /PATH DEST` becomes `COPY PATH DEST` with
#                  the staging directory as the build context, then buildah.
#
# The Dockerfile stays the one source of truth: whatever the two stages say is
# what runs here, and a shape this script cannot translate faithfully (another
# stage to copy from, a multi-line compile step, a non-scratch runtime base)
# stops it with an error instead of building something different.
#
#   build-image.sh            build (or reuse) the image; prints
#                             SUPERVISOR_IMAGE=<ref>, SUPERVISOR_IMAGE_ARCHIVE=<oci tar>,
#                             SUPERVISOR_BINARY=<path>
#   build-image.sh --check    only derive and print the runtime Containerfile
#
# Cached under $CACHE/image/<hash of the Dockerfile, the root module's sources,
# this script and the Go version>.
. "$(dirname "$0")/lib.sh"

# SUPERVISOR_DOCKERFILE: another Dockerfile, for the tests of the translation.
DOCKERFILE="${SUPERVISOR_DOCKERFILE:-$REPO_DIR/Dockerfile}"

build_image_main() {
	local check=false
	[ "${1:-}" = --check ] && check=true

	local runtime gobuild
	runtime="$(runtime_stage)"
	gobuild="$(build_command)"
	if $check; then
		printf '# compile step (run on the host, -o under the staging dir):\n# %s\n%s\n' "$gobuild" "$runtime"
		return 0
	fi

	local hash dir tag start=$SECONDS
	hash="$(image_inputs_hash)"
	dir="$(cached image "$hash")"
	tag="${SUPERVISOR_IMAGE##*:}"
	if [ ! -s "$dir/sidecar-supervisor.oci.tar" ]; then
		cache_lock "image-$hash"
	fi
	if [ ! -s "$dir/sidecar-supervisor.oci.tar" ]; then
		rm -rf "$dir/ctx"
		mkdir -p "$dir/ctx/out" "$dir/ctx/etc/ssl/certs"
		log "compiling: $gobuild"
		# The build stage's own command, with /out/ redirected to the staging
		# dir and the build stage's ARG VERSION set as docker build would. No
		# VCS stamp: the Docker build context has no .git (.dockerignore), and
		# with the same Go release the two binaries are then byte-identical.
		# shellcheck disable=SC2034 # VERSION is read by the eval'd line
		(cd "$REPO_DIR" && export GOFLAGS=-buildvcs=false && VERSION="$tag" && eval "${gobuild//-o \/out\//-o $dir/ctx/out/}")
		[ -f /etc/ssl/certs/ca-certificates.crt ] || apt_install ca-certificates
		install -m 0644 /etc/ssl/certs/ca-certificates.crt "$dir/ctx/etc/ssl/certs/"
		printf '%s\n' "$runtime" >"$dir/Containerfile"
		oci_build "$SUPERVISOR_IMAGE" "$dir/Containerfile" "$dir/ctx" "$dir/sidecar-supervisor.oci.tar" \
			--build-arg "VERSION=$tag" --build-arg "REVISION=$(git -C "$REPO_DIR" rev-parse HEAD 2>/dev/null || echo unknown)"
		log "built $SUPERVISOR_IMAGE in $((SECONDS - start))s: binary $(du -h "$dir/ctx/out/sidecar-supervisor" | cut -f1), $(image_size "$dir/sidecar-supervisor.oci.tar")"
	fi
	printf 'SUPERVISOR_IMAGE=%s\n' "$SUPERVISOR_IMAGE"
	printf 'SUPERVISOR_IMAGE_ARCHIVE=%s\n' "$dir/sidecar-supervisor.oci.tar"
	printf 'SUPERVISOR_BINARY=%s\n' "$dir/ctx/out/sidecar-supervisor"
}

# stages: print the Dockerfile with one "@@STAGE <name>" marker line before each FROM.
stages() {
	awk 'toupper($1) == "FROM" { name = ""; for (i = 2; i < NF; i++) if (toupper($i) == "AS") name = $(i + 1); print "@@STAGE " name } { print }' "$DOCKERFILE"
}

# runtime_stage: the last stage, translated for a build context that holds the
# build stage's files at their paths relative to /.
runtime_stage() {
	local text
	text="$(stages | awk '/^@@STAGE / { buf = ""; next } { buf = buf $0 "\n" } END { printf "%s", buf }')"
	printf '%s\n' "$text" | grep -qiE '^FROM[[:space:]]+scratch([[:space:]]|$)' ||
		die "Dockerfile: the last stage is not FROM scratch; build-image.sh translates only that"
	if printf '%s\n' "$text" | grep -iE '^[[:space:]]*(COPY|ADD)[[:space:]]' | grep -vqE '^COPY --from=build /[^ ]+ /'; then
		die "Dockerfile: the runtime stage has a COPY/ADD other than 'COPY --from=build /SRC /DEST'; teach build-image.sh about it"
	fi
	printf '%s\n' "$text" | grep -qiE '^[[:space:]]*RUN[[:space:]]' &&
		die "Dockerfile: the runtime stage has a RUN step; scratch has no shell to run it"
	printf '# Derived by e2e/scripts/build-image.sh from the runtime stage of the Dockerfile; do not edit.\n'
	printf '%s\n' "$text" | sed -E 's#^COPY --from=build /#COPY #'
}

# build_command: the build stage's compile step, without RUN.
build_command() {
	local text cmd
	text="$(stages | awk '/^@@STAGE / { s = $2; next } s == "build" { print }')"
	[ -n "$text" ] || die "Dockerfile: no stage named 'build'"
	cmd="$(printf '%s\n' "$text" | grep -E '^RUN .*go build' || true)"
	[ "$(printf '%s\n' "$cmd" | grep -c .)" -eq 1 ] ||
		die "Dockerfile: expected exactly one 'RUN ... go build' line in the build stage"
	cmd="${cmd#RUN }"
	case "$cmd" in
	*\\) die "Dockerfile: the go build step continues on the next line; keep it on one line" ;;
	"CGO_ENABLED=0 go build "*"-o /out/"*) ;;
	*) die "Dockerfile: the go build step must read 'CGO_ENABLED=0 go build ... -o /out/NAME ...', got: $cmd" ;;
	esac
	printf '%s\n' "$cmd"
}

image_inputs_hash() {
	local files
	mapfile -t files < <(cd "$REPO_DIR" && find . \( -path ./.git -o -path ./e2e -o -path ./deploy -o -name testdata \) -prune -o \
		-type f \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum -o -name Dockerfile \) -print | LC_ALL=C sort)
	(cd "$REPO_DIR" && {
		printf '%s\n' "$SUPERVISOR_IMAGE"
		sha256sum "$E2E_DIR/scripts/build-image.sh" | cut -d' ' -f1
		inputs_hash "${files[@]}"
	}) | sha256sum | cut -c1-16
}

# image_size TAR: the archive's size and the sum of the image's layers.
image_size() {
	printf 'archive %s' "$(du -h "$1" | cut -f1)"
}

build_image_main "$@"
