//go:build linux

package exitwatch

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needPtrace skips unless this process may trace others.
func needPtrace(t *testing.T) {
	t.Helper()
	sup := probePtrace(testProbe(t, "7"))
	if !sup.ok {
		if os.Geteuid() == 0 {
			t.Fatalf("running as root but ptrace cannot work: %s", sup.reason)
		}
		t.Skipf("ptrace not permitted: %s", sup.reason)
	}
}

func newPtraceKernel(t *testing.T) *Watcher { return testWatcher(t, Ptrace) }

// shortProbe makes the probe judge every 20 ms, with a CPU budget of cpu
// and limit as its hang guard, for the test. The probe children the test
// starts carry PROBE_TEST=<its name> (probeChild finds its own by it),
// and any still there at its end is killed: a stopped one left behind
// would keep go test waiting on the output pipe it holds.
func shortProbe(t *testing.T, cpu, limit time.Duration) {
	tick0, cpu0, limit0 := probeTick, probeCPU, probeLimit
	probeTick, probeCPU, probeLimit = 20*time.Millisecond, cpu, limit
	t.Setenv("PROBE_TEST", t.Name())
	t.Cleanup(func() {
		probeTick, probeCPU, probeLimit = tick0, cpu0, limit0
		for _, pid := range probeChildren(t.Name()) {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
}

// probeChildren are this process's children with PROBE_TEST=name.
func probeChildren(name string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(pid)
		if err != nil || string(f[1]) != strconv.Itoa(os.Getpid()) {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if slices.Contains(strings.Split(string(env), "\x00"), "PROBE_TEST="+name) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// probeChild finds the test's probe child (shortProbe) and waits until it
// is stopped (a traced process in a group-stop reads 't', else 'T'),
// failing if the probe ends first.
func probeChild(t *testing.T, res <-chan support) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case sup := <-res:
			t.Fatalf("the probe ended before its child was seen stopped: %+v", sup)
		default:
		}
		for _, pid := range probeChildren(t.Name()) {
			if state, _, err := procStat(pid); err == nil && (state == 'T' || state == 't') {
				return pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no stopped probe child of %s within 30s", t.Name())
	return 0
}

// TestPtraceProbeWaitsForStarvedChild: a probe child that has not had the
// CPU is not a verdict, however many ticks pass (it failed the supervisor
// at 10 s on a busy node); once it runs, the probe succeeds. The child
// stops itself to stand for a node that keeps it off the CPU.
func TestPtraceProbeWaitsForStarvedChild(t *testing.T) {
	needPtrace(t)
	shortProbe(t, time.Second, time.Minute)
	t.Setenv("HELPER", "stopped")
	argv := []string{os.Args[0], "-test.run=^$", "7"}
	res := make(chan support, 1)
	go func() { res <- probePtrace(argv) }()
	pid := probeChild(t, res)
	// Twenty ticks with the child stopped: the probe must still wait. (A
	// loaded machine may run fewer of them; it cannot make the probe end.)
	select {
	case sup := <-res:
		t.Fatalf("the probe ended while its child was stopped: %+v", sup)
	case <-time.After(20 * probeTick):
	}
	if err := unix.Kill(pid, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if sup := <-res; !sup.ok {
		t.Fatalf("probe after SIGCONT: %s", sup.reason)
	}
}

// TestPtraceProbeVerdicts: the probe's ends without a status, each on what
// the kernel says of its child, each in a bounded time.
func TestPtraceProbeVerdicts(t *testing.T) {
	needPtrace(t)
	t.Run("starved past the limit", func(t *testing.T) {
		shortProbe(t, time.Second, 500*time.Millisecond)
		t.Setenv("HELPER", "stopped")
		sup := probePtrace([]string{os.Args[0], "-test.run=^$", "7"})
		if sup.ok || !strings.Contains(sup.reason, "no exit seen within 500ms, while its child had only") {
			t.Fatalf("probe: %+v, want a failure naming the limit and the child's CPU", sup)
		}
	})
	t.Run("ran and did not exit", func(t *testing.T) {
		shortProbe(t, 50*time.Millisecond, time.Minute)
		t.Setenv("HELPER", "spin")
		sup := probePtrace([]string{os.Args[0], "-test.run=^$"})
		if sup.ok || !strings.Contains(sup.reason, "of CPU in") || !strings.Contains(sup.reason, "did not exit") {
			t.Fatalf("probe: %+v, want a failure naming the child's CPU", sup)
		}
	})
}

// TestPtraceExitStatus: every way a non-child can end, read as its tracer.
func TestPtraceExitStatus(t *testing.T) {
	needPtrace(t)
	k := newPtraceKernel(t)
	tests := []struct {
		how  string
		want Status
	}{
		{"0", exited(0)},
		{"3", exited(3)},
		{"SIGKILL", killed(SIGKILL)},
		{"SIGTERM", killed(SIGTERM)},
		{"SIGINT", killed(SIGINT)},
		// os.Exit(5) from a goroutine locked to another thread.
		{"thread-exit", exited(5)},
		// The main thread ends alone; exit_group(6) comes later from
		// another: the event message at the exit stop would say 0.
		{"leader-exit", exited(6)},
		// A shell as the main process: its status is the shell's.
		{"shell", exited(4)},
	}
	for _, tt := range tests {
		t.Run(tt.how, func(t *testing.T) {
			g := startGrandchild(t, tt.how)
			proc, err := k.Watch(g.proc)
			if err != nil {
				t.Fatal(err)
			}
			defer proc.Close()
			if _, ok := proc.(*ptraceProc); !ok {
				t.Fatalf("not traced: %T %+v", proc, proc.Status())
			}
			g.end()
			if got := waitDone(t, proc); got != tt.want {
				t.Errorf("status %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPtraceSignalsUnchanged: the signals an app receives reach it exactly
// as when nobody traces it.
func TestPtraceSignalsUnchanged(t *testing.T) {
	needPtrace(t)
	k := newPtraceKernel(t)
	send := []syscall.Signal{syscall.SIGUSR1, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2, syscall.SIGCHLD}
	run := func(traced bool) ([]string, Status) {
		g := startGrandchild(t, "signals")
		var proc Proc
		if traced {
			var err error
			if proc, err = k.Watch(g.proc); err != nil {
				t.Fatal(err)
			}
			defer proc.Close()
		}
		g.waitReady(t)
		var got []string
		for _, sig := range send {
			syscall.Kill(g.proc.PID, sig)
			l, err := readLine(g.out, 10*time.Second)
			if err != nil {
				t.Fatalf("after %v: %v", sig, err)
			}
			got = append(got, l)
		}
		g.end()
		if proc == nil {
			return got, Status{}
		}
		return got, waitDone(t, proc)
	}
	plain, _ := run(false)
	traced, status := run(true)
	if !slices.Equal(plain, traced) {
		t.Errorf("signals received: untraced %q, traced %q", plain, traced)
	}
	if want := []string{"got SIGUSR1", "got SIGINT", "got SIGTERM", "got SIGHUP", "got SIGUSR2", "got SIGCHLD"}; !slices.Equal(traced, want) {
		t.Errorf("traced app received %q, want %q", traced, want)
	}
	if status != exited(0) {
		t.Errorf("status %v, want exit 0", status)
	}
}

// TestPtraceStopCont: SIGSTOP stops a traced app as it would an untraced
// one, and SIGCONT resumes it.
func TestPtraceStopCont(t *testing.T) {
	needPtrace(t)
	k := newPtraceKernel(t)
	g := startGrandchild(t, "stopcont")
	proc, err := k.Watch(g.proc)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Close()
	g.waitReady(t)
	for _, step := range []struct {
		sig   syscall.Signal
		state string
	}{{syscall.SIGSTOP, "Tt"}, {syscall.SIGCONT, "SR"}, {syscall.SIGTSTP, "Tt"}, {syscall.SIGCONT, "SR"}} {
		syscall.Kill(g.proc.PID, step.sig)
		if err := waitState(g.proc.PID, step.state); err != nil {
			t.Fatalf("after %v: %v", step.sig, err)
		}
	}
	g.end()
	if got := waitDone(t, proc); got != exited(0) {
		t.Errorf("status %v, want exit 0", got)
	}
}

// TestPtraceChildrenUntraced: the app's own children are traced by nobody
// (they could be strace'd), and its fork/exec works as usual.
func TestPtraceChildrenUntraced(t *testing.T) {
	needPtrace(t)
	k := newPtraceKernel(t)
	g := startGrandchild(t, "fork")
	proc, err := k.Watch(g.proc)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Close()
	g.end()
	for i := 0; i < 2; i++ {
		l, err := readLine(g.out, 10*time.Second)
		if err != nil || l != "child TracerPid: 0" {
			t.Errorf("child %d said %q, %v; want TracerPid 0", i, l, err)
		}
	}
	if got := waitDone(t, proc); got != exited(4) {
		t.Errorf("status %v, want exit 4", got)
	}
}

// TestPtraceTracerPid: while watched, the app's tracer is the supervisor's
// tracer thread; the real parent still reaps it (else the status would never
// come).
func TestPtraceTracerPid(t *testing.T) {
	needPtrace(t)
	k := newPtraceKernel(t)
	g := startGrandchild(t, "0")
	proc, err := k.Watch(g.proc)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Close()
	// TracerPid names the tracer *thread* (its TID): one of ours.
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.proc.PID))
	tid := ""
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "TracerPid:" {
			tid = f[1]
		}
	}
	if _, err := os.Stat("/proc/self/task/" + tid); tid == "" || tid == "0" || err != nil {
		t.Errorf("TracerPid %q is not a thread of ours", tid)
	}
	g.end()
	waitDone(t, proc)
}

// waitReady waits (bounded) for the grandchild's "ready" line.
func (g grand) waitReady(t *testing.T) {
	t.Helper()
	if l, err := readLine(g.out, 10*time.Second); err != nil || l != "ready" {
		state, _ := statState(fmt.Sprintf("/proc/%d/stat", g.proc.PID))
		t.Fatalf("child said %q, %v (its state: %s)", l, err, state)
	}
}

func readLine(r *bufio.Reader, within time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	c := make(chan res, 1)
	go func() { s, err := r.ReadString('\n'); c <- res{strings.TrimSuffix(s, "\n"), err} }()
	select {
	case x := <-c:
		return x.s, x.err
	case <-time.After(within):
		return "", fmt.Errorf("nothing within %s", within)
	}
}

// waitState waits (bounded) for /proc/PID/stat's state letter to be one
// of want. A stopped tracee shows "t" (tracing stop) where an untraced one
// shows "T"; both mean it does not run.
func waitState(pid int, want string) error {
	deadline := time.Now().Add(10 * time.Second)
	got := ""
	for time.Now().Before(deadline) {
		var err error
		if got, err = statState(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
			return err
		}
		if strings.Contains(want, got) {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	var threads []string
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, f := range tasks {
		if st, err := statState(f); err == nil {
			threads = append(threads, filepath.Base(filepath.Dir(f))+":"+st)
		}
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	return fmt.Errorf("state %s, want one of %s; threads %v; status:\n%s", got, want, threads, st)
}

// statState reads the state letter of a stat file (a process's or a thread's).
func statState(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) == 0 {
		return "", fmt.Errorf("%s: no state in %q", path, s)
	}
	return f[0], nil
}

// TestChoose is the method table.
func TestChoose(t *testing.T) {
	yes := support{ok: true}
	no := support{reason: "no PIDFD_INFO_EXIT"}
	noAcct := support{reason: "no CAP_SYS_PACCT"}
	canTrace := func() support { return support{ok: true} }
	cannot := func() support { return support{reason: "no CAP_SYS_PTRACE"} }
	tests := []struct {
		mode    Method
		pidfd   support
		acct    support
		ptrace  func() support
		want    Method
		refused bool
		reason  string
	}{
		{Auto, yes, yes, cannot, Pidfd, false, ""},
		{Auto, no, yes, canTrace, Ptrace, false, "no PIDFD_INFO_EXIT"},
		{Auto, no, yes, cannot, Accounting, false, "no PIDFD_INFO_EXIT; and ptrace: no CAP_SYS_PTRACE"},
		{Auto, no, noAcct, canTrace, Ptrace, false, "no PIDFD_INFO_EXIT"},
		{Auto, no, noAcct, cannot, None, false, "add SYS_PACCT or SYS_PTRACE"},
		{Pidfd, yes, noAcct, cannot, Pidfd, false, ""},
		{Pidfd, no, yes, canTrace, Ptrace, true, "EXIT_STATUS=pidfd cannot work here: no PIDFD_INFO_EXIT"},
		{Accounting, yes, yes, cannot, Accounting, false, ""},
		{Accounting, yes, noAcct, canTrace, Pidfd, true, "EXIT_STATUS=accounting cannot work here: no CAP_SYS_PACCT"},
		{Ptrace, yes, yes, canTrace, Ptrace, false, ""},
		{Ptrace, yes, noAcct, cannot, Pidfd, true, "EXIT_STATUS=ptrace cannot work here: no CAP_SYS_PTRACE"},
		{Ptrace, no, noAcct, cannot, None, true, "EXIT_STATUS=ptrace cannot work here: no CAP_SYS_PTRACE"},
		{None, yes, yes, canTrace, None, false, "EXIT_STATUS=none"},
	}
	for _, tt := range tests {
		c := choose(Config{Method: tt.mode, Setting: "SUPERVISOR_EXIT_STATUS"}, tt.pidfd, tt.acct, tt.ptrace)
		if (c.Refused != "") != tt.refused || c.Method != tt.want {
			t.Errorf("%s/%v: %+v; want %q (refused %v)", tt.mode, tt.pidfd.ok, c, tt.want, tt.refused)
			continue
		}
		text := c.Reason
		if tt.refused {
			text = c.Refused
		}
		if !strings.Contains(text, tt.reason) {
			t.Errorf("%s/%v: %q does not say %q", tt.mode, tt.pidfd.ok, text, tt.reason)
		}
	}
	// ptrace refused, then auto's turn: its probe (a child traced) runs once.
	probes := 0
	choose(Config{Method: Ptrace}, no, noAcct, func() support { probes++; return cannot() })
	if probes != 1 {
		t.Errorf("ptrace probed %d times, want once", probes)
	}
}

// TestNew: New chooses as the kernel allows.
func TestNew(t *testing.T) {
	w, c, err := New(Config{Method: Auto, Probe: testProbe(t, "7"), Setting: "SUPERVISOR_EXIT_STATUS"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	t.Logf("auto chose %s (%s)", c.Method, c.Reason)
	if w.Method() != c.Method || c.Method == Auto {
		t.Errorf("watcher method %s, choice %s", w.Method(), c.Method)
	}
	n, c, err := New(Config{Method: None, Setting: "SUPERVISOR_EXIT_STATUS"})
	if err != nil || c.Method != None || c.Reason != "SUPERVISOR_EXIT_STATUS=none" {
		t.Fatalf("none: %+v, %v", c, err)
	}
	n.Close()
}

// TestPtraceZombie: an app that has exited but is not yet reaped (a
// zombie, as a container's main process is for a moment before its runtime
// reaps it) is refused by the kernel with EPERM. The watcher says it exited
// before it could be traced, not that a permission is missing: seen on the
// cluster for an app of milliseconds, "ptrace refused (operation not
// permitted)", which sent a reader after capabilities the pod had. The
// zombie is the child of a shell that has exec'd sleep, which never reaps
// it (a child of the test would be reaped by the tracer's wait, and the
// shell reaps its jobs): cat, held on a FIFO until the exec is done.
func TestPtraceZombie(t *testing.T) {
	needPtrace(t)
	w := newPtraceKernel(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `cat "$0" >/dev/null & echo $!; exec sleep 600`, fifo)
	line := startFirstLine(t, cmd, "the zombie's pid")
	pid, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("pid %q: %v", line, err)
	}
	// The shell is sleep now: then let cat end.
	deadline := time.Now().Add(10 * time.Second)
	for {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shell is %q, not sleep, after 10 s", comm)
		}
		time.Sleep(time.Millisecond)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	wr, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	wr.Close()
	// A zombie once its pidfd polls readable: an event, bounded.
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 10_000); err != nil || n != 1 {
		t.Fatalf("the shell's child did not exit within 10 s: %d, %v", n, err)
	}
	st, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := w.Watch(Process{PID: pid, StartTime: st})
	if err != nil {
		t.Fatalf("Watch of a zombie: %v, want a process whose status is unknown", err)
	}
	select {
	case <-proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the zombie's exit was not reported within 10 s")
	}
	want := "ptrace refused (it exited before it could be traced)"
	if s := proc.Status(); s.Known || s.Reason != want {
		t.Errorf("status %+v, want unknown: %q", s, want)
	}
}

// TestPtraceAlreadyTraced: a process another tracer holds (a debugger's,
// strace's) is refused with EPERM. The status is unknown, and its reason
// names the tracer, not a permission: the supervisor has CAP_SYS_PTRACE
// whenever it uses ptrace.
func TestPtraceAlreadyTraced(t *testing.T) {
	needPtrace(t)
	w := newPtraceKernel(t)
	g, end := grandchild(t, "0")
	cmd := helper("tracer", strconv.Itoa(g.PID))
	if line := startFirstLine(t, cmd, "the other tracer's word"); line != "traced" {
		t.Fatalf("the other tracer: %q", line)
	}
	proc, err := w.Watch(g)
	if err != nil {
		t.Fatalf("Watch of a traced process: %v, want a process whose status is unknown", err)
	}
	end()
	s := waitDone(t, proc)
	want := fmt.Sprintf("ptrace refused (already traced by PID %d ", cmd.Process.Pid)
	if s.Known || !strings.HasPrefix(s.Reason, want) {
		t.Errorf("status %+v, want unknown: %q…", s, want)
	}
}
