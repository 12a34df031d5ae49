//go:build linux

package exitwatch

// Benchmarks of the pidfd watcher's two costs beyond the /proc scan (see
// procscan's benchmarks): holding an app's main process, once per app
// container at discovery, and learning of its exit. Nothing here asserts a
// time.
//
//	go test -run '^$' -bench . ./supervisor

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// benchSleeper starts a process that runs until killed: the test binary in
// its HELPER=exit mode, which waits for its stdin to close.
func benchSleeper(b *testing.B) *exec.Cmd {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "0")
	cmd.Env = append(os.Environ(), "HELPER=exit")
	if _, err := cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

// BenchmarkPidfdOpen: holding one app's main process as discovery does
// (pidfd_open, the start-time re-read against PID reuse, EPOLL_CTL_ADD),
// then letting it go.
func BenchmarkPidfdOpen(b *testing.B) {
	k := testWatcher(b, Pidfd)
	cmd := benchSleeper(b)
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	p := benchProcess(b, cmd.Process.Pid)
	for b.Loop() {
		proc, err := k.Watch(p)
		if err != nil {
			b.Fatal(err)
		}
		proc.Close()
	}
}

// BenchmarkPidfdExit: a held process is killed and reaped by its parent
// (here the benchmark, as the container runtime's shim in a pod); the
// epoll loop then reads its status (PIDFD_INFO_EXIT). ns/op includes
// starting the process; the figures are the custom metrics:
//
//	ns/reap-to-done  from the parent's wait returning to Done
//	ns/kill-to-done  from the SIGKILL to Done (the kernel's exit included)
func BenchmarkPidfdExit(b *testing.B) {
	sup, err := probePidfd(testProbe(b, "7"))
	if err != nil {
		b.Fatal(err)
	}
	if !sup.ok {
		b.Skipf("no exit status through pidfds here: %s", sup.reason)
	}
	k := testWatcher(b, Pidfd)
	var fromReap, fromKill time.Duration
	for b.Loop() {
		cmd := benchSleeper(b)
		proc, err := k.Watch(benchProcess(b, cmd.Process.Pid))
		if err != nil {
			b.Fatal(err)
		}
		kill := time.Now()
		cmd.Process.Kill()
		cmd.Wait()
		reaped := time.Now()
		select {
		case <-proc.Done():
		case <-time.After(10 * time.Second):
			b.Fatal("no exit seen within 10s")
		}
		done := time.Now()
		if st := proc.Status(); !st.Known || st.Signal != SIGKILL {
			b.Fatalf("status %v, want killed by SIGKILL", st)
		}
		proc.Close()
		fromReap += done.Sub(reaped)
		fromKill += done.Sub(kill)
	}
	b.ReportMetric(float64(fromReap.Nanoseconds())/float64(b.N), "ns/reap-to-done")
	b.ReportMetric(float64(fromKill.Nanoseconds())/float64(b.N), "ns/kill-to-done")
}

func benchProcess(b *testing.B, pid int) Process {
	b.Helper()
	st, err := startTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	return Process{PID: pid, StartTime: st}
}
