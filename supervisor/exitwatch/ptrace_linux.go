//go:build linux

package exitwatch

// The ptrace method reads an app's exit status on any kernel, as its
// tracer: PTRACE_SEIZE (3.4) with PTRACE_O_TRACEEXIT, and the final wait4
// status of the traced main thread, which the kernel reports to the tracer
// before the real parent may reap it. It needs CAP_SYS_PTRACE (Pod Security
// "privileged"), and a process can have only one tracer: a traced app
// cannot be strace'd or gdb'd while the supervisor watches it.
//
// The app must behave exactly as without us. Only its main thread is
// seized (not its other threads, not its children: no TRACEFORK/CLONE
// options), and every stop is resumed at once:
//
//   - signal-delivery-stop: the signal is re-injected with PTRACE_CONT(sig);
//   - group-stop (SIGSTOP/TSTP/TTIN/TTOU), reported under SEIZE as
//     PTRACE_EVENT_STOP: PTRACE_LISTEN, so it stays stopped as it should
//     and a later SIGCONT resumes it;
//   - PTRACE_EVENT_EXIT: PTRACE_CONT, so the exit completes.
//
// The status is the final wait4 one, not PTRACE_GETEVENTMSG at the exit
// stop: when the main thread exits before another thread calls
// exit_group(6), the event message says 0 and the final status says 6.
//
// All ptrace requests come from one goroutine locked to its OS thread: the
// kernel ties tracees to the tracer thread. It learns of stops through
// SIGCHLD (sent to a tracer on every tracee stop and exit) and then drains
// wait4(WNOHANG) until nothing is left, so no stop is ever left waiting.
// If the supervisor dies, the kernel detaches the tracees and they go on.

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// capSysPtrace is CAP_SYS_PTRACE's bit in CapEff.
const capSysPtrace = 19

// The probe's child needs a few milliseconds of CPU to exit once its stdin
// closes, but a busy node can keep it off the CPU far longer: the
// supervisor's container asks for 5m of CPU, the smallest share there is.
// On the e2e cluster, with every case's pods starting at once, a probe
// that allowed 10 s in all failed while its child had not yet run, and
// SUPERVISOR_EXIT_STATUS=ptrace then ended the supervisor, leaving
// istio-proxy to run on. So a probe ends without the status only on what
// the kernel says of the child at each probeTick: it was reaped and the
// tracer, drained once more, has no status for it, or it had probeCPU of
// CPU time and did not exit. A child that is alive and has hardly run, or
// is still exiting (a zombie main thread whose other threads have yet to
// end), is waited for, up to probeLimit, a hang guard. Variables for the
// tests.
var (
	probeTick  = 10 * time.Second
	probeCPU   = time.Second
	probeLimit = 2 * time.Minute
)

// probePtrace checks whether the ptrace method can work here, by real
// calls: the capability, Yama's scope, then a seize of a child of ours
// (argv: a process that exits with code 7 when its stdin closes), whose
// status must come back through the tracer as 7.
func probePtrace(argv []string) support {
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && len(b) > 0 && b[0] == '3' {
		return support{reason: "ptrace is disabled on this node (kernel.yama.ptrace_scope=3)"}
	}
	if !hasCap(capSysPtrace) {
		return support{reason: "no CAP_SYS_PTRACE: add SYS_PTRACE to the container's capabilities, and run it as root (capabilities of non-root containers are not effective)"}
	}
	t, err := newTracer()
	if err != nil {
		return support{reason: err.Error()}
	}
	defer t.close()
	if err := t.probe(argv); err != nil {
		return support{reason: err.Error()}
	}
	return support{ok: true}
}

// hasCap reads the effective capability set of this process.
func hasCap(bit uint) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[bit/32].Effective&(1<<(bit%32)) != 0
}

// ptraceProc is an app watched by the tracer; signals still go through
// the pidfd.
type ptraceProc struct {
	Proc
	once   sync.Once
	done   chan struct{}
	status Status
}

func (p *ptraceProc) Done() <-chan struct{} { return p.done }
func (p *ptraceProc) Status() Status        { return p.status }
func (p *ptraceProc) finish(s Status) {
	p.once.Do(func() { p.status = s; close(p.done) })
}

// unknownProc is an app whose exit is seen but whose status cannot be read.
type unknownProc struct {
	Proc
	reason string
}

func (p *unknownProc) Status() Status { return Status{Reason: p.reason} }

// tracer owns the thread all ptrace calls come from.
type tracer struct {
	reqs     chan func()
	quit     chan struct{}
	loopDone chan struct{}
	tracees  map[int]*ptraceProc // only touched on the tracer thread
	// probed collects the probe child's status (tracer thread).
	probed map[int]chan Status
}

func newTracer() (*tracer, error) {
	t := &tracer{reqs: make(chan func()), quit: make(chan struct{}), loopDone: make(chan struct{}),
		tracees: map[int]*ptraceProc{}, probed: map[int]chan Status{}}
	go t.loop()
	return t, nil
}

// do runs f on the tracer thread and waits for it.
func (t *tracer) do(f func()) {
	done := make(chan struct{})
	select {
	case t.reqs <- func() { f(); close(done) }:
		<-done
	case <-t.loopDone:
	}
}

func (t *tracer) loop() {
	runtime.LockOSThread()
	// Never unlocked: the thread is the tracer of every tracee and must
	// stay the goroutine's until the end.
	defer close(t.loopDone)
	// SIGCHLD tells of every tracee stop; the channel may coalesce several,
	// which is fine since each wake-up drains every pending event.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)
	for {
		t.drain()
		select {
		case f := <-t.reqs:
			f()
		case <-chld:
		case <-t.quit:
			return
		}
	}
}

