//go:build linux

package exitwatch

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Watcher keeps processes by pidfd, and under the ptrace method traces the
// apps' main threads too.
type Watcher struct {
	method Method
	pidfds *pidfds
	tracer *tracer  // ptrace only
	acct   *acctLog // nil: no accounting
}

// New checks that pidfds work (an error if not: nothing can be watched),
// probes the kernel for the methods cfg.Method may take, chooses one and
// starts it. None probes nothing beyond pidfd_open. A forced method that
// cannot work here is no error: auto's choice, with Choice.Refused.
func New(cfg Config) (*Watcher, Choice, error) {
	if err := checkPidfd(); err != nil {
		return nil, Choice{}, err
	}
	pidfd := support{reason: "not probed"}
	if cfg.Method != None {
		pidfd = probePidfd(cfg.Probe)
	}
	acct, acctSupport := (*acctLog)(nil), support{reason: "no state directory (SUPERVISOR_STATE_DIR) to keep its records in"}
	if cfg.Dir != "" && cfg.Method != None {
		acct, acctSupport = startAcct(cfg.Dir, cfg.Probe)
	}
	choice := choose(cfg, pidfd, acctSupport, func() support { return probePtrace(cfg.Probe) })
	choice.Accounting, choice.AccountingOff, choice.AccountingFailed = acct != nil, acctSupport.reason, acctSupport.failed
	w := &Watcher{method: choice.Method, acct: acct}
	var err error
	if w.pidfds, err = newPidfds(); err != nil {
		acct.close()
		return nil, Choice{}, err
	}
	if choice.Method == Ptrace {
		if w.tracer, err = newTracer(); err != nil {
			w.pidfds.close()
			acct.close()
			return nil, Choice{}, err
		}
	}
	return w, choice, nil
}

// Method is how the watcher reads app exit statuses.
func (w *Watcher) Method() Method { return w.method }

// Watch takes an app's main process, checking it is still the process that
// was scanned, and watches its exit and status. With accounting on, a
// status the method cannot give is read from the process's record, and a
// process gone already is done at once if its record is found.
func (w *Watcher) Watch(p Process) (Proc, error) {
	proc, err := w.watch(p)
	if w.acct == nil || w.method == None {
		return proc, err
	}
	if errors.Is(err, ErrGone) {
		if s, _, ok := w.Recorded(p); ok {
			return endedProc(p.PID, s), nil
		}
	}
	if err != nil {
		return nil, err
	}
	return &recordedProc{Proc: proc, w: w, p: p}, nil
}

func (w *Watcher) watch(p Process) (Proc, error) {
	switch w.method {
	case Pidfd:
		return w.pidfds.open(p, true, "")
	case Accounting:
		return w.pidfds.open(p, false, "")
	case None:
		return w.pidfds.open(p, false, "the kernel gives no exit status to a non-parent (needs Linux 6.15+)")
	}
	// ptrace: the pidfd for the exit and the signals, the tracer for the
	// status. If the seize is refused the app is still watched, its
	// status unknown.
	proc, err := w.pidfds.open(p, false, "")
	if err != nil {
		return nil, err
	}
	pp := &ptraceProc{Proc: proc, done: make(chan struct{})}
	err = w.tracer.seize(p.PID, pp)
	if err == nil {
		// The PID may have changed hands between the pidfd check and the
		// seize: if the process we now trace is not the one scanned, let go.
		st, serr := startTime(p.PID)
		if serr == nil && st != p.StartTime {
			w.tracer.release(p.PID)
			proc.Close()
			return nil, fmt.Errorf("pid %d was recycled before it could be traced: %w", p.PID, ErrGone)
		}
		return pp, nil
	}
	if errors.Is(err, unix.ESRCH) || (errors.Is(err, unix.EPERM) && proc.hasExited()) {
		// Exited between pidfd_open and the seize: reaped (ESRCH), or a
		// zombie, which the kernel refuses to trace (EPERM: its
		// exit_state is set), not for want of a permission. The pidfd
		// still reports its exit, with no status.
		err = errors.New("it exited before it could be traced")
	} else if errors.Is(err, unix.EPERM) {
		err = refused(p.PID, err)
	}
	return &unknownProc{Proc: proc, reason: fmt.Sprintf("ptrace refused (%v)", err)}, nil
}

