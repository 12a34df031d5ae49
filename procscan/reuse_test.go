//go:build linux

package procscan_test

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// TestPIDReuse recycles a real PID between the scan and the action: a
// process is scanned (and one pidfd opened on it, as the supervisor holds
// an app or a sidecar), it exits, and another process gets its PID
// (written into /proc/sys/kernel/ns_last_pid, which needs root, as a PID
// wrap-around would). The newcomer has another start time, so:
//
//   - procscan's StartTime says so;
//   - the supervisor's pidfd kernel refuses to hold the stale process
//     (ErrGone, "recycled"): it cannot be signalled by PID;
//   - the pidfd opened before the reuse still names the dead process:
//     signalling through it fails with ErrGone, and the newcomer gets
//     nothing.
//
// Start times count clock ticks (10ms), so the newcomer is started a tick
// later at least; a reuse within one tick needs the whole PID space to wrap
// in 10ms, or CAP_SYS_ADMIN in the pod (SECURITY.md).
func TestPIDReuse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: writes /proc/sys/kernel/ns_last_pid to recycle a PID")
	}
	s, err := procscan.NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	k, _, err := exitwatch.New(exitwatch.Config{Method: exitwatch.None})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()

	// Each round makes a process to recycle; its PID is then written back
	// into ns_last_pid until a newcomer gets it. Another task may take it
	// first, for good (a thread the Go runtime starts meanwhile: a guest on
	// 7.2 never got it back in 200 tries): the next round tries another.
	var (
		pid     int
		scanned procscan.Process
		held    exitwatch.Proc
		reuser  *exec.Cmd
	)
	for round := 0; round < 20 && reuser == nil; round++ {
		old := exec.Command("sleep", "60")
		if err := old.Start(); err != nil {
			t.Fatal(err)
		}
		pid = old.Process.Pid
		if scanned, err = s.Process(pid); err != nil {
			t.Fatal(err)
		}
		if held, err = k.Track(exitwatch.Process{PID: scanned.PID, StartTime: scanned.StartTime}); err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		// Let a clock tick pass, so that the newcomer's start time differs.
		time.Sleep(30 * time.Millisecond)
		old.Process.Kill()
		old.Wait()
		for try := 0; try < 10; try++ {
			if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
				t.Fatalf("recycle pid %d: %v", pid, err)
			}
			c := exec.Command("sleep", "60")
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			if c.Process.Pid == pid {
				reuser = c
				break
			}
			c.Process.Kill()
			c.Wait()
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				break // taken by another task: another round
			}
		}
	}
	if reuser == nil {
		t.Fatalf("no PID handed out again in 20 rounds (the last, %d)", pid)
	}
	defer func() { reuser.Process.Kill(); reuser.Wait() }()

	st, err := s.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if st == scanned.StartTime {
		t.Fatalf("pid %d: the newcomer has the old start time %d", pid, st)
	}
	if _, err := k.Track(exitwatch.Process{PID: scanned.PID, StartTime: scanned.StartTime}); !errors.Is(err, exitwatch.ErrGone) {
		t.Errorf("Open of the scanned process after its PID was recycled = %v, want ErrGone", err)
	}
	if err := held.Signal(exitwatch.SIGTERM); !errors.Is(err, exitwatch.ErrGone) {
		t.Errorf("Signal through the old pidfd = %v, want ErrGone", err)
	}
	// The newcomer is untouched: no SIGTERM reached it.
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 300); n != 0 {
		t.Errorf("the process that reused pid %d exited: it was signalled", pid)
	}
	if err := reuser.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("newcomer: %v", err)
	}
}
