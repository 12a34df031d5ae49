#!/usr/bin/env bash
# Build the product image, ghcr.io/sidecar-supervisor/sidecar-supervisor:v0.1.0
# (SUPERVISOR_IMAGE in e2e/versions.env), for linux/amd64 and linux/arm64, from
# the repo's Dockerfile without a Docker engine or a registry: `FROM
# golang:1.26` cannot be pulled here.
#
#   build stage    its `RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go
#                  build ... -o /out/...` line, read from the Dockerfile, runs
#                  with the local Go toolchain (the build stage's
#                  --platform=$BUILDPLATFORM: this machine cross-compiles) once
#                  per target platform, with TARGETOS and TARGETARCH set as
#                  BuildKit sets them, into a staging directory per platform
#                  that mirrors the build stage's paths (out/sidecar-supervisor,
#                  etc/ssl/certs/ca-certificates.crt);
#   runtime stage  the Dockerfile's last stage, derived mechanically: each
#                  `COPY --from=build /PATH DEST` becomes `COPY PATH DEST` with
#                  the staging directory as the build context, then `buildah
#                  bud --platform` per platform (FROM scratch with only COPY
#                  steps runs nothing, so no emulation is needed);
#   index          the per-platform images, digest for digest, in one OCI image
#                  index (`buildah manifest`), as `docker buildx build
#                  --platform linux/amd64,linux/arm64` makes it.
#
# The Dockerfile stays the one source of truth: whatever the two stages say is
# what runs here, and a shape this script cannot translate faithfully (another
# stage to copy from, a multi-line compile step, a non-scratch runtime base, a
# build stage that does not cross-compile) stops it with an error instead of
# building something different.
#
#   build-image.sh            build (or reuse) the image; prints
#                             SUPERVISOR_IMAGE=<ref>
#                             SUPERVISOR_IMAGE_INDEX=<oci tar: the index, every platform>
#                             SUPERVISOR_IMAGE_ARCHIVE=<oci tar: this machine's platform only>
#                             SUPERVISOR_BINARY=<this machine's binary>
#                             SUPERVISOR_BINARY_<ARCH>=<each platform's binary>
#   build-image.sh --check    only derive and print the runtime Containerfile
#
# Cached under $CACHE/image/<hash of the Dockerfile, the root module's sources,
# this script and the Go version>.
. "$(dirname "$0")/lib.sh"

# SUPERVISOR_DOCKERFILE: another Dockerfile, for the tests of the translation.
DOCKERFILE="${SUPERVISOR_DOCKERFILE:-$REPO_DIR/Dockerfile}"

# The platforms of the index, as `docker buildx build --platform` names them.
PLATFORMS="linux/amd64 linux/arm64"

