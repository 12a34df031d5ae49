#!/usr/bin/env bash
# Restart one daemon of the running e2e cluster, the kubelet or containerd,
# as a node's service manager does on an upgrade or after a crash: SIGTERM,
# wait for it to exit (SIGKILL after 30 s), start the same binary again with
# the same arguments and environment (read from /proc before the stop, so
# nothing is restated here), as cluster-up.sh starts it (daemon_exec: in /,
# in a session of its own, appending to its log), and wait (bounded) until it
# serves again:
#   kubelet      its healthz answers and the node is Ready
#   containerd   ctr answers, the CRI says the runtime is ready, and the node
#                is Ready
# The pods' containers keep running through either: containerd's shims
# outlive containerd, and the kubelet finds its pods in the runtime again.
# Used by e2e/soak, which checks the Jobs running across each restart.
#
#   cluster-restart.sh kubelet|containerd
#
# Needs root, and the cluster up (cluster-up.sh).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cluster-lib.sh"

# The crictl cluster-tools.sh built for the running cluster.
CRICTL="$CACHE/crictl/$CRI_TOOLS_VERSION/crictl"

cluster_restart_main() {
	[ "$(id -u)" -eq 0 ] || die "cluster-restart.sh needs root"
	local name="${1:-}" pid t0=$SECONDS
	case "$name" in
	kubelet | containerd) ;;
	*) die "usage: cluster-restart.sh kubelet|containerd (got '${name}')" ;;
	esac
	[ -x "$CRICTL" ] || die "no crictl under $CACHE: start the cluster first (cluster-up.sh)"
	pid_alive "$name" || die "$name is not running in $CLUSTER_DIR: start the cluster first (cluster-up.sh)"
	pid="$(cat "$CLUSTER_DIR/pids/$name.pid")"
	local args=() envs=()
	mapfile -d '' args <"/proc/$pid/cmdline"
	mapfile -d '' envs <"/proc/$pid/environ"
	[ ${#args[@]} -gt 0 ] || die "cannot read the command line of $name (pid $pid)"
	# Checked before the stop: a daemon that cannot be started again must
	# not be stopped.
	[ -x "${args[0]}" ] || die "cannot start $name again: ${args[0]} is not an executable (pid $pid left running)"

	kill -TERM "$pid"
	local waited=0
	while pid_alive "$name"; do
		if [ $waited -ge 150 ]; then
			log "$name (pid $pid) ignored SIGTERM for 30s; SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		sleep 0.2
		waited=$((waited + 1))
	done
	log "stopped $name (pid $pid) in $((SECONDS - t0))s"

	# As start_daemon in cluster-up.sh: $! is the daemon.
	(daemon_exec "$CLUSTER_DIR/logs/$name.log" env -i "${envs[@]}" "${args[@]}") &
	record_pid "$name" "$!"
	await_exec "$!" "$name" "${args[0]}"
	log "started $name again (pid $!)"

	case "$name" in
	kubelet)
		wait_until "kubelet healthz" "$WAIT_LIMIT" curl -fsS "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
		;;
	containerd)
		wait_until "containerd" "$WAIT_LIMIT" ctr_cmd version
		wait_until "the CRI runtime ready" "$WAIT_LIMIT" cri_ready
		;;
	esac
	wait_until "node $NODE_NAME Ready" "$WAIT_LIMIT" node_ready
	log "$name restarted in $((SECONDS - t0))s"
}

cri_ready() {
	# Into a variable first: a grep -q on a pipe exits at its first match,
	# and under pipefail the writer's SIGPIPE would fail the check.
	local info
	info="$("$CRICTL" --runtime-endpoint "unix://$CONTAINERD_SOCK" info 2>/dev/null)" || return 1
	condition "${info//[[:space:]]/}" RuntimeReady true # crictl sorts keys: status first
}

# wait_until WHAT SECONDS CMD...: run CMD every half second until it
# succeeds; fail after SECONDS, or at once if the daemon died meanwhile.
wait_until() {
	local what="$1" limit="$2" t0=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		pid_alive "$name" || die "$name exited while waiting for $what (see $CLUSTER_DIR/logs/$name.log)"
		[ $((SECONDS - t0)) -lt "$limit" ] || die "timed out after ${limit}s waiting for $what"
		sleep 0.5
	done
	log "$what after $((SECONDS - t0))s"
}

cluster_restart_main "$@"
