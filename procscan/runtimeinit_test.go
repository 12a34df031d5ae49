package procscan

import "testing"

// TestRuntimeInitIsNotAnApp: under the kubelet, a container that has been
// created but not yet started shows in the pod's shared PID namespace as its
// runtime's init process, already with the container's uid and cgroup,
// waiting until the runtime starts it; it then execs the entrypoint in
// place, keeping its PID. For istio-proxy's container, that PID becomes
// pilot-agent. Classifying it as an App makes the supervisor wait for
// pilot-agent to exit: the pod never completes. Seen with runc on the
// one-node cluster of e2e/k8sjobs (Kubernetes 1.37.2, containerd 1.6.20,
// runc 1.1.5); crun's as left by `crun create` (crun 1.8.1, Debian 12)
// and as CRI-O runs it; the memfd names as crun's ensure_cloned_binary
// leaves them (argv kept, comm the memfd's name, or the fd's number before
// Linux 6.14); youki's as it names it (prctl, "youki:[2:INIT]"); Kata's
// as its agent's rustjail leaves it (kata-containers 3.32.0, "kata-agent
// init", forked into the pod's PID namespace before its execvp).
func TestRuntimeInitIsNotAnApp(t *testing.T) {
	cg := func(id string) string { return "0::/kubepods/besteffort/pod1234/" + id }
	for _, tt := range []struct {
		name        string
		comm, argv0 string
		initArg     bool // argv[0] then "init" alone
		init        bool
	}{
		{"runc", "runc:[2:INIT]", "runc", true, true},
		{"runc, argv0 a path", "runc:[2:INIT]", "/usr/bin/runc", true, true},
		{"youki", "youki:[2:INIT]", "youki", false, true},
		{"crun create", "crun", "crun", false, true},
		{"crun under CRI-O", "crun", "/usr/libexec/crio/crun", false, true},
		{"crun from its memfd, Linux 6.14+", "memfd:crun_clon", "/usr/libexec/crio/crun", false, true},
		{"crun from its memfd, older kernels", "4", "/usr/bin/crun", false, true},
		{"pilot-agent", "pilot-agent", "/usr/local/bin/pilot-agent", false, false},
		{"an app named after a number", "4", "/app/4", false, false},
		{"an app whose argv0 says crun but runs as itself", "job", "crun", false, false},
		{"crun's init ended before its exec (no argv)", "crun", "", false, true},
		{"crun's memfd copy ended before its exec", "memfd:crun_clon", "", false, true},
		{"a process named after a number, ended (no argv)", "4", "", false, false},
		{"kata-agent's init", "kata-agent", "/usr/bin/kata-agent", true, true},
		{"kata-agent's init ended before its exec (no argv)", "kata-agent", "", false, true},
		{"an app that calls itself kata-agent", "kata-agent", "/app/job", false, false},
		{"kata-agent as the VM's init", "init", "/sbin/init", true, true},
		{"an app /sbin/init", "init", "/sbin/init", false, false},
		{"an app /init init (s6-overlay's path)", "init", "/init", true, false},
		{"/sbin/init init, ended (no argv)", "init", "", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			procs := []Process{
				{PID: 1, PPID: 0, StartTime: 100, Comm: "pause", Argv0: "/pause", Cgroup: cg("aaaaaaaaaaaa"), State: "S"},
				{PID: 7, PPID: 0, StartTime: 200, Comm: "sh", Argv0: "sh", Cgroup: cg("bbbbbbbbbbbb"), State: "S"},
				{PID: 20, PPID: 0, StartTime: 300, Comm: "sidecar-supervi", Argv0: "/sidecar-supervisor", Cgroup: cg("cccccccccccc"), State: "S", UID: 1337},
				{PID: 24, PPID: 0, StartTime: 310, Comm: tt.comm, Argv0: tt.argv0, InitArg: tt.initArg, Cgroup: cg("dddddddddddd"), State: "S", UID: 1337},
			}
			pod := Classify(procs, 20, Rules{Sidecar: []string{"pilot-agent"}})
			var got *Container
			for i, c := range pod.Containers {
				if c.Main.PID == 24 {
					got = &pod.Containers[i]
				}
			}
			switch {
			case got == nil:
				t.Fatalf("no container with main process 24: %+v", pod.Containers)
			case tt.init && (got.Kind != Starting || !got.Init):
				t.Errorf("comm %q argv0 %q: kind %s (Init %v), want Starting with Init: a runtime's init, not yet started", tt.comm, tt.argv0, got.Kind, got.Init)
			case !tt.init && got.Init:
				t.Errorf("comm %q argv0 %q: taken for a runtime's init (kind %s)", tt.comm, tt.argv0, got.Kind)
			}
		})
	}
}