// Track takes a process whose exit matters more than its status (a
// sidecar), by pidfd whatever the method; with the pidfd method its status
// comes too, at no cost (a sidecar that exits non-zero fails the pod).
func (w *Watcher) Track(p Process) (Proc, error) {
	proc, err := w.pidfds.open(p, w.method == Pidfd, "its exit status cannot be read here")
	if err != nil || w.acct == nil || w.method == Pidfd {
		return proc, err
	}
	return &recordedProc{Proc: proc, w: w, p: p}, nil
}

// Recorded reads p's exit status from its accounting record, if
// accounting is on and the kernel wrote one: for an app that ended unread
// just before the supervisor before this one was killed.
func (w *Watcher) Recorded(p Process) (s Status, ended time.Time, ok bool) {
	if w.acct == nil {
		return Status{}, time.Time{}, false
	}
	r, ok, err := w.acct.record(p)
	if !ok || err != nil {
		return Status{}, time.Time{}, false
	}
	if ended, err = r.ended(p.StartTime); err != nil {
		ended = time.Now()
	}
	return r.status(), ended, true
}

// Anchor keeps accounting on through p's view of the state directory, a
// mount of another container that outlives the supervisor's own
// (acctLog.anchor). It reports whether accounting goes through p now:
// false with no error where accounting is off, or already goes through a
// process that still runs.
func (w *Watcher) Anchor(p Process) (bool, error) {
	if w.acct == nil {
		return false, nil
	}
	return w.acct.anchor(p)
}

// CanAnchor reports whether Anchor can succeed here: accounting is on, and
// the method is ptrace, whose CAP_SYS_PTRACE opening another container's
// files needs (acctLog.anchor; the template mounts the state volume in
// istio-proxy under that method alone).
func (w *Watcher) CanAnchor() bool { return w.acct != nil && w.method == Ptrace }

// Close stops watching and releases every pidfd; tracees are detached by
// the kernel when the supervisor exits. Accounting stays on (acctLog).
func (w *Watcher) Close() error {
	if w.tracer != nil {
		w.tracer.close()
	}
	w.acct.close()
	return w.pidfds.close()
}

// recordedProc is a watched process whose unknown status is looked up in
// the accounting records once it has exited.
type recordedProc struct {
	Proc
	w    *Watcher
	p    Process
	once sync.Once
	s    Status
}

func (r *recordedProc) Status() Status {
	select {
	case <-r.Done():
	default:
		return r.Proc.Status() // not ended: nothing to look up yet
	}
	r.once.Do(func() {
		r.s = r.Proc.Status()
		if r.s.Known {
			return
		}
		s, ok, err := r.w.acct.lookup(r.p)
		switch {
		case err != nil:
			r.s.Reason = joinReason(r.s.Reason, "its accounting record cannot be read: "+err.Error())
		case ok:
			r.s = s
		default:
			r.s.Reason = joinReason(r.s.Reason, "the kernel wrote no accounting record of its exit (accounting is suspended while its filesystem is short of space, kernel.acct)")
		}
	})
	return r.s
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// ended is a process already gone, its status read from its record.
type ended struct {
	pid    int
	status Status
	done   chan struct{}
}

func endedProc(pid int, s Status) *ended {
	e := &ended{pid: pid, status: s, done: make(chan struct{})}
	close(e.done)
	return e
}

func (e *ended) PID() int                { return e.pid }
func (e *ended) Signal(sig Signal) error { return fmt.Errorf("signal pid %d: %w", e.pid, ErrGone) }
func (e *ended) Done() <-chan struct{}   { return e.done }
func (e *ended) Status() Status          { return e.status }
func (e *ended) Close() error            { return nil }

// refused says why the kernel refused to trace a live process, from what
// /proc/PID/status shows: the supervisor has CAP_SYS_PTRACE (the method is
// ptrace only then), so "operation not permitted" alone would send a
// reader after a capability the pod has.
func refused(pid int, err error) error {
	b, rerr := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if rerr != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		v = strings.TrimSpace(v)
		switch {
		case k == "TracerPid" && v != "0":
			return fmt.Errorf("already traced by PID %s (a debugger, strace, another supervisor): a process has one tracer", v)
		case k == "State" && strings.HasPrefix(v, "Z"):
			return errors.New("its main thread has exited while other threads run on: the kernel traces no exited thread")
		}
	}
	// TracerPid is 0 too for a tracer outside the pod's PID namespace.
	return fmt.Errorf("%w, with CAP_SYS_PTRACE: traced from outside the pod (a debugger on the node), or a security module forbids it", err)
}
