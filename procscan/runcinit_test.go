package procscan

import "testing"

// TestRuncInitIsNotAnApp: under containerd + runc, a container that has been
// created but not yet started shows in the pod's shared PID namespace as
// runc's init process (comm "runc:[2:INIT]", argv[0] "runc", already with the
// container's uid and cgroup), blocked on runc's exec fifo until the runtime
// starts it; it then execs the entrypoint in place, keeping its PID. For
// istio-proxy's container, that PID becomes pilot-agent. Classifying it as an
// App makes the supervisor wait for pilot-agent to exit: the pod never
// completes. Seen on the one-node cluster of e2e/k8sjobs (Kubernetes 1.37.2,
// containerd 1.6.20, runc 1.1.5).
func TestRuncInitIsNotAnApp(t *testing.T) {
	cg := func(id string) string { return "0::/kubepods/besteffort/pod1234/" + id }
	procs := []Process{
		{PID: 1, PPID: 0, StartTime: 100, Comm: "pause", Argv0: "/pause", Cgroup: cg("aaaaaaaaaaaa"), State: "S"},
		{PID: 7, PPID: 0, StartTime: 200, Comm: "sh", Argv0: "sh", Cgroup: cg("bbbbbbbbbbbb"), State: "S"},
		{PID: 20, PPID: 0, StartTime: 300, Comm: "sidecar-supervi", Argv0: "/sidecar-supervisor", Cgroup: cg("cccccccccccc"), State: "S", UID: 1337},
		{PID: 24, PPID: 0, StartTime: 310, Comm: "runc:[2:INIT]", Argv0: "runc", Cgroup: cg("dddddddddddd"), State: "S", UID: 1337},
	}
	pod := Classify(procs, 20, Rules{Sidecar: []string{"pilot-agent"}})
	for _, c := range pod.Containers {
		if c.Main.PID == 24 && c.Kind == App {
			t.Errorf("container %s, whose main process is runc's init (not yet started: it will exec its entrypoint, here pilot-agent), is classified %s", c.Name, c.Kind)
		}
	}
}
