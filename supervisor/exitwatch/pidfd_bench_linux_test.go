//go:build linux

package exitwatch

// Benchmarks of the pidfd watcher's two costs beyond the /proc scan (see
// procscan's benchmarks): holding an app's main process, once per app
// container at discovery, and learning of its exit, its status read from
// the pidfd or from its accounting record. Nothing here asserts a time.
//
//	go test -run '^$' -bench . ./supervisor/exitwatch

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
	cmd := helper("exit", "0")
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
	sup := probePidfd(testProbe(b, "7"))
	if !sup.ok {
		b.Skipf("no exit status through pidfds here: %s", sup.reason)
	}
	benchExits(b, testWatcher(b, Pidfd), nil)
}

// benchExits runs BenchmarkPidfdExit's loop on w, calling before (if not
// nil) untimed before each round.
func benchExits(b *testing.B, w *Watcher, before func()) {
	var fromReap, fromKill time.Duration
	for b.Loop() {
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		cmd := benchSleeper(b)
		proc, err := w.Watch(benchProcess(b, cmd.Process.Pid))
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
		st := proc.Status()
		done := time.Now()
		// Accounting may have recorded the kill before the sleeper's main
		// thread took its code: 0, read unknown (acct_linux.go).
		if st != killed(SIGKILL) && !(w.Method() == Accounting && st == acctUnknown) {
			b.Fatalf("status %v, want killed by SIGKILL", st)
		}
		proc.Close()
		fromReap += done.Sub(reaped)
		fromKill += done.Sub(kill)
	}
	b.ReportMetric(float64(fromReap.Nanoseconds())/float64(b.N), "ns/reap-to-done")
	b.ReportMetric(float64(fromKill.Nanoseconds())/float64(b.N), "ns/kill-to-done")
}

// BenchmarkAccountingExit is BenchmarkPidfdExit under the accounting
// method, the status read from the kernel's record of the exit, in a PID
// namespace of the benchmark's own (inOwnPIDNamespace), with the record
// file as full as rotation lets it grow (2,000 records before the one
// looked up). Its figures are those of that inner run.
func BenchmarkAccountingExit(b *testing.B) {
	if !inOwnPIDNamespace(b) {
		return
	}
	w, _, err := New(Config{Method: Accounting, Dir: b.TempDir(), Probe: testProbe(b, "7")})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	// Short of the rotation's size, which would empty the file.
	filler := make([]byte, 2000*acctRecordSize)
	for i := 0; i < len(filler); i += acctRecordSize {
		filler[i+1] = acctVersion
	}
	benchExits(b, w, func() {
		if err := os.WriteFile(w.acct.path(w.acct.gen), filler, 0o600); err != nil {
			b.Fatal(err)
		}
	})
}

func benchProcess(b *testing.B, pid int) Process {
	b.Helper()
	st, err := startTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	return Process{PID: pid, StartTime: st}
}
