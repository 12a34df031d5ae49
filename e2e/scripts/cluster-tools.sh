#!/usr/bin/env bash
# Install and build everything the one-node Kubernetes of e2e/cluster runs:
#
#   Debian      containerd (+ctr, CRI plugin), runc, etcd-server, the CNI
#               plugins, buildah, skopeo, catatonit, busybox-static, openssl
#   Go modules  kube-apiserver, kube-controller-manager, kube-scheduler and
#               kubelet from k8s.io/kubernetes at KUBERNETES_VERSION, and crictl
#               from sigs.k8s.io/cri-tools at CRI_TOOLS_VERSION (not in Debian;
#               the teardown uses it to stop pod sandboxes through the CRI).
#               No kubectl: the scripts ask the API server with curl, the
#               tests with client-go; its build (98 packages of its own and a
#               62 MB link) cost a cold run about a minute.
#
# All five are built by one `go build` in a throw-away module under the cache
# (never in the repo's e2e module: k8s.io/kubernetes needs one `replace` line
# per staging module, which would leak into everybody's dependency graph).
# Each binary is cached, the Kubernetes ones under $CACHE/kube/<version>/ and
# crictl under $CACHE/crictl/<version>/, so a warm run builds nothing and
# bumping either version in e2e/versions.env rebuilds what it names.
#
# Prints one NAME=PATH line per binary on stdout (logs go to stderr), so a caller
# can `eval "$(e2e/scripts/cluster-tools.sh)"`. Idempotent. Sourced, it only
# defines its functions (test.sh asks missing_packages whether the build is
# done).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
KUBE_CMD=k8s.io/kubernetes/cmd
CRICTL_CMD=sigs.k8s.io/cri-tools/cmd/crictl

cluster_tools_main() {
	# shellcheck disable=SC2086 # a space-separated list
	apt_install $CLUSTER_DEBIAN_PACKAGES

	local dir crictl_dir b
	dir="$(cached kube "$KUBERNETES_VERSION")"
	crictl_dir="$(cached crictl "$CRI_TOOLS_VERSION")"
	if [ -n "$(missing_packages "$dir" "$crictl_dir")" ]; then
		cache_lock cluster-tools # one builder at a time; the others then find it built
	fi
	local missing
	missing="$(missing_packages "$dir" "$crictl_dir")"
	# shellcheck disable=SC2086 # a space-separated list of package paths
	[ -z "$missing" ] || build_binaries "$dir" "$crictl_dir" $missing

	for b in "${KUBE_BINARIES[@]}"; do
		printf '%s=%s\n' "$(kube_var "$b")" "$dir/$b"
	done
	printf 'CRICTL=%s\n' "$crictl_dir/crictl"
}

# missing_packages KUBEDIR CRICTLDIR: the main packages whose binaries are not
# in the cache yet, space-separated.
missing_packages() {
	local b out=()
	for b in "${KUBE_BINARIES[@]}"; do
		[ -x "$1/$b" ] || out+=("$KUBE_CMD/$b")
	done
	[ -x "$2/crictl" ] || out+=("$CRICTL_CMD")
	printf '%s\n' "${out[*]}"
}

# kube_var kube-apiserver -> KUBE_APISERVER
kube_var() {
	local v="${1^^}"
	printf '%s\n' "${v//-/_}"
}

# staging_version v1.37.2 -> v0.37.2: the k8s.io staging modules (api,
# client-go, ...) are tagged v0.X.Y for Kubernetes v1.X.Y.
staging_version() {
	printf 'v0.%s\n' "${1#v1.}"
}

