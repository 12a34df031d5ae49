#!/usr/bin/env bash
# Start a one-node Kubernetes from real parts, all on 127.0.0.1:
#
#   etcd (Debian) -> containerd with its CRI plugin (Debian, runc, bridge CNI)
#   -> kube-apiserver -> kube-controller-manager, kube-scheduler -> kubelet
#
# The Kubernetes binaries come from cluster-tools.sh (built from the Go module
# proxy, cached); the pause and busybox images from cluster-images.sh, imported
# into containerd before the kubelet starts. Waits (bounded) until the node is
# Ready, the default ServiceAccount and kube-root-ca.crt exist (pods are
# rejected or stuck before that), then prints, one NAME=VALUE a line:
#   KUBECONFIG CLUSTER_DIR NODE_NAME CONTAINERD_SOCK CRICTL
#   PAUSE_IMAGE BUSYBOX_IMAGE
# Logs go to stderr; the daemons' logs to $CLUSTER_DIR/logs/<name>.log.
#
# Idempotent: if the cluster in CLUSTER_DIR is already up and Ready, it is
# reused as it is; leftovers of a dead one are removed (cluster-down.sh) first.
# With SUPERVISOR_E2E_CLUSTER_IN_USE=1 (set by cluster.Open when another
# test holds the cluster) an unhealthy cluster is waited for, never removed.
# On failure it prints the tail of each daemon's log and tears down what it
# started (SUPERVISOR_E2E_KEEP_CLUSTER=1 keeps it for a look).
#
# Needs root (containerd, kubelet and network namespaces).
#
# Kubelet settings this host needs (see also shared notes, real-stack.md):
#   failCgroupV1: false               the host is cgroup v1/v2 hybrid
#   cgroupDriver: cgroupfs            no systemd here
#   cgroupsPerQOS: false, enforceNodeAllocatable: []
#                                     no QoS/allocatable cgroup trees to manage
#   containerd restrict_oom_score_adj lowering oom_score_adj is refused here
#   node name localhost, API server --kubelet-preferred-address-types Hostname
#                                     the kubelet refuses --node-ip 127.0.0.1, and
#                                     logs/exec need an address that reaches it
#   makeIPTablesUtilChains: false     else KUBE-* rules stay in the host firewall
#
# A cluster started by hand is torn down by the next go test that uses it
# (the last user's Stop), unless SUPERVISOR_E2E_KEEP_CLUSTER=1 is set there.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cluster-lib.sh"

# The kubelet's log level: 3 shows, for each container it starts, whether it
# mounted its /etc/hosts ("Creating hosts mount for container").
KUBELET_VERBOSITY="${SUPERVISOR_E2E_KUBELET_VERBOSITY:-1}"

