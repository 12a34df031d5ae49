package procscan

import (
	"os/exec"
	"testing"
)

// TestLastPID: the last field of /proc/loadavg moves when a process is
// made.
func TestLastPID(t *testing.T) {
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.LastPID()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	after, err := s.LastPID()
	if err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Errorf("last PID %d before, %d after starting PID %d", before, after, cmd.Process.Pid)
	}
	for _, bad := range []string{"", "0.1 0.2 0.3 1/80", "0.1 0.2 0.3 1/80 x", "0.1 0.2 0.3 180 7"} {
		if _, err := parseLastPID(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if n, err := parseLastPID("0.20 0.18 0.12 1/80 11206\n"); err != nil || n != 11206 {
		t.Errorf("got %d, %v", n, err)
	}
}

// BenchmarkLastPID: the cost of one look at the kernel's last PID, made
// every 2 ms while the apps are looked for.
func BenchmarkLastPID(b *testing.B) {
	s, err := NewScanner("/proc")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.LastPID(); err != nil {
			b.Fatal(err)
		}
	}
}
