//go:build linux

package exitwatch

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPidfdExitStatus watches processes that are not its children exit in
// every way, and reads each status from the kernel.
func TestPidfdExitStatus(t *testing.T) {
	sup := probe(t)
	if !sup.ExitInfo {
		t.Skipf("kernel has no PIDFD_INFO_EXIT (%s): needs Linux 6.15+", sup.Reason)
	}
	k := newKernel(t, true)
	tests := []struct {
		end  string
		want Status
	}{
		{"0", exited(0)},
		{"3", exited(3)},
		{"255", exited(255)},
		{"SIGKILL", killed(SIGKILL)},
		{"SIGTERM", killed(SIGTERM)},
		{"SIGINT", killed(SIGINT)}, // the Go runtime re-raises it with the default action
	}
	for _, tt := range tests {
		t.Run(tt.end, func(t *testing.T) {
			p, end := grandchild(t, tt.end)
			proc, err := k.Watch(p)
			if err != nil {
				t.Fatal(err)
			}
			defer proc.Close()
			select {
			case <-proc.Done():
				t.Fatal("done before the process ended")
			case <-time.After(20 * time.Millisecond):
			}
			end()
			if got := waitDone(t, proc); got != tt.want {
				t.Errorf("status = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPidfdManyAtOnce: one epoll loop serves many watched processes.
func TestPidfdManyAtOnce(t *testing.T) {
	sup := probe(t)
	k := newKernel(t, sup.ExitInfo)
	const n = 20
	var procs []Proc
	var ends []func()
	for i := 0; i < n; i++ {
		p, end := grandchild(t, strconv.Itoa(i))
		proc, err := k.Watch(p)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, proc)
		ends = append(ends, end)
	}
	for i := n - 1; i >= 0; i-- {
		ends[i]()
	}
	for i, p := range procs {
		got := waitDone(t, p)
		if sup.ExitInfo && got != exited(i) {
			t.Errorf("proc %d: status %v, want exit %d", i, got, i)
		}
		if !sup.ExitInfo && got.Known {
			t.Errorf("proc %d: status %v known without exit info", i, got)
		}
	}
}

// TestPidfdWithoutExitInfo: with the method "none" an exit is still seen,
// and its status is unknown, never success.
func TestPidfdWithoutExitInfo(t *testing.T) {
	k := newKernel(t, false)
	p, end := grandchild(t, "0")
	proc, err := k.Watch(p)
	if err != nil {
		t.Fatal(err)
	}
	end()
	got := waitDone(t, proc)
	if got.Known || got.Success() || got.Reason == "" {
		t.Errorf("status = %+v, want unknown with a reason", got)
	}
	if k.Method() != "none" {
		t.Errorf("Method() = %q", k.Method())
	}
}

// TestPidfdSignal: a signal through the pidfd reaches the process, and a
// process that is gone answers ErrGone.
func TestPidfdSignal(t *testing.T) {
	sup := probe(t)
	k := newKernel(t, sup.ExitInfo)
	p, _ := grandchild(t, "0")
	proc, err := k.Track(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Signal(SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitDone(t, proc)
	// Reaped by its parent shortly after: then the pidfd says ESRCH.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err = proc.Signal(SIGTERM)
		if errors.Is(err, ErrGone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Signal after exit = %v, want ErrGone", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPidfdReuse: a scanned process whose PID now belongs to another (a
// different start time) is refused as gone, and one already reaped too.
func TestPidfdReuse(t *testing.T) {
	k := newKernel(t, false)
	p, end := grandchild(t, "0")
	stale := p
	stale.StartTime--
	if _, err := k.Watch(stale); !errors.Is(err, ErrGone) {
		t.Errorf("Open with another start time = %v, want ErrGone", err)
	}
	proc, err := k.Watch(p)
	if err != nil {
		t.Fatal(err)
	}
	end()
	waitDone(t, proc)
	proc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := k.Watch(p)
		if errors.Is(err, ErrGone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Open of a reaped process = %v, want ErrGone", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProbePidfd runs the probe against this kernel and a target with the
// wrong exit code.
func TestProbePidfd(t *testing.T) {
	sup := probe(t)
	t.Logf("this kernel: exit info %v (%s)", sup.ExitInfo, sup.Reason)
	if !sup.ExitInfo && sup.Reason == "" {
		t.Error("no exit info and no reason")
	}
	// A probe that fails says why, and leaves pidfd without statuses:
	// auto then goes on to the other methods.
	for _, tt := range []struct {
		argv []string
		want string
	}{
		{testProbe(t, "3"), "exit probe " + testProbe(t, "3")[0] + ": want exit status 7, got exit status 3"},
		{[]string{"/nonexistent/probe"}, "start exit probe /nonexistent/probe: "},
	} {
		if sup := probePidfd(tt.argv); sup.ok || !strings.HasPrefix(sup.reason, tt.want) {
			t.Errorf("probe %q: %+v, want not ok, the reason starting %q", tt.argv, sup, tt.want)
		}
	}
	// One that does not exit within probeLimit is killed.
	defer func(l time.Duration) { probeLimit = l }(probeLimit)
	probeLimit = 100 * time.Millisecond
	if sup := probePidfd([]string{"/bin/sleep", "60"}); sup.ok || !strings.Contains(sup.reason, "did not exit within 100ms") {
		t.Errorf("a probe that does not exit: %+v", sup)
	}
}

// TestNoPidfdSaysWhy: where pidfd_open does not exist (Linux before 5.3,
// gVisor before release-20260504.0; here a seccomp filter fails it with
// ENOSYS), the supervisor's start-up error names the call, what it needs,
// and the kernel it found.
func TestNoPidfdSaysWhy(t *testing.T) {
	cmd := helper("nopidfd")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"pidfd_open: function not implemented (the supervisor needs Linux 5.3 or later, or gVisor release-20260504.0 or later",
		"this kernel is " + unix.ByteSliceToString(u.Release[:]) + " ",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("checkPidfd under a filter that denies pidfd_open said %q, want it to hold %q", out, want)
		}
	}
}
