#!/usr/bin/env bash
# Build the images the e2e cluster runs besides the product image (which
# build-image.sh builds), from e2e/images/<name>/Containerfile, as OCI archives:
#
#   pause        catatonit in pause mode, the sandbox image containerd is told to use
#   busybox      Debian's busybox-static, the app image of the tests; also tagged
#                with the name deploy/ uses, so those manifests run unchanged
#   istio-proxy  the real pilot-agent and the stand-in envoy from build-tools.sh
#   cloud-sql-proxy
#                the real cloud-sql-proxy v2 from build-sidecars.sh, laid out
#                like Google's image; also tagged with the name
#                deploy/job-cloud-sql-proxy.yaml uses (its version from
#                versions.env), so that manifest runs unchanged
#   standins     podsim's stand-ins for the Vault agent and daprd (e2e/cmd/podsim),
#                with busybox's sh, at the paths their injectors run them from
#
# Each is cached under $CACHE/images/<name>-<hash of its Containerfile and
# context files>. Prints <NAME>_IMAGE=<ref> and <NAME>_ARCHIVE=<path> lines
# (NAME: PAUSE, BUSYBOX, ISTIO_PROXY, CLOUD_SQL_PROXY, STANDINS) and <NAME>_ALIASES=<refs>
# for busybox and cloud-sql-proxy; logs go to stderr.
#
#   cluster-images.sh [pause|busybox|istio-proxy|cloud-sql-proxy|standins]...
#                     (default: pause, busybox and istio-proxy)
. "$(dirname "$0")/lib.sh"

PAUSE_IMAGE=localhost/sidecar-supervisor-e2e/pause:catatonit
BUSYBOX_IMAGE=localhost/sidecar-supervisor-e2e/busybox:debian
# deploy/*.yaml name busybox:1.37; the local image answers to that name too.
BUSYBOX_ALIASES=docker.io/library/busybox:1.37
# Hub localhost/sidecar-supervisor-e2e, image proxyv2, tag e2e in Istio's terms.
ISTIO_PROXY_IMAGE=localhost/sidecar-supervisor-e2e/proxyv2:e2e
CLOUD_SQL_PROXY_IMAGE=localhost/sidecar-supervisor-e2e/cloud-sql-proxy:$CLOUD_SQL_PROXY_VERSION
# Google's image is tagged without the module version's "v".
CLOUD_SQL_PROXY_ALIASES=gcr.io/cloud-sql-connectors/cloud-sql-proxy:${CLOUD_SQL_PROXY_VERSION#v}
STANDINS_IMAGE=localhost/sidecar-supervisor-e2e/standins:e2e

cluster_images_main() {
	local want=("$@") n
	[ ${#want[@]} -gt 0 ] || want=(pause busybox istio-proxy)
	for n in "${want[@]}"; do
		case "$n" in
		pause) image_pause ;;
		busybox) image_busybox ;;
		istio-proxy) image_istio_proxy ;;
		cloud-sql-proxy) image_cloud_sql_proxy ;;
		standins) image_standins ;;
		*) die "unknown image $n (want pause, busybox, istio-proxy, cloud-sql-proxy or standins)" ;;
		esac
	done
}

# build_cached NAME REF CTX: build e2e/images/NAME/Containerfile with context CTX
# unless an archive for the same inputs exists; print the archive path.
build_cached() {
	local name="$1" ref="$2" ctx="$3" file="$E2E_DIR/images/$1/Containerfile" hash dir start=$SECONDS files
	mapfile -t files < <(cd "$ctx" && find . -type f | LC_ALL=C sort)
	hash="$( (
		printf '%s\n' "$ref"
		cd "$ctx" && inputs_hash "$file" "${files[@]}"
	) | sha256sum | cut -c1-16)"
	dir="$(cached images "$name-$hash")"
	if [ ! -s "$dir/$name.oci.tar" ]; then
		oci_build "$ref" "$file" "$ctx" "$dir/$name.oci.tar"
		log "built image $name in $((SECONDS - start))s"
	fi
	printf '%s\n' "$dir/$name.oci.tar"
}

# stage_dir NAME: an empty staging context for NAME's image.
stage_dir() {
	local d="$CACHE/images/stage/$1.$$"
	rm -rf "$d"
	mkdir -p "$d"
	printf '%s\n' "$d"
}

image_pause() {
	apt_install catatonit
	local ctx out
	ctx="$(stage_dir pause)"
	install -m 0755 /usr/bin/catatonit "$ctx/pause"
	out="$(build_cached pause "$PAUSE_IMAGE" "$ctx")"
	rm -rf "$ctx"
	printf 'PAUSE_IMAGE=%s\nPAUSE_ARCHIVE=%s\n' "$PAUSE_IMAGE" "$out"
}

