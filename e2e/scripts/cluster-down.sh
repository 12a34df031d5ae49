#!/usr/bin/env bash
# Tear down the e2e cluster started by cluster-up.sh and leave nothing behind:
# no process, no mount, no network namespace, no bridge, no state directory.
# The daemons' logs survive in $CLUSTER_DIR.logs/ (replaced by the next
# teardown) for a look after a failed run.
#
# Order matters: the kubelet goes first (else it restarts what we stop), then
# every pod sandbox is stopped and removed through the CRI (crictl rmp), which
# is what tears down the pods' network namespaces and CNI state properly; then
# the control plane, then containerd. Whatever survives that (a crashed
# daemon, a shim, a container process) is found by its link to the state
# directory (command line, root directory, mount point) and removed.
#
# Idempotent and safe to run when nothing is up. Exits non-zero if anything
# it should have removed is still there.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cluster-lib.sh"

cluster_down_main() {
	[ "$(id -u)" -eq 0 ] || die "cluster-down.sh needs root"
	local crictl="$CACHE/crictl/$CRI_TOOLS_VERSION/crictl" i
	[ -d "$CLUSTER_DIR" ] || [ -n "$(strays)" ] || ip link show "$CNI_BRIDGE" >/dev/null 2>&1 || return 0
	log "tearing down the cluster in $CLUSTER_DIR"

	stop_daemon kubelet 15
	if pid_alive containerd; then
		if [ -x "$crictl" ]; then
			timeout 90 "$crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 60s rmp --all --force >/dev/null 2>&1 ||
				log "crictl rmp failed; removing containers through ctr"
		fi
		# Anything the CRI did not remove (or no crictl): kill and delete tasks.
		for i in $(ctr_cmd tasks ls -q 2>/dev/null); do
			ctr_cmd tasks kill --all --signal SIGKILL "$i" >/dev/null 2>&1 || true
			ctr_cmd tasks delete --force "$i" >/dev/null 2>&1 || true
		done
		for i in $(ctr_cmd containers ls -q 2>/dev/null); do
			ctr_cmd containers delete "$i" >/dev/null 2>&1 || true
		done
	fi
	for i in kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
		stop_daemon "$i" 15
	done
	kill_strays

	local m
	while read -r m; do
		[ -n "$m" ] || continue
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
	done < <(mounts_under "$CLUSTER_DIR")
	if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
		ip link delete "$CNI_BRIDGE" || log "could not delete bridge $CNI_BRIDGE"
	fi
	remove_cgroups
	remove_host_paths

	local left
	left="$(mounts_under "$CLUSTER_DIR")"
	[ -z "$left" ] || die "mounts left under $CLUSTER_DIR (not removing it): $left"
	left="$(strays)"
	[ -z "$left" ] || die "processes left: $left"
	if [ -d "$CLUSTER_DIR/logs" ]; then
		rm -rf "$CLUSTER_DIR.logs"
		mv "$CLUSTER_DIR/logs" "$CLUSTER_DIR.logs"
	fi
	rm -rf --one-file-system "$CLUSTER_DIR"
	log "cluster torn down (daemon logs kept in $CLUSTER_DIR.logs)"
}

# stop_daemon NAME SECONDS: SIGTERM, then SIGKILL after SECONDS.
stop_daemon() {
	local name="$1" limit="$2" pid t0=$SECONDS
	pid_alive "$name" || { rm -f "$CLUSTER_DIR/pids/$name".{pid,start}; return 0; }
	pid="$(cat "$CLUSTER_DIR/pids/$name.pid")"
	kill -TERM "$pid" 2>/dev/null || true
	while running "$pid"; do
		if [ $((SECONDS - t0)) -ge "$limit" ]; then
			log "$name (pid $pid) ignored SIGTERM for ${limit}s; SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		sleep 0.2
	done
	rm -f "$CLUSTER_DIR/pids/$name".{pid,start}
	log "stopped $name in $((SECONDS - t0))s"
}

# running PID: the process exists and is not a zombie (the daemons are
# orphans once cluster-up.sh has exited, and their reaper may take its time).
running() {
	local stat
	stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
	stat="${stat##*) }"
	[ "${stat%% *}" != Z ]
}

# strays: pids of processes tied to this cluster: started with the state
# directory on their command line (daemons, containerd shims) or running with
# a root directory inside it (container processes).
strays() {
	# Two scans of /proc in all, not a process per pid: this runs on machines
	# with thousands of processes. The pattern's first character is bracketed
	# so that grep does not find its own command line.
	local re
	re="[${CLUSTER_DIR:0:1}]$(printf '%s/' "${CLUSTER_DIR:1}" | sed 's/[]\\.[*^$]/\\&/g')"
	{
		grep -lE -- "$re" /proc/[0-9]*/cmdline 2>/dev/null || true
		find /proc -mindepth 2 -maxdepth 2 -name root -lname "$CLUSTER_DIR/*" 2>/dev/null || true
	} | awk -F/ -v self=$$ '$3 != self && !seen[$3]++ { printf "%s ", $3 }'
}

# kill_strays: SIGKILL every stray until none is left, for up to 2 minutes
# (a process in the kernel, as one writing to a slow disk, outlives its
# SIGKILL for a while; giving up early would fail every later start).
kill_strays() {
	local pids said='' t0=$SECONDS
	while pids="$(strays)" && [ -n "$pids" ]; do
		[ $((SECONDS - t0)) -lt 120 ] || return 0
		[ "$pids" = "$said" ] || log "killing leftover processes: $pids"
		said="$pids"
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		sleep 0.3
	done
}

# remove_host_paths: what the daemons left outside the state directory (see
# HOST_PATHS), for the paths that cluster-up.sh saw appear. Links into the
# state directory go in any case: they dangle now.
remove_host_paths() {
	local l p
	for l in /var/log/containers/*.log; do
		[ -L "$l" ] || continue
		case "$(readlink "$l")" in "$CLUSTER_DIR"/*) rm -f "$l" ;; esac
	done
	[ -s "$CLUSTER_DIR/created-host-paths" ] || return 0
	while read -r p; do
		[ -e "$p" ] || continue
		find "$p" -depth \( -type s -o -xtype l -o -type d -empty \) -delete 2>/dev/null || true
		[ ! -e "$p" ] || log "left $p in place: it holds files of someone else"
	done <"$CLUSTER_DIR/created-host-paths"
}

# remove_cgroups: the pod and container cgroups runc made for this cluster's
# containerd (cgroupfs driver, parent /k8s.io when the kubelet manages no QoS
# tree). Only empty directories are removed; rmdir refuses anything in use.
remove_cgroups() {
	local d
	for d in /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io; do
		[ -d "$d" ] || continue
		find "$d" -depth -mindepth 1 -type d -exec rmdir {} + 2>/dev/null || true
		rmdir "$d" 2>/dev/null || true
	done
}

cluster_down_main "$@"
