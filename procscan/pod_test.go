package procscan

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// scanFixture scans testdata/tree (see scanKept): the pod, where each
// process went, and the supervisor's PID there.
func scanFixture(t *testing.T, tree string) (Pod, map[string][]Process, int) {
	t.Helper()
	s, err := NewScanner("testdata/" + tree)
	if err != nil {
		t.Fatal(err)
	}
	self, err := s.Self()
	if err != nil {
		t.Fatal(err)
	}
	pod, _, members := scanKept(t, s, self, Rules{Sidecar: []string{"pilot-agent"}})
	return pod, members, self
}

// summary is a container as the tests compare it: kind, name, main PID and
// the PIDs of all its processes (where the builder placed them: members,
// from classifyKept; the pod keeps one, and the count).
type summary struct {
	Kind  string
	Name  string
	Main  int
	PIDs  []int
	Stray []int
}

func summarize(p Pod, members map[string][]Process) []summary {
	var out []summary
	for _, c := range p.Containers {
		s := summary{Kind: c.Kind.String(), Name: c.Name}
		if c.HasMain {
			s.Main = c.Main.PID
		}
		for _, p := range members[c.ID] {
			s.PIDs = append(s.PIDs, p.PID)
		}
		for _, p := range c.Stray {
			s.Stray = append(s.Stray, p.PID)
		}
		out = append(out, s)
	}
	return out
}

func TestClassifyFixtures(t *testing.T) {
	tests := []struct {
		tree    string
		want    []summary
		outside bool
	}{
		{
			// Kernel thread 2 and vanished pid 77 are left out; the zombie
			// (40), the exec'd shell (90, PPID 0 but started later) and a
			// child named pilot-agent (81) stay in the app container, whose
			// main process is 13.
			tree: "v2",
			want: []summary{
				{Kind: "pause", Name: "ffeeddccbbaa", Main: 1, PIDs: []int{1}},
				{Kind: "sidecar", Name: "7d2c5f1a9be0", Main: 7, PIDs: []int{7, 20}},
				{Kind: "app", Name: "3a1f0e9d8c7b", Main: 13, PIDs: []int{13, 30, 40, 81, 90}, Stray: []int{81}},
				{Kind: "self", Name: "/", Main: 25, PIDs: []int{25}},
				{Kind: "app", Name: "0b1c2d3e4f5a", Main: 50, PIDs: []int{50}},
			},
			outside: true,
		},
		{
			tree: "v1-hybrid",
			want: []summary{
				{Kind: "pause", Name: "ffeeddccbbaa", Main: 1, PIDs: []int{1}},
				{Kind: "sidecar", Name: "7d2c5f1a9be0", Main: 6, PIDs: []int{6, 9}},
				{Kind: "app", Name: "3a1f0e9d8c7b", Main: 12, PIDs: []int{12}},
				{Kind: "self", Name: "0b1c2d3e4f5a", Main: 15, PIDs: []int{15}},
			},
			outside: true,
		},
		{
			// shareProcessNamespace off: PID 1 is the supervisor itself.
			tree:    "unshared",
			want:    []summary{{Kind: "self", Name: "/", Main: 1, PIDs: []int{1}}},
			outside: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.tree, func(t *testing.T) {
			pod, members, _ := scanFixture(t, tt.tree)
			if diff := cmp.Diff(tt.want, summarize(pod, members)); diff != "" {
				t.Errorf("containers (-want +got):\n%s", diff)
			}
			if got := pod.Outside(); got != tt.outside {
				t.Errorf("Outside() = %v, want %v", got, tt.outside)
			}
		})
	}
}