cluster_up_main() {
	[ "$(id -u)" -eq 0 ] || die "cluster-up.sh needs root (containerd, kubelet, network namespaces)"
	local start=$SECONDS
	eval "$(bash "$E2E_DIR/scripts/cluster-tools.sh")"
	eval "$(bash "$E2E_DIR/scripts/cluster-images.sh" pause busybox)"
	log "tools and images ready in $((SECONDS - start))s"

	if [ "${SUPERVISOR_E2E_CLUSTER_IN_USE:-}" = 1 ] && ! cluster_healthy; then
		# Another test holds the cluster (its users lock, cluster.Open):
		# unhealthy for now (the node NotReady while a daemon restarts,
		# say) is not dead. Wait for it; never tear down a cluster in use.
		# A daemon that died ends the wait, and this start, at once.
		[ -s "$KUBECONFIG_PATH" ] ||
			die "the cluster in $CLUSTER_DIR is in use by another test, but its state is gone; not tearing it down"
		log "the cluster in $CLUSTER_DIR is in use by another test and not healthy now: waiting for it"
		wait_for "the cluster in use to be healthy" "$WAIT_LIMIT" cluster_healthy
	fi
	if cluster_healthy; then
		local running
		running="$(kube_get "/api/v1/nodes/$NODE_NAME" | grep -o '"kubeletVersion":"[^"]*"' | cut -d'"' -f4)"
		[ "$running" = "$KUBERNETES_VERSION" ] ||
			die "the cluster in $CLUSTER_DIR runs Kubernetes $running, not $KUBERNETES_VERSION: stop it first (e2e/scripts/cluster-down.sh), or set SUPERVISOR_E2E_KUBERNETES_VERSION=$running"
		log "reusing the cluster in $CLUSTER_DIR"
		import_images # cheap, and an image rebuilt since then replaces the old one
		print_env
		return 0
	fi
	bash "$E2E_DIR/scripts/cluster-down.sh" >&2
	trap on_failure EXIT
	# A signal must end the script through exit, so that the EXIT trap tears
	# down what was started (bash runs no EXIT trap when a signal kills it).
	trap 'exit 143' TERM
	trap 'exit 130' INT
	mkdir -p "$CLUSTER_DIR"/{pids,logs,pki,etcd,containerd,cni/net.d,cni/ipam,kubelet,pod-logs}
	start=$SECONDS

	local p
	for p in "${HOST_PATHS[@]}"; do
		[ -e "$p" ] || printf '%s\n' "$p" >>"$CLUSTER_DIR/created-host-paths"
	done
	make_pki
	write_configs

	start_daemon etcd /usr/bin/etcd \
		--name e2e --data-dir "$CLUSTER_DIR/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
		--logger zap --log-outputs stderr
	wait_for etcd "$WAIT_LIMIT" curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health"

	make_bridge
	start_daemon containerd /usr/bin/containerd --config "$CLUSTER_DIR/containerd/config.toml"
	wait_for containerd "$WAIT_LIMIT" ctr_cmd version
	import_images

	# MutatingAdmissionPolicy (deploy/admission): GA and on by default from
	# 1.36 (admissionregistration.k8s.io/v1); on 1.34 and 1.35 a beta, off
	# by default, served as v1beta1 once both its feature gate and its API
	# version are turned on.
	local admission_flags=()
	case "$KUBERNETES_VERSION" in
	v1.34.* | v1.35.*)
		admission_flags=(--feature-gates MutatingAdmissionPolicy=true
			--runtime-config admissionregistration.k8s.io/v1beta1=true) ;;
	esac
	start_daemon kube-apiserver "$KUBE_APISERVER" \
		"${admission_flags[@]}" \
		--etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
		--tls-cert-file "$CLUSTER_DIR/pki/apiserver.crt" --tls-private-key-file "$CLUSTER_DIR/pki/apiserver.key" \
		--client-ca-file "$CLUSTER_DIR/pki/ca.crt" \
		--authorization-mode AlwaysAllow \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$CLUSTER_DIR/pki/sa.pub" \
		--service-account-signing-key-file "$CLUSTER_DIR/pki/sa.key" \
		--service-cluster-ip-range "$SERVICE_SUBNET" \
		--endpoint-reconciler-type none \
		--kubelet-preferred-address-types Hostname \
		--kubelet-client-certificate "$CLUSTER_DIR/pki/admin.crt" --kubelet-client-key "$CLUSTER_DIR/pki/admin.key" \
		--allow-privileged=true --profiling=false
	wait_for kube-apiserver "$WAIT_LIMIT" kube_get /readyz

	start_daemon kube-controller-manager "$KUBE_CONTROLLER_MANAGER" \
		--kubeconfig "$KUBECONFIG_PATH" \
		--authentication-kubeconfig "$KUBECONFIG_PATH" --authorization-kubeconfig "$KUBECONFIG_PATH" \
		--bind-address 127.0.0.1 --secure-port 0 \
		--service-account-private-key-file "$CLUSTER_DIR/pki/sa.key" \
		--root-ca-file "$CLUSTER_DIR/pki/ca.crt" \
		--leader-elect=false --profiling=false
	start_daemon kube-scheduler "$KUBE_SCHEDULER" \
		--kubeconfig "$KUBECONFIG_PATH" \
		--authentication-kubeconfig "$KUBECONFIG_PATH" --authorization-kubeconfig "$KUBECONFIG_PATH" \
		--bind-address 127.0.0.1 --secure-port 0 \
		--leader-elect=false --profiling=false

	start_daemon kubelet "$KUBELET" \
		--config "$CLUSTER_DIR/kubelet/config.yaml" \
		--kubeconfig "$KUBECONFIG_PATH" \
		--root-dir "$CLUSTER_DIR/kubelet" --cert-dir "$CLUSTER_DIR/kubelet/pki" \
		--hostname-override "$NODE_NAME" --v "$KUBELET_VERBOSITY"

	wait_for "node $NODE_NAME Ready" "$WAIT_LIMIT" node_ready
	wait_for "ServiceAccount default" "$WAIT_LIMIT" kube_get /api/v1/namespaces/default/serviceaccounts/default
	wait_for "ConfigMap kube-root-ca.crt" "$WAIT_LIMIT" kube_get /api/v1/namespaces/default/configmaps/kube-root-ca.crt
	trap - EXIT TERM INT
	log "cluster up in $((SECONDS - start))s (node Ready), state in $CLUSTER_DIR"
	print_env
}

