# shellcheck shell=bash disable=SC2034
# Shared definitions of the one-node e2e cluster, sourced by cluster-up.sh and
# cluster-down.sh after lib.sh. Source it; do not run it.
#
# Everything the cluster writes lives under one state directory (CLUSTER_DIR,
# default /tmp/sidecar-supervisor-e2e-cluster, override with
# SUPERVISOR_E2E_CLUSTER_DIR): configs, PKI, etcd data, containerd's root and
# state (its network namespaces included), kubelet's root, pod logs, and one
# pid file and one log file per daemon. Nothing goes to /etc, /var/lib or
# /opt, so the cluster coexists with whatever else the machine runs and
# cluster-down.sh can find everything it must remove.

CLUSTER_DIR="${SUPERVISOR_E2E_CLUSTER_DIR:-/tmp/sidecar-supervisor-e2e-cluster}"
# Fixed loopback ports, away from the usual ones (2379, 6443, 10250, ...), so
# that a second cluster on the same machine fails to start rather than mixing.
ETCD_CLIENT_PORT=23790
ETCD_PEER_PORT=23800
APISERVER_PORT=16443
KUBELET_PORT=11250
KUBELET_HEALTHZ_PORT=11248
# The node is called localhost: the API server reaches the kubelet (logs, exec)
# at the node's Hostname address, and only that name resolves to 127.0.0.1
# without touching /etc/hosts. (The kubelet refuses --node-ip 127.0.0.1:
# "nodeIP can't be loopback address", and then publishes no address at all.)
NODE_NAME=localhost
# Pod network: one host-only bridge, no masquerade, no route out; pods reach
# each other, and the host (the kubelet's probes) reaches them through the
# bridge's address, the subnet's first (see make_bridge in cluster-up.sh). Their resolv.conf points at 127.0.0.1 inside the
# pod, so a DNS lookup (pilot-agent looking for istiod) fails at once instead of
# leaving the machine.
CNI_BRIDGE=ssve2e0
POD_SUBNET=10.234.0.0/24
SERVICE_SUBNET=10.234.128.0/24

CONTAINERD_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
KUBECONFIG_PATH="$CLUSTER_DIR/kubeconfig"
# Paths outside CLUSTER_DIR that the daemons use whatever they are told:
#   /var/log/containers  the kubelet's links to container logs
#   /var/lib/kubelet     the kubelet's device-plugin socket
#   /var/lib/cni         the CNI library's result cache (containerd 1.6 has no setting)
#   /run/containerd      containerd 1.6's shim sockets (/run/containerd/s)
# cluster-up.sh records which of them did not exist before it started;
# cluster-down.sh removes what is left in those (sockets, dangling links, empty
# directories; never a regular file).
HOST_PATHS=(/var/log/containers /var/lib/kubelet /var/lib/cni /run/containerd)
# Daemons, in start order; stopped in reverse.
CLUSTER_DAEMONS=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet)

# WAIT_LIMIT bounds each wait for a daemon or the node to serve (seconds):
# a hang guard only. A daemon that dies is caught at once (pid_alive); one
# that starts slowly, on two cores shared by two test runs, is waited for.
# SUPERVISOR_E2E_READY_TIMEOUT overrides it.
WAIT_LIMIT="${SUPERVISOR_E2E_READY_TIMEOUT:-600}"

# DAEMON_PATH is the daemons' whole environment but what they are given:
# containerd finds runc and its shim on it.
DAEMON_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# daemon_exec LOG CMD...: become CMD, as a daemon of its own, in the calling
# (background) subshell: a session of its own, the working directory /, stdin
# closed, output appended to LOG, and no descriptor but 0, 1 and 2. Never the
# caller's directory (a test run's temporary clone, removed while the cluster
# lives on: a restart there would fail) nor its descriptors (that of a
# `flock FILE go test ...` would hold the lock for the daemon's life).
daemon_exec() {
	local log="$1" fd
	shift
	cd / || exit 1
	for fd in /proc/"$BASHPID"/fd/*; do
		fd="${fd##*/}"
		if [ "$fd" -gt 2 ] && [ -e "/proc/$BASHPID/fd/$fd" ]; then
			eval "exec $fd>&-"
		fi
	done
	exec setsid "$@" </dev/null >>"$log" 2>&1
}