image_busybox() {
	apt_install busybox-static
	local ctx out
	ctx="$(stage_dir busybox)"
	install -m 0755 /bin/busybox "$ctx/busybox"
	out="$(build_cached busybox "$BUSYBOX_IMAGE" "$ctx")"
	rm -rf "$ctx"
	printf 'BUSYBOX_IMAGE=%s\nBUSYBOX_ARCHIVE=%s\nBUSYBOX_ALIASES=%s\n' "$BUSYBOX_IMAGE" "$out" "$BUSYBOX_ALIASES"
}

image_istio_proxy() {
	local tools="$E2E_DIR/scripts/build-tools.sh" ctx out PILOT_AGENT='' ENVOY='' ENVOY_BOOTSTRAP_TMPL=''
	[ -f "$tools" ] || die "$tools is missing: it builds pilot-agent and the stand-in envoy"
	eval "$(bash "$tools")"
	[ -x "$PILOT_AGENT" ] && [ -x "$ENVOY" ] && [ -s "$ENVOY_BOOTSTRAP_TMPL" ] ||
		die "build-tools.sh did not print PILOT_AGENT, ENVOY and ENVOY_BOOTSTRAP_TMPL paths"
	ctx="$(stage_dir istio-proxy)"
	install -m 0755 "$PILOT_AGENT" "$ctx/pilot-agent"
	install -m 0755 "$ENVOY" "$ctx/envoy"
	install -m 0644 "$ENVOY_BOOTSTRAP_TMPL" "$ctx/envoy_bootstrap_tmpl.json"
	# The stand-in that follows an older Istio's pilot-agent (PILOT_ISTIO;
	# e2e/cmd/podsim/pilotagent.go), which k8sbench runs in its place.
	(cd "$E2E_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/podsim" ./cmd/podsim) ||
		die "go build ./cmd/podsim failed"
	printf 'root:x:0:0:root:/:/sbin/nologin\nistio-proxy:x:1337:1337:istio-proxy:/:/sbin/nologin\n' >"$ctx/passwd"
	printf 'root:x:0:\nistio-proxy:x:1337:\n' >"$ctx/group"
	out="$(build_cached istio-proxy "$ISTIO_PROXY_IMAGE" "$ctx")"
	rm -rf "$ctx"
	printf 'ISTIO_PROXY_IMAGE=%s\nISTIO_PROXY_ARCHIVE=%s\n' "$ISTIO_PROXY_IMAGE" "$out"
}

image_cloud_sql_proxy() {
	local sidecars="$E2E_DIR/scripts/build-sidecars.sh" ctx out CLOUD_SQL_PROXY=''
	[ -f "$sidecars" ] || die "$sidecars is missing: it builds cloud-sql-proxy"
	eval "$(bash "$sidecars")"
	[ -x "$CLOUD_SQL_PROXY" ] || die "build-sidecars.sh did not print a CLOUD_SQL_PROXY path"
	ctx="$(stage_dir cloud-sql-proxy)"
	install -m 0755 "$CLOUD_SQL_PROXY" "$ctx/cloud-sql-proxy"
	# distroless's nonroot user, which the original image runs as.
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/group"
	# distroless's nsswitch.conf ("hosts: files dns", which is also what Go
	# does without one: net/conf.go), and an /etc/hosts naming localhost,
	# which the kubelet's own hosts mount replaces in every pod. The reason
	# cloud-sql-proxy failed at start on the test cluster now and then
	# ("lookup localhost on 127.0.0.1:53: connection refused") was not this
	# image: the kubelet writes the pod's hosts file again, truncating it,
	# as it starts each later container, and a read in between finds it
	# empty (k8sjobs hostsRewritten shows it; pinHosts keeps it out of the
	# cases).
	printf 'hosts: files dns\n' >"$ctx/nsswitch.conf"
	printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$ctx/hosts"
	out="$(build_cached cloud-sql-proxy "$CLOUD_SQL_PROXY_IMAGE" "$ctx")"
	rm -rf "$ctx"
	printf 'CLOUD_SQL_PROXY_IMAGE=%s\nCLOUD_SQL_PROXY_ARCHIVE=%s\nCLOUD_SQL_PROXY_ALIASES=%s\n' \
		"$CLOUD_SQL_PROXY_IMAGE" "$out" "$CLOUD_SQL_PROXY_ALIASES"
}

image_standins() {
	apt_install busybox-static
	local ctx out
	ctx="$(stage_dir standins)"
	install -m 0755 /bin/busybox "$ctx/busybox"
	(cd "$E2E_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/podsim" ./cmd/podsim) ||
		die "go build ./cmd/podsim failed"
	printf 'root:x:0:0:root:/:/sbin/nologin\nvault:x:100:1000:vault:/home/vault:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/passwd"
	printf 'root:x:0:\nvault:x:1000:\nnonroot:x:65532:\n' >"$ctx/group"
	out="$(build_cached standins "$STANDINS_IMAGE" "$ctx")"
	rm -rf "$ctx"
	printf 'STANDINS_IMAGE=%s\nSTANDINS_ARCHIVE=%s\n' "$STANDINS_IMAGE" "$out"
}

cluster_images_main "$@"
