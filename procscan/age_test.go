package procscan

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestUnified: the unified line names a container, also once the kernel
// marks its cgroup deleted under a zombie; the root and its absence name
// none.
func TestUnified(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"4:memory:/k8s.io/ab\n0::/k8s.io/ab", "0::/k8s.io/ab"},
		{"4:memory:/\n0::/k8s.io/ab (deleted)", "0::/k8s.io/ab"},
		{"0::/kubepods/pod1/cri-containerd-ab.scope", "0::/kubepods/pod1/cri-containerd-ab.scope"},
		{"4:memory:/\n1:cpu:/", ""},
		{"4:memory:/k8s.io/ab\n0::/", ""},
		{"", ""},
	} {
		if got := Unified(tc.in); got != tc.want {
			t.Errorf("Unified(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestAge: the boot clock and /proc's start times agree: a process
// started after this one is younger, and neither is of negative age (a
// tick of slack: start times are floored to ticks).
func TestAge(t *testing.T) {
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self, err := s.Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	child, err := s.Process(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	selfAge, err := Age(self)
	if err != nil {
		t.Fatal(err)
	}
	childAge, err := Age(child)
	if err != nil {
		t.Fatal(err)
	}
	const tick = 10 * time.Millisecond
	if childAge < -tick || childAge > selfAge+tick {
		t.Errorf("ages: child %v, its parent %v: want 0 <= child <= parent (to a tick)", childAge, selfAge)
	}
}