# await_exec PID NAME BINARY: wait until the background subshell
# PID has become the daemon NAME, BINARY (daemon_exec's exec): until then it
# is a copy of the script, which a check by command line would take for
# gone (or, for cluster-restart.sh, whose arguments name the daemon, for
# it). Fails if it ended first; WAIT_LIMIT bounds a hang.
await_exec() {
	local pid="$1" name="$2" bin t0=$SECONDS
	bin="$(readlink -f "$3")"
	until [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$bin" ]; do
		kill -0 "$pid" 2>/dev/null || die "$name exited at once (see $CLUSTER_DIR/logs/$name.log)"
		[ $((SECONDS - t0)) -lt "$WAIT_LIMIT" ] || die "$name (pid $pid) did not start $bin within ${WAIT_LIMIT}s"
		sleep 0.05
	done
}

# proc_start PID: the process's start time (field 22 of /proc/PID/stat,
# clock ticks since boot), which an exec keeps and a later process given
# the same PID does not share; fails if there is no such process.
proc_start() {
	local stat
	stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
	# After the comm, which may hold spaces, the fields run from 3 (state).
	stat="${stat##*) }"
	# shellcheck disable=SC2086
	set -- $stat
	printf '%s\n' "${20}"
}

# record_pid NAME PID: the daemon NAME is PID, started at its start time
# (pids/NAME.start, written first: pid_alive reads it once the pid file
# exists).
record_pid() {
	proc_start "$2" >"$CLUSTER_DIR/pids/$1.start" || true
	printf '%s\n' "$2" >"$CLUSTER_DIR/pids/$1.pid"
}

# pid_alive NAME: the daemon NAME recorded in its pid file is still running:
# the same process (its start time, record_pid), not a zombie. A process
# given a recycled PID is not it, whatever its command line says (a `tail
# -f .../logs/kubelet.log` would name the kubelet).
pid_alive() {
	local f="$CLUSTER_DIR/pids/$1.pid" pid stat
	[ -s "$f" ] || return 1
	pid="$(cat "$f")"
	if [ -s "$CLUSTER_DIR/pids/$1.start" ]; then
		[ "$(proc_start "$pid")" = "$(cat "$CLUSTER_DIR/pids/$1.start")" ] || return 1
		stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
		stat="${stat##*) }"
		[ "${stat%% *}" != Z ]
		return
	fi
	# Started by scripts that recorded no start time: the command line must
	# still name the daemon.
	kill -0 "$pid" 2>/dev/null || return 1
	local cmdline
	cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
	grep -q -- "$1" <<<"$cmdline" || return 1
}

ctr_cmd() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# kube_get PATH: GET PATH from the API server as its admin, the JSON on stdout
# without whitespace. curl rather than a kubectl: these checks are all the
# scripts asked of one, and its build cost a cold run about a minute. (The
# API server indents JSON for a curl user agent; the agent set here does not
# matter, the whitespace is dropped.)
kube_get() {
	local out
	out="$(curl -fsS --max-time 10 --cacert "$CLUSTER_DIR/pki/ca.crt" \
		--cert "$CLUSTER_DIR/pki/admin.crt" --key "$CLUSTER_DIR/pki/admin.key" \
		"https://127.0.0.1:$APISERVER_PORT$1")" || return 1
	printf '%s\n' "${out//[[:space:]]/}"
}

# condition JSON TYPE STATUS: JSON (without whitespace) has a condition of
# type TYPE whose status is STATUS (a JSON value: true, "True"), whatever the
# order of its keys.
condition() {
	local c
	c="$(grep -oE '\{[^{}]*"type":"'"$2"'"[^{}]*\}' <<<"$1")" || return 1
	grep -q '"status":'"$3" <<<"$c"
}

# node_ready: the node's Ready condition is True.
node_ready() {
	local node
	node="$(kube_get "/api/v1/nodes/$NODE_NAME")" || return 1
	condition "$node" Ready '"True"'
}

# mounts_under DIR: mount points at or below DIR, deepest first.
mounts_under() {
	awk -v d="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mountinfo |
		awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
}