func TestProcessFields(t *testing.T) {
	s, err := NewScanner("testdata/v2")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		pid  int
		want Process
		name string
	}{
		{pid: 50, name: "my (odd) app", want: Process{
			PID: 50, PPID: 0, StartTime: 260, Comm: "my (odd) app", State: "S",
			Argv0:  "/opt/my (odd) app",
			Cgroup: "0::/../0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c",
		}},
		{pid: 40, name: "sh", want: Process{
			PID: 40, PPID: 13, StartTime: 250, Comm: "sh", State: "Z", Exiting: true,
			Cgroup: "0::/../3a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a19",
		}},
		{pid: 7, name: "pilot-agent", want: Process{
			PID: 7, PPID: 0, StartTime: 200, Comm: "pilot-agent", State: "S",
			Argv0:  "/usr/local/bin/pilot-agent",
			Cgroup: "0::/../7d2c5f1a9be04c3d8e6f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d",
		}},
	}
	for _, tt := range tests {
		got, err := s.Process(tt.pid)
		if err != nil {
			t.Fatalf("Process(%d): %v", tt.pid, err)
		}
		got.UID = 0 // the fixture's owner is whoever checked it out
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("Process(%d) (-want +got):\n%s", tt.pid, diff)
		}
		if got.Name() != tt.name {
			t.Errorf("Process(%d).Name() = %q, want %q", tt.pid, got.Name(), tt.name)
		}
	}
	for _, pid := range []int{77, 4242} {
		if _, err := s.Process(pid); !errors.Is(err, ErrGone) {
			t.Errorf("Process(%d) = %v, want ErrGone", pid, err)
		}
	}
	if _, err := s.Process(2); !errors.Is(err, ErrGone) {
		t.Errorf("Process(2) (kernel thread) = %v, want ErrGone", err)
	}
}

func TestMatches(t *testing.T) {
	tests := []struct {
		p     Process
		names []string
		want  bool
	}{
		{Process{Comm: "pilot-agent", Argv0: "/usr/local/bin/pilot-agent"}, []string{"pilot-agent"}, true},
		// argv[0] rewritten to something else: comm still counts.
		{Process{Comm: "pilot-agent", Argv0: "agent: main"}, []string{"pilot-agent"}, true},
		// comm changed with prctl(PR_SET_NAME): argv[0] still counts.
		{Process{Comm: "worker", Argv0: "/bin/pilot-agent"}, []string{"pilot-agent"}, true},
		{Process{Comm: "pilot-agent-x", Argv0: "/bin/pilot-agent-x"}, []string{"pilot-agent"}, false},
		// A zombie has no argv; its truncated comm matches a long name.
		{Process{Comm: "cloud-sql-proxy"}, []string{"cloud-sql-proxy-v2"}, true},
		{Process{Comm: "sh"}, []string{"", "pilot-agent"}, false},
		{Process{Comm: "x"}, nil, false},
	}
	for _, tt := range tests {
		if got := tt.p.Matches(tt.names); got != tt.want {
			t.Errorf("%+v.Matches(%q) = %v, want %v", tt.p, tt.names, got, tt.want)
		}
	}
}

func TestContainerName(t *testing.T) {
	id := strings.Repeat("ab", 32)
	tests := []struct{ cgroup, want string }{
		{"0::/", "/"},
		{"0::/../app", "app"},
		{"0::/kubepods/besteffort/pod1/" + id, "abababababab"},
		{"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope", "abababababab"},
		{"12:pids:/kubepods/pod1/" + id + "\n1:name=systemd:/kubepods/pod1/" + id + "\n0::/", "abababababab"},
		{"0::/../../podsim-1/sidecar", "sidecar"},
		{"", "/"},
	}
	for _, tt := range tests {
		if got := containerName(tt.cgroup); got != tt.want {
			t.Errorf("containerName(%q) = %q, want %q", tt.cgroup, got, tt.want)
		}
	}
}

// TestRealProc reads this machine's /proc: our own process and a child must
// be found with the right parentage, in the same container.
func TestRealProc(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self, err := s.Self()
	if err != nil {
		t.Fatal(err)
	}
	if self != os.Getpid() {
		t.Fatalf("Self() = %d, want %d", self, os.Getpid())
	}
	procs, err := s.Processes()
	if err != nil {
		t.Fatal(err)
	}
	var me, child *Process
	for i := range procs {
		switch procs[i].PID {
		case self:
			me = &procs[i]
		case cmd.Process.Pid:
			child = &procs[i]
		}
	}
	if me == nil || child == nil {
		t.Fatalf("self %d or child %d missing from %d processes", self, cmd.Process.Pid, len(procs))
	}
	if child.PPID != self || child.Comm != "sleep" || child.Cgroup != me.Cgroup || child.UID != os.Geteuid() {
		t.Errorf("child = %+v; want PPID %d, comm sleep, cgroup %q, uid %d", *child, self, me.Cgroup, os.Geteuid())
	}
	st, err := s.StartTime(child.PID)
	if err != nil || st != child.StartTime {
		t.Errorf("StartTime(%d) = %d, %v; want %d", child.PID, st, err, child.StartTime)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := s.StartTime(child.PID); !errors.Is(err, ErrGone) {
		t.Errorf("StartTime of reaped pid %s = %v, want ErrGone", strconv.Itoa(child.PID), err)
	}
}