print_env() {
	printf 'KUBECONFIG=%s\nCLUSTER_DIR=%s\nNODE_NAME=%s\nCONTAINERD_SOCK=%s\nCRICTL=%s\n' \
		"$KUBECONFIG_PATH" "$CLUSTER_DIR" "$NODE_NAME" "$CONTAINERD_SOCK" "$CRICTL"
	printf 'PAUSE_IMAGE=%s\nBUSYBOX_IMAGE=%s\n' "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"
}

on_failure() {
	local rc=$? d
	[ $rc -eq 0 ] && return
	log "cluster-up failed (exit $rc); last lines of each daemon's log:"
	for d in "${CLUSTER_DAEMONS[@]}"; do
		[ -s "$CLUSTER_DIR/logs/$d.log" ] || continue
		printf '\n==> %s <==\n' "$d" >&2
		tail -n 25 "$CLUSTER_DIR/logs/$d.log" >&2
	done
	if [ "${SUPERVISOR_E2E_KEEP_CLUSTER:-}" = 1 ]; then
		log "SUPERVISOR_E2E_KEEP_CLUSTER=1: leaving it up; cluster-down.sh removes it"
	else
		bash "$E2E_DIR/scripts/cluster-down.sh" >&2 || true
	fi
	exit $rc
}

# cluster_healthy: every daemon runs and the node is Ready.
cluster_healthy() {
	local d
	[ -s "$KUBECONFIG_PATH" ] || return 1
	for d in "${CLUSTER_DAEMONS[@]}"; do
		pid_alive "$d" || return 1
	done
	node_ready
}

# start_daemon NAME BINARY ARGS...: start as a daemon (daemon_exec: it must
# outlive the caller, e.g. a go test that hands the cluster to the next
# package), with only PATH in its environment and output to logs/NAME.log;
# pid to pids/NAME.pid (record_pid). setsid in a background subshell is not
# a group leader, so it execs in place and $! is the daemon.
start_daemon() {
	local name="$1"
	shift
	log "starting $name"
	(daemon_exec "$CLUSTER_DIR/logs/$name.log" env -i PATH="$DAEMON_PATH" "$@") &
	record_pid "$name" "$!"
	await_exec "$!" "$name" "$1"
}

# wait_for WHAT SECONDS CMD...: run CMD every half second until it succeeds;
# fail after SECONDS, or at once if a daemon died meanwhile.
wait_for() {
	local what="$1" limit="$2" t0=$SECONDS d
	shift 2
	until "$@" >/dev/null 2>&1; do
		for d in "${CLUSTER_DAEMONS[@]}"; do
			if [ -e "$CLUSTER_DIR/pids/$d.pid" ] && ! pid_alive "$d"; then
				die "$d exited while waiting for $what (see $CLUSTER_DIR/logs/$d.log)"
			fi
		done
		[ $((SECONDS - t0)) -lt "$limit" ] || die "timed out after ${limit}s waiting for $what"
		sleep 0.5
	done
	log "$what ready after $((SECONDS - t0))s"
}

import_images() {
	import_image "$PAUSE_ARCHIVE"
	# shellcheck disable=SC2086 # a space-separated list
	import_image "$BUSYBOX_ARCHIVE" $BUSYBOX_ALIASES
}