# kube_module_dir: the throw-away module that requires k8s.io/kubernetes and
# sigs.k8s.io/cri-tools, and replaces every staging module
# (k8s.io/kubernetes's own go.mod points them at ./staging/src/..., which does
# not exist outside its repository). It also requires every module e2e/go.mod
# requires, at e2e's versions (which are at least k8s.io/kubernetes's: keep
# them so when bumping either), so that each package both build use
# (client-go, apimachinery, apiserver, grpc, ...; about half of these
# binaries' source) is the same package at the same version, compiled with the
# same flags (CGO_ENABLED=0, no -trimpath: e2e/test.sh sets the first for the
# e2e module, whose tests need real source paths): the Kubernetes build then
# takes those from the Go build cache that the e2e module's vet has just
# filled, instead of compiling them again. crictl shares most of its packages
# (cri-api, grpc, client-go, some of kubectl's) with the Kubernetes binaries in the
# same way; CRI_TOOLS_VERSION is a release whose requirements are all at most
# the other two modules' (v1.37.0 wants a newer grpc than e2e's, which would
# compile grpc and all above it a second time). Rewritten when e2e/go.mod or a
# version changes.
kube_module_dir() {
	local mod sv gomod want
	mod="$(cached kube-build "$KUBERNETES_VERSION")"
	sv="$(staging_version "$KUBERNETES_VERSION")"
	gomod="$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	[ -s "$gomod" ] || die "could not download the go.mod of k8s.io/kubernetes@$KUBERNETES_VERSION"
	want="$(
		printf 'module sidecar-supervisor-e2e/kubebuild\n\ngo %s\n\n' "$(sed -n 's/^go //p' "$gomod")"
		printf 'require (\n\tk8s.io/kubernetes %s\n\tsigs.k8s.io/cri-tools %s\n)\n\nreplace (\n' "$KUBERNETES_VERSION" "$CRI_TOOLS_VERSION"
		# Each "k8s.io/x => ./staging/src/k8s.io/x" becomes "k8s.io/x => k8s.io/x v0.X.Y".
		sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\t\1 => \1 '"$sv"'#p' "$gomod"
		printf ')\n\n'
		sed -n '/^require (/,/^)/p' "$E2E_DIR/go.mod"
	)"
	if [ "$(cat "$mod/go.mod.done" 2>/dev/null)" != "$want" ]; then
		log "preparing build module for k8s.io/kubernetes@$KUBERNETES_VERSION in $mod"
		printf '%s\n' "$want" >"$mod/go.mod"
		rm -f "$mod/go.sum"
		printf '%s\n' "$want" >"$mod/go.mod.done"
	fi
	printf '%s\n' "$mod"
}

# build_binaries KUBEDIR CRICTLDIR PKG...: build each main package (of
# k8s.io/kubernetes/cmd, or crictl's) into KUBEDIR or CRICTLDIR, in one `go
# build`, so that the links overlap the compiles and the package graph is
# loaded once. CGO_ENABLED=0 gives static binaries (what Kubernetes releases
# ship for these); the gitVersion ldflag makes each report the real release
# (the node's kubeletVersion, which cluster-up.sh checks, among them).
# k8s.io/kubernetes's own packages (about 60% of what is compiled here that
# the e2e module's vet has not already compiled) are compiled without
# optimisations or inlining (-N -l): about 28% less compile time for them on
# this 2-core machine, measured; the code is the same code, its behaviour the
# same, only some CPU slower in a cluster that idles. The packages shared with
# the e2e module keep the default flags, or they would be compiled again.
build_binaries() {
	local dir="$1" crictl_dir="$2" mod start=$SECONDS pkgbase=k8s.io/component-base/version p
	shift 2
	local tmp="$dir/.build.$$" at=() names=()
	for p in "$@"; do
		names+=("${p##*/}")
		case "$p" in
		"$CRICTL_CMD") at+=("$p@$CRI_TOOLS_VERSION") ;;
		*) at+=("$p@$KUBERNETES_VERSION") ;;
		esac
	done
	mod="$(kube_module_dir)"
	log "building ${names[*]} (Kubernetes $KUBERNETES_VERSION, cri-tools $CRI_TOOLS_VERSION; nice; minutes on 2 cores)"
	rm -rf "$dir"/.build.* # a killed build's
	mkdir -p "$tmp"
	(
		cd "$mod"
		export GOFLAGS=-mod=mod CGO_ENABLED=0
		go get "${at[@]}" >&2
		nice -n 10 go build -o "$tmp/" -gcflags='k8s.io/kubernetes/...=-N -l' \
			-ldflags "-s -w -X $pkgbase.gitVersion=$KUBERNETES_VERSION -X $pkgbase.gitTreeState=clean -X $pkgbase.gitMajor=1 -X $pkgbase.gitMinor=$(minor "$KUBERNETES_VERSION")" \
			"$@" >&2
	)
	local n out=()
	for n in "${names[@]}"; do
		if [ "$n" = crictl ]; then
			mv -f "$tmp/$n" "$crictl_dir/$n"
			out+=("$crictl_dir/$n")
		else
			mv -f "$tmp/$n" "$dir/$n"
			out+=("$dir/$n")
		fi
	done
	rm -rf "$tmp"
	log "built ${names[*]} in $((SECONDS - start))s ($(du -ch "${out[@]}" | tail -1 | cut -f1))"
}

minor() {
	local v="${1#v1.}"
	printf '%s\n' "${v%%.*}"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	cluster_tools_main "$@"
fi