// seize attaches to pid's main thread on the tracer thread.
func (t *tracer) seize(pid int, pp *ptraceProc) error {
	var err error
	t.do(func() {
		_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, unix.PTRACE_O_TRACEEXIT, 0, 0)
		if errno != 0 {
			err = errno
			return
		}
		t.tracees[pid] = pp
	})
	return err
}

// release stops tracing pid: interrupt it, then detach at the stop.
func (t *tracer) release(pid int) {
	t.do(func() {
		delete(t.tracees, pid)
		if unix.PtraceInterrupt(pid) != nil {
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err == nil && ws.Stopped() {
			unix.PtraceDetach(pid)
		}
	})
}

// drain handles every pending tracee event.
func (t *tracer) drain() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		t.handle(pid, ws)
	}
}

func (t *tracer) handle(pid int, ws unix.WaitStatus) {
	if ws.Exited() || ws.Signaled() {
		s := decodeWaitStatus(uint32(ws))
		if pp := t.tracees[pid]; pp != nil {
			delete(t.tracees, pid)
			pp.finish(s)
		}
		if ch := t.probed[pid]; ch != nil {
			delete(t.probed, pid)
			ch <- s
		}
		return
	}
	if !ws.Stopped() {
		return
	}
	// Errors are ignored: the only one possible is ESRCH, a tracee killed
	// meanwhile (SIGKILL needs no resume), whose final status still comes
	// through wait4.
	switch event, sig := uint32(ws)>>16, ws.StopSignal(); event {
	case unix.PTRACE_EVENT_EXIT:
		unix.PtraceCont(pid, 0)
	case unix.PTRACE_EVENT_STOP:
		switch sig {
		case unix.SIGSTOP, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU:
			// A group-stop: keep it stopped, but let SIGCONT through.
			unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_LISTEN, uintptr(pid), 0, 0, 0, 0)
		default:
			unix.PtraceCont(pid, 0)
		}
	case 0:
		// A signal-delivery-stop: deliver the signal as if we were not here.
		unix.PtraceCont(pid, int(sig))
	default:
		unix.PtraceCont(pid, 0)
	}
}

// probe runs argv as a child, seizes it, lets it exit and checks the
// status comes back through the tracer.
func (t *tracer) probe(argv []string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	var perr error
	var ch chan Status
	pid := 0
	t.do(func() {
		// Started on the tracer thread: it is then our child and tracee
		// both, and wait4 on this thread collects it.
		proc, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Files: []*os.File{r, os.Stderr, os.Stderr}})
		if err != nil {
			perr = fmt.Errorf("start ptrace probe: %w", err)
			return
		}
		_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(proc.Pid), 0, unix.PTRACE_O_TRACEEXIT, 0, 0)
		if errno != 0 {
			proc.Kill()
			perr = fmt.Errorf("PTRACE_SEIZE: %w (blocked by seccomp, or not permitted)", errno)
			// Reap it here; it is not ours to leave behind.
			var ws unix.WaitStatus
			unix.Wait4(proc.Pid, &ws, 0, nil)
			return
		}
		pid = proc.Pid
		ch = make(chan Status, 1)
		t.probed[pid] = ch
	})
	w.Close()
	if perr != nil {
		return perr
	}
	s, err := t.awaitProbe(pid, ch)
	if err != nil {
		return err
	}
	if s != (Status{Known: true, Code: 7}) {
		return fmt.Errorf("ptrace probe: want exit 7 through the tracer, got %v", s)
	}
	return nil
}

// awaitProbe waits for the probe child's status from the tracer, judging
// at each probeTick by what the kernel says of the child (see probeTick).
func (t *tracer) awaitProbe(pid int, ch chan Status) (Status, error) {
	start := time.Now()
	tick := time.NewTicker(probeTick)
	defer tick.Stop()
	for {
		select {
		case s := <-ch:
			return s, nil
		case <-tick.C:
		}
		state, cpu, err := procCPU(pid)
		if err != nil {
			// Reaped: by the tracer, whose status is then in ch once it
			// is drained, or by someone else, and the status is lost.
			t.do(t.drain)
			select {
			case s := <-ch:
				return s, nil
			default:
			}
			return Status{}, fmt.Errorf("ptrace probe: its child is gone and the tracer saw no exit: %v", err)
		}
		// A zombie main thread may still wait for the child's other
		// threads to end: its status is not due yet.
		exiting := state == 'Z' || state == 'X'
		var verdict error
		switch {
		case !exiting && cpu >= probeCPU:
			verdict = fmt.Errorf("ptrace probe: its child ran %s of CPU in %s and did not exit", cpu, time.Since(start).Round(time.Millisecond))
		case time.Since(start) < probeLimit:
			continue // starved, or still exiting: not a verdict
		case exiting:
			verdict = fmt.Errorf("ptrace probe: its child exited, and the tracer saw no status within %s", probeLimit)
		default:
			verdict = fmt.Errorf("ptrace probe: no exit seen within %s, while its child had only %s of CPU: "+
				"the node keeps this container off the CPU (raise its CPU request)", probeLimit, cpu)
		}
		// Killed on the tracer thread, which alone reaps it: while it is
		// still in probed, its PID is still the child's, never another's.
		t.do(func() {
			if t.probed[pid] != nil {
				unix.Kill(pid, unix.SIGKILL)
			}
		})
		return Status{}, verdict
	}
}

func (t *tracer) close() {
	select {
	case <-t.quit:
	default:
		close(t.quit)
	}
	<-t.loopDone
}