# import_image ARCHIVE [ALIAS...]: import an OCI archive into containerd's k8s.io
# namespace (the one its CRI plugin serves), unpacked for the CRI snapshotter.
import_image() {
	local archive="$1" ref alias
	shift
	ref="$(tar -xOf "$archive" index.json | sed -n 's/.*"org.opencontainers.image.ref.name":"\([^"]*\)".*/\1/p')"
	ctr_cmd images import --snapshotter overlayfs "$archive" >/dev/null
	for alias in "$@"; do
		ctr_cmd images tag --force "$ref" "$alias" >/dev/null
	done
	log "imported $ref${*:+ (also as $*)}"
}

# make_bridge: the pods' bridge, made before the bridge plugin sees it, with
# the pod subnet's first address (host-local never hands that one out). The
# host then has a route to the pods, which the kubelet's HTTP probes need
# (istio-proxy's startup and readiness probes on :15021); without it they
# leave through the default route and something out there answers 404.
# The plugin's own isGateway would do the same but also switch on the host's
# net.ipv4.ip_forward, and leave it on. Pods still get no default route.
# cluster-down.sh deletes the bridge, its address and route with it.
make_bridge() {
	ip link add "$CNI_BRIDGE" type bridge
	ip addr add "${POD_SUBNET%.0/*}.1/${POD_SUBNET#*/}" dev "$CNI_BRIDGE"
	ip link set "$CNI_BRIDGE" up
	log "bridge $CNI_BRIDGE with ${POD_SUBNET%.0/*}.1 for the host"
}

make_pki() {
	local p="$CLUSTER_DIR/pki"
	log "generating the cluster's CA, serving and client certificates"
	(
		cd "$p"
		umask 077
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 7 \
			-subj "/CN=sidecar-supervisor-e2e-ca" 2>/dev/null
		leaf apiserver "/CN=kube-apiserver" \
			"subjectAltName=IP:127.0.0.1,IP:${SERVICE_SUBNET%.0/*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
		# One identity for every client: authorization is AlwaysAllow on a
		# loopback-only cluster, and system:masters keeps it working if that changes.
		leaf admin "/O=system:masters/CN=e2e-admin" "extendedKeyUsage=clientAuth"
		openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
		openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
	)
	local ca crt key
	ca="$(base64 -w0 "$p/ca.crt")"
	crt="$(base64 -w0 "$p/admin.crt")"
	key="$(base64 -w0 "$p/admin.key")"
	umask 077
	cat >"$KUBECONFIG_PATH" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: e2e-admin
  user:
    client-certificate-data: $crt
    client-key-data: $key
contexts:
- name: e2e
  context: {cluster: e2e, user: e2e-admin, namespace: default}
current-context: e2e
EOF
	umask 022
}

# leaf NAME SUBJECT EXTENSIONS: NAME.key and NAME.crt signed by ca.
leaf() {
	openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
	printf '%s\n' "$3" >"$1.ext"
	openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
		-extfile "$1.ext" -out "$1.crt" 2>/dev/null
	rm -f "$1.csr" "$1.ext"
}

write_configs() {
	local c="$CLUSTER_DIR/containerd"
	cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
# Plugins that cannot work here and only log errors.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$CONTAINERD_SOCK"

# containerd 1.6 gives a task's state 2 s. On a loaded node the sandbox's shim can
# take longer; CreateContainer then reads the sandbox's PID as 0 and the container
# fails with "namespace path: lstat /proc/0/ns/ipc" (StartError, the pod fails).
# Wait for the real answer instead.
[timeouts]
  "io.containerd.timeout.task.state" = "60s"

[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Lowering oom_score_adj is refused on this host; clamp instead of failing.
  restrict_oom_score_adj = true
  # Network namespaces under the state dir, not /run/netns: teardown finds them.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        # runc's state, else under /run/containerd/runc.
        Root = "$c/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CLUSTER_DIR/cni/net.d"
EOF
	cat >"$CLUSTER_DIR/cni/net.d/10-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sidecar-supervisor-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "dataDir": "$CLUSTER_DIR/cni/ipam"
      }
    }
  ]
}
EOF
	printf 'nameserver 127.0.0.1\n' >"$CLUSTER_DIR/resolv.conf"
	cat >"$CLUSTER_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: "$CLUSTER_DIR/pki/ca.crt"}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
# This host: cgroup v1/v2 hybrid, no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# No cluster DNS runs; pods get a nameserver that answers nothing (127.0.0.1 in
# their own network namespace) with the usual search path, so lookups fail at
# once and never leave the machine.
clusterDomain: cluster.local
clusterDNS: [127.0.0.1]
resolvConf: "$CLUSTER_DIR/resolv.conf"
podLogsDir: "$CLUSTER_DIR/pod-logs"
# Images cannot be pulled again here: never garbage-collect them, never evict
# for a disk that other builds on the machine are filling.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
# Leave the host's firewall alone: by default the kubelet adds KUBE-* chains
# and a KUBE-FIREWALL jump to INPUT and OUTPUT, which outlive it.
makeIPTablesUtilChains: false
EOF
}

cluster_up_main "$@"
