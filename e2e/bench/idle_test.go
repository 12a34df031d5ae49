package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestIdle runs the idle program with 3 arguments: it exits 0 leaving 3
// children named idle, asleep in pause(2), which this test (their
// subreaper) then kills and reaps.
func TestIdle(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("the idle program is x86-64 machine code; this is %s", runtime.GOARCH)
	}
	path := filepath.Join(t.TempDir(), "idle")
	if err := writeIdle(path); err != nil {
		t.Fatal(err)
	}
	// Its children, orphaned when it exits, come back to this process.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	// No output: the children would hold a pipe open, and Output wait
	// for them.
	if err := exec.Command(path, "a", "b", "c").Run(); err != nil {
		t.Fatalf("idle a b c: %v", err)
	}
	var kids []int
	deadline := time.Now().Add(10 * time.Second)
	for len(kids) < 3 && time.Now().Before(deadline) {
		kids = kids[:0]
		// Adopted by any of this process's threads.
		files, _ := filepath.Glob("/proc/self/task/*/children")
		for _, file := range files {
			b, _ := os.ReadFile(file)
			for _, f := range strings.Fields(string(b)) {
				pid, _ := strconv.Atoi(f)
				comm, _ := os.ReadFile("/proc/" + f + "/comm")
				if strings.TrimSpace(string(comm)) == "idle" {
					kids = append(kids, pid)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer func() {
		for _, pid := range kids {
			syscall.Kill(pid, syscall.SIGKILL)
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, 0, nil)
		}
	}()
	if len(kids) != 3 {
		t.Fatalf("%d idle children, want 3", len(kids))
	}
	// A child reads "R" until it has gone into pause(2): a 10 s bound for
	// each to get there, a hang guard only.
	for _, pid := range kids {
		if state, stat := waitAsleep(t, pid, 10*time.Second); state != "S" {
			t.Errorf("child %d: stat %q, want asleep (S)", pid, stat)
		}
	}
}

// waitAsleep reads /proc/PID/stat until the state is S (an interruptible
// sleep, as in pause(2)) or bound has passed, and returns the last state
// and stat line.
func waitAsleep(t *testing.T, pid int, bound time.Duration) (state, stat string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		stat = string(b)
		// The state follows the comm, which may hold spaces: after the last ')'.
		if f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:]); len(f) > 0 {
			state = f[0]
		}
		if state == "S" || time.Now().After(deadline) {
			return state, stat
		}
		time.Sleep(10 * time.Millisecond)
	}
}
