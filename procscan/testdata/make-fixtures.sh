#!/bin/bash
# Regenerates the fixture trees under testdata/ (committed; run by hand).
# Each tree is a fake /proc: one directory per PID with stat, cmdline and
# cgroup, and a "self" link. Fields not used by procscan are zero.
set -euo pipefail
cd "$(dirname "$0")"

# proc TREE PID COMM STATE PPID STARTTIME FLAGS CGROUP ARGV...
proc() {
	local tree=$1 pid=$2 comm=$3 state=$4 ppid=$5 start=$6 flags=$7 cgroup=$8
	shift 8
	local d="$tree/$pid"
	mkdir -p "$d"
	# 52 fields as in proc(5); field 22 is the start time, field 9 the flags.
	printf '%s (%s) %s %s %s %s 0 -1 %d 0 0 0 0 1 1 0 0 20 0 1 0 %s 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n' \
		"$pid" "$comm" "$state" "$ppid" "$pid" "$pid" "$((flags))" "$start" >"$d/stat"
	if [ $# -gt 0 ]; then printf '%s\0' "$@" >"$d/cmdline"; else : >"$d/cmdline"; fi
	printf '%b' "$cgroup" >"$d/cgroup"
}

rm -rf v2 v1-hybrid unshared hostile
ID_PROXY=7d2c5f1a9be04c3d8e6f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d
ID_APP=3a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a19
ID_APP2=0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c
ID_PAUSE=ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100

# v2: a pod on a cgroup v2 node with private cgroup namespaces (containerd's
# default there). The supervisor sees its own container as "0::/" and the
# others as siblings "0::/../<id>".
t=v2
proc $t 1 pause S 0 100 0x400100 "0::/../$ID_PAUSE\n" /pause
proc $t 2 kthreadd S 0 1 0x208040 "0::/\n"
proc $t 7 pilot-agent S 0 200 0x400100 "0::/../$ID_PROXY\n" /usr/local/bin/pilot-agent proxy sidecar --domain default.svc.cluster.local
proc $t 13 python3 S 0 210 0x400100 "0::/../$ID_APP\n" python3 /app/job.py --batch 7
proc $t 20 envoy S 7 220 0x400100 "0::/../$ID_PROXY\n" /usr/local/bin/envoy -c etc/istio/proxy/envoy-rev.json
proc $t 25 sidecar-supervi S 0 230 0x400100 "0::/\n" /sidecar-supervisor
proc $t 30 python3 S 13 240 0x400040 "0::/../$ID_APP\n" python3 -m worker
proc $t 40 sh Z 13 250 0x400044 "0::/../$ID_APP\n"
proc $t 50 'my (odd) app' S 0 260 0x400100 "0::/../$ID_APP2\n" '/opt/my (odd) app' --flag
proc $t 81 pilot-agent S 13 270 0x400040 "0::/../$ID_APP\n" ./pilot-agent
proc $t 90 bash S 0 9000 0x400100 "0::/../$ID_APP\n" bash
mkdir -p $t/77 && : >$t/77/.keep   # vanished: listed by readdir, gone before its files were read
ln -sfn 25 $t/self

# v1-hybrid: a cgroup v1/v2 hybrid node without cgroup namespaces: one line
# per hierarchy, full paths. The cgroupfs driver of the kubelet.
t=v1-hybrid
cg() { printf '12:pids:/kubepods/besteffort/pod1234/%s\\n11:memory:/kubepods/besteffort/pod1234/%s\\n1:name=systemd:/kubepods/besteffort/pod1234/%s\\n0::/\\n' "$1" "$1" "$1"; }
proc $t 1 pause S 0 100 0x400100 "$(cg $ID_PAUSE)" /pause
proc $t 6 pilot-agent S 0 200 0x400100 "$(cg $ID_PROXY)" /usr/local/bin/pilot-agent proxy sidecar
proc $t 9 envoy S 6 205 0x400100 "$(cg $ID_PROXY)" /usr/local/bin/envoy
proc $t 12 job S 0 210 0x400100 "$(cg $ID_APP)" /bin/job
proc $t 15 sidecar-supervi S 0 230 0x400100 "$(cg cri-containerd-$ID_APP2.scope)" /sidecar-supervisor
ln -sfn 15 $t/self

# unshared: shareProcessNamespace off. The supervisor is PID 1 of its own
# namespace and sees nothing else.
t=unshared
proc $t 1 sidecar-supervi S 0 100 0x400100 "0::/\n" /sidecar-supervisor
ln -sfn 1 $t/self

# hostile: a hybrid node (v1 lines and the unified one, no cgroup
# namespace), where the pod's processes do what they can to mislead:
#   - the app's main process (13) has an odd comm and argv[0]: spaces,
#     parentheses, a newline, invalid UTF-8;
#   - its children are named pilot-agent (20), and ") S 0 1 1 (" to pass
#     for PPID 0 (21); a pilot-agent was exec'd in later (22, PPID 0);
#   - a zombie child (30) shows "/" for its v1 lines, as exiting processes
#     do, so its content is no container's: its unified line places it;
#   - a second app container (40s) whose main process has exited: its
#     orphans (41, PPID 1) are older than a pilot-agent exec'd into it (42);
#   - a sidecar main process (7) whose argv[0] was rewritten, and its envoy.
t=hostile
rm -rf $t
hy() { printf '11:memory:/kubepods/pod9/%s\\n0::/kubepods/pod9/%s\\n' "$1" "$1"; }
ID_GONE=9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b
proc $t 1 pause S 0 100 0x400100 "$(hy $ID_PAUSE)" /pause
proc $t 7 pilot-agent S 0 200 0x400100 "$(hy $ID_PROXY)" 'pilot-agent: main (istio-proxy)'
proc $t 8 envoy S 7 205 0x400100 "$(hy $ID_PROXY)" /usr/local/bin/envoy
proc $t 13 $'my app (v2)\n\xff)' S 0 210 0x400100 "$(hy $ID_APP)" $'/opt/my\napp \xfe(x)' --password=hunter2
proc $t 20 pilot-agent S 13 220 0x400040 "$(hy $ID_APP)" pilot-agent
proc $t 21 ') S 0 1 1 (' S 13 221 0x400040 "$(hy $ID_APP)" ') S 0 1 1 ('
proc $t 22 pilot-agent S 0 900 0x400100 "$(hy $ID_APP)" /usr/local/bin/pilot-agent request GET stats
proc $t 30 sh Z 13 230 0x40044c "11:memory:/\n0::/kubepods/pod9/$ID_APP\n"
proc $t 41 worker S 1 310 0x400040 "$(hy $ID_GONE)" /bin/worker
proc $t 42 pilot-agent S 0 950 0x400100 "$(hy $ID_GONE)" pilot-agent
proc $t 25 sidecar-supervi S 0 230 0x400100 "$(hy $ID_APP2)" /sidecar-supervisor
ln -sfn 25 $t/self