build_image_main() {
	local check=false
	[ "${1:-}" = --check ] && check=true

	local runtime gobuild
	runtime="$(runtime_stage)"
	gobuild="$(build_command)"
	if $check; then
		printf '# compile step (run on the host per platform, -o under the staging dir):\n# %s\n%s\n' "$gobuild" "$runtime"
		return 0
	fi

	local hash dir tag hostarch start=$SECONDS
	hostarch="$(go env GOARCH)"
	case " $PLATFORMS " in
	*" linux/$hostarch "*) ;;
	*) die "this machine is $hostarch; the image is built for $PLATFORMS only" ;;
	esac
	hash="$(image_inputs_hash)"
	dir="$(cached image "$hash")"
	tag="${SUPERVISOR_IMAGE##*:}"
	local index="$dir/sidecar-supervisor.index.oci.tar"
	if [ ! -s "$index" ]; then
		cache_lock "image-$hash"
	fi
	if [ ! -s "$index" ]; then
		rm -rf "$dir"/ctx-* "$dir"/*.oci.tar
		printf '%s\n' "$runtime" >"$dir/Containerfile"
		[ -f /etc/ssl/certs/ca-certificates.crt ] || apt_install ca-certificates
		local platform os arch ctx archives=()
		for platform in $PLATFORMS; do
			os="${platform%%/*}" arch="${platform#*/}" ctx="$dir/ctx-$arch"
			mkdir -p "$ctx/out" "$ctx/etc/ssl/certs"
			log "compiling for $platform: $gobuild"
			# The build stage's own command, with /out/ redirected to the
			# staging dir and the build stage's ARGs set as docker build
			# would: VERSION, and TARGETOS/TARGETARCH per platform. No VCS
			# stamp: the Docker build context has no .git (.dockerignore),
			# and with the same Go release the binaries are then
			# byte-identical to a docker build's.
			# shellcheck disable=SC2034 # read by the eval'd line
			(cd "$REPO_DIR" && export GOFLAGS=-buildvcs=false && VERSION="$tag" TARGETOS="$os" TARGETARCH="$arch" &&
				eval "${gobuild//-o \/out\//-o $ctx/out/}")
			check_elf "$ctx/out/sidecar-supervisor" "$arch"
			install -m 0644 /etc/ssl/certs/ca-certificates.crt "$ctx/etc/ssl/certs/"
			oci_build "$SUPERVISOR_IMAGE" "$dir/Containerfile" "$ctx" "$dir/sidecar-supervisor-$arch.oci.tar" \
				--platform "$platform" \
				--build-arg "VERSION=$tag" --build-arg "REVISION=$(git -C "$REPO_DIR" rev-parse HEAD 2>/dev/null || echo unknown)"
			archives+=("$dir/sidecar-supervisor-$arch.oci.tar")
		done
		oci_index "$SUPERVISOR_IMAGE" "$index" "${archives[@]}"
		log "built $SUPERVISOR_IMAGE for $PLATFORMS in $((SECONDS - start))s: index $(du -h "$index" | cut -f1)"
	fi
	printf 'SUPERVISOR_IMAGE=%s\n' "$SUPERVISOR_IMAGE"
	printf 'SUPERVISOR_IMAGE_INDEX=%s\n' "$index"
	printf 'SUPERVISOR_IMAGE_ARCHIVE=%s\n' "$dir/sidecar-supervisor-$hostarch.oci.tar"
	printf 'SUPERVISOR_BINARY=%s\n' "$dir/ctx-$hostarch/out/sidecar-supervisor"
	for platform in $PLATFORMS; do
		printf 'SUPERVISOR_BINARY_%s=%s\n' "$(printf '%s' "${platform#*/}" | tr a-z A-Z)" "$dir/ctx-${platform#*/}/out/sidecar-supervisor"
	done
}

# check_elf FILE ARCH: FILE is an ELF executable for ARCH (amd64 or arm64), by
# its e_machine field: a compile step that ignores TARGETARCH would otherwise
# put this machine's binary into every platform's image.
check_elf() {
	local want got
	case "$2" in
	amd64) want=62 ;;  # EM_X86_64
	arm64) want=183 ;; # EM_AARCH64
	*) die "check_elf: unknown architecture $2" ;;
	esac
	[ "$(head -c 4 "$1")" = $'\x7fELF' ] || die "$1 is not an ELF file"
	got="$(od -An -tu2 -j18 -N2 "$1" | tr -d ' ')"
	[ "$got" = "$want" ] ||
		die "$1 is for ELF machine $got, not $2 ($want): the Dockerfile's go build must set GOARCH=\$TARGETARCH"
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
	# Here-strings, not pipes, into grep -q: under pipefail, a grep -q that
	# exits at its first match can leave the writer with SIGPIPE, and the
	# check then fails at random.
	grep -qiE '^FROM[[:space:]]+scratch([[:space:]]|$)' <<<"$text" ||
		die "Dockerfile: the last stage is not FROM scratch; build-image.sh translates only that"
	local copies
	copies="$(grep -iE '^[[:space:]]*(COPY|ADD)[[:space:]]' <<<"$text" || true)"
	if [ -n "$copies" ] && grep -vqE '^COPY --from=build /[^ ]+ /' <<<"$copies"; then
		die "Dockerfile: the runtime stage has a COPY/ADD other than 'COPY --from=build /SRC /DEST'; teach build-image.sh about it"
	fi
	grep -qiE '^[[:space:]]*RUN[[:space:]]' <<<"$text" &&
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
	'CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build '*"-o /out/"*) ;;
	*) die "Dockerfile: the go build step must read 'CGO_ENABLED=0 GOOS=\$TARGETOS GOARCH=\$TARGETARCH go build ... -o /out/NAME ...' (it cross-compiles for each target platform), got: $cmd" ;;
	esac
	# The compile runs on the build machine for every target platform only
	# if the stage itself is not emulated per target.
	grep -qiE '^FROM[[:space:]]+--platform=\$(BUILDPLATFORM|\{BUILDPLATFORM\})[[:space:]]' <<<"$text" ||
		die "Dockerfile: the build stage must start 'FROM --platform=\$BUILDPLATFORM ...' (it cross-compiles; without it docker buildx emulates the target)"
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

build_image_main "$@"
