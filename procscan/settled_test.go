package procscan

import (
	"path"
	"strings"
	"testing"
)

// TestSettled: where the pod's containers live in each hierarchy, as the
// supervisor reads it, with the pause container's cgroup as the reference.
func TestSettled(t *testing.T) {
	const (
		nsPause  = "0::/../ffeeddccbbaa"
		v1Pause  = "4:memory:/kubepods/besteffort/pod1234/ffeeddccbbaa\n0::/"
		sysPause = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-containerd-ffee.scope"
	)
	tests := []struct {
		name, cgroup, pause string
		exiting, want       bool
	}{
		{"cgroup namespace: a sibling", "0::/../3a1f0e9d", nsPause, false, true},
		{"cgroup namespace: a sub-cgroup of a sibling", "0::/../3a1f0e9d/init.scope", nsPause, false, true},
		{"cgroup namespace: not yet moved (the creator's cgroup)", "0::/../../..", nsPause, false, false},
		{"cgroup namespace: the runtime's service", "0::/../../../system.slice/containerd.service", nsPause, false, false},
		{"cgroup namespace: the pod's own cgroup", "0::/..", nsPause, false, false},
		{"full paths: a sibling", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-containerd-3a1f.scope", sysPause, false, true},
		{"full paths: another pod", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9999.slice/cri-containerd-3a1f.scope", sysPause, false, false},
		{"full paths: the kubelet's", "0::/system.slice/kubelet.service", sysPause, false, false},
		{"hybrid: v1 sibling, unified shared", "4:memory:/kubepods/besteffort/pod1234/3a1f\n0::/", v1Pause, false, true},
		{"hybrid: v1 still the runtime's", "4:memory:/system.slice/containerd.service\n0::/", v1Pause, false, false},
		{"hybrid: a hierarchy missing", "0::/", v1Pause, false, false},
		{"hybrid: exiting, v1 lines read /", "4:memory:/\n0::/", v1Pause, true, true},
		{"exiting: its unified line still counts", "0::/../../..", nsPause, true, false},
		{"no pause to compare with", "0::/../../..", "", false, true},
		{"pause in the reader's root: says nothing", "0::/x", "0::/", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Settled(tt.cgroup, tt.pause, tt.exiting); got != tt.want {
				t.Errorf("Settled(%q, pause %q, exiting %v) = %v, want %v", tt.cgroup, tt.pause, tt.exiting, got, tt.want)
			}
			if got := settledOracle(tt.cgroup, tt.pause, tt.exiting); got != tt.want {
				t.Errorf("the oracle says %v, want %v", got, tt.want)
			}
		})
	}
}

// settledOracle is Settled written another way, for FuzzClassify: each path
// is made absolute under a deep enough made-up root and cleaned, and must
// then lie below the pause container's parent directory.
func settledOracle(cgroup, pause string, exiting bool) bool {
	if pause == "" {
		return true
	}
	const root = "/r1/r2/r3/r4/r5/r6/r7/r8/ns"
	line := func(content, h string) (string, bool) {
		for _, l := range strings.Split(content, "\n") {
			if parts := strings.SplitN(l, ":", 3); len(parts) == 3 && parts[0]+":"+parts[1] == h && strings.HasPrefix(parts[2], "/") {
				return parts[2], true
			}
		}
		return "", false
	}
	for _, l := range strings.Split(pause, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || parts[2] == "/" || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		h := parts[0] + ":" + parts[1]
		if exiting && h != "0:" {
			continue
		}
		p, ok := line(cgroup, h)
		if !ok {
			return false
		}
		dir := path.Dir(path.Clean(root + parts[2]))
		abs := path.Clean(root + p)
		if !strings.HasPrefix(abs, dir+"/") {
			return false
		}
	}
	return true
}

// TestClassifyNotYetMoved: issue 15. A container's main process caught
// before the runtime moved it into its cgroup is Starting, not an App
// with a passing identity; in the next scan it is its container's main.
func TestClassifyNotYetMoved(t *testing.T) {
	procs := []Process{
		{PID: 1, StartTime: 100, Comm: "pause", Cgroup: "0::/../pause", State: "S"},
		{PID: 8, StartTime: 200, Comm: "app", Cgroup: "0::/../app0", State: "S"},
		{PID: 12, StartTime: 210, Comm: "sidecar-supervi", Cgroup: "0::/", State: "S"},
		{PID: 66, StartTime: 900, Comm: "podsim", Cgroup: "0::/../../..", State: "S"},
	}
	rules := Rules{Sidecar: []string{"pilot-agent"}}
	kinds := func(pod Pod) map[int]Kind {
		out := map[int]Kind{}
		for _, c := range pod.Containers {
			out[c.Main.PID] = c.Kind
		}
		return out
	}
	if k := kinds(Classify(procs, 12, rules)); k[66] != Starting || k[8] != App {
		t.Errorf("before the move: pid 66 is %v, pid 8 %v; want starting and app", k[66], k[8])
	}
	procs[3].Cgroup = "0::/../app1-r1"
	if k := kinds(Classify(procs, 12, rules)); k[66] != App {
		t.Errorf("after the move: pid 66 is %v, want app", k[66])
	}
}
