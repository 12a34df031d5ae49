package supervisor

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// fakePod is a Scanner whose containers the test changes as it goes.
type fakePod struct {
	mu         sync.Mutex
	containers []procscan.Container
	err        error
	scans      int
	unhandled  map[int]bool     // PIDs that handle no signal (Signals)
	blind      bool             // Signals fails: no dispositions (gVisor)
	named      bool             // containers carry their Kubernetes names
	panicAt    int              // Scan panics at this scan (a bug injected)
	args       map[int][]string // command lines (Args); else its argv[0]
	execing    map[int]int      // reads of Args left that find none (an exec)
	panicAgain bool             // and at every scan after it
	made       int              // containers added (LastPID)
}

// LastPID moves whenever a container is added, as the kernel's does when
// a process is made.
func (f *fakePod) LastPID() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.made, nil
}

// fakeBoot is when the fake pod's kernel booted: the bubble's epoch
// (synctest starts its clock there), so a fake process's StartTime
// counts ticks (procscan.Tick) of the bubble's clock.
var fakeBoot = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Age: how long ago p started, its StartTime counted from fakeBoot.
func (f *fakePod) Age(p procscan.Process) (time.Duration, error) {
	return time.Since(fakeBoot) - time.Duration(p.StartTime)*procscan.Tick, nil
}

// ticksAt is the StartTime of a fake process started at t.
func ticksAt(t time.Time) uint64 { return uint64(t.Sub(fakeBoot) / procscan.Tick) }

// Named: the fake pod's containers are named when named is set.
func (f *fakePod) Named() bool { return f.named }

func (f *fakePod) Scan() (procscan.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scans++
	if f.panicAt > 0 && (f.scans == f.panicAt || f.panicAgain && f.scans > f.panicAt) {
		f.mu.Unlock()
		defer f.mu.Lock()
		panic(fmt.Sprintf("injected panic at scan %d", f.scans))
	}
	return procscan.Pod{Containers: append([]procscan.Container(nil), f.containers...)}, f.err
}

// Signals: every process handles every signal, unless unhandled says
// otherwise for its PID; none can be read when blind.
func (f *fakePod) Signals(pid int) (procscan.Signals, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blind {
		return procscan.Signals{}, fmt.Errorf("pid %d status: no SigCgt or SigIgn line", pid)
	}
	if f.unhandled[pid] {
		return procscan.Signals{}, nil
	}
	return procscan.Signals{Caught: ^uint64(0)}, nil
}

// Args is the command line args says for pid, else its main process's
// name alone; none while execing counts reads down.
func (f *fakePod) Args(pid int) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.execing[pid] > 0 {
		f.execing[pid]--
		return nil, nil
	}
	if a, ok := f.args[pid]; ok {
		return a, nil
	}
	for _, c := range f.containers {
		if c.HasMain && c.Main.PID == pid {
			return []string{c.Main.Name()}, nil
		}
	}
	return nil, procscan.ErrGone
}

// Children lists the processes of the pod whose parent is pid.
func (f *fakePod) Children(pid int) ([]procscan.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []procscan.Process
	for _, c := range f.containers {
		for _, p := range c.Processes {
			if p.PPID == pid {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func (f *fakePod) setUnhandled(pid int, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unhandled == nil {
		f.unhandled = map[int]bool{}
	}
	f.unhandled[pid] = v
}

// remove takes the container of that ID out of the pod (it has exited
// and the runtime removed it).
func (f *fakePod) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range f.containers {
		if c.ID == id {
			f.containers = append(f.containers[:i:i], f.containers[i+1:]...)
			return
		}
	}
}

func (f *fakePod) add(c procscan.Container) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.containers = append(f.containers, c)
	f.made++
}

// container is a container whose main process is named name; a
// pilot-agent has its envoy child (so it handles SIGTERM: knownSidecars).
func container(kind procscan.Kind, name string, pid int) procscan.Container {
	p := procscan.Process{PID: pid, Comm: name, StartTime: uint64(pid)}
	c := procscan.Container{ID: name, Name: name, Kind: kind, Main: p, HasMain: true, Processes: []procscan.Process{p}}
	if name == "pilot-agent" {
		c.Processes = append(c.Processes, procscan.Process{PID: pid*1000 + 1, PPID: pid, Comm: "envoy", StartTime: uint64(pid + 1)})
	}
	return c
}

// fakeProc is a process the test ends by hand (exit) or that reacts to a
// signal (a sidecar, as fakeKernel.onSignal says).
type fakeProc struct {
	pid     int
	k       *fakeKernel
	done    chan struct{}
	once    sync.Once
	status  exitwatch.Status
	sidecar bool // opened without status: reacts to signals as k.onSignal says
}

func (p *fakeProc) PID() int                 { return p.pid }
func (p *fakeProc) Done() <-chan struct{}    { return p.done }
func (p *fakeProc) Status() exitwatch.Status { return p.status }
func (p *fakeProc) Close() error             { return nil }
func (p *fakeProc) exit(s exitwatch.Status) {
	p.once.Do(func() { p.status = s; close(p.done) })
}

func (p *fakeProc) Signal(sig exitwatch.Signal) error {
	p.k.record(p.pid, sig)
	select {
	case <-p.done:
		return exitwatch.ErrGone
	default:
	}
	p.k.mu.Lock()
	refused := p.k.refused[p.pid]
	p.k.mu.Unlock()
	if refused {
		return fmt.Errorf("pidfd_send_signal: %w", os.ErrPermission)
	}
	if p.sidecar {
		// Looked up now, not when the supervisor took the process: a test
		// may set the reaction after the run has started.
		if react := p.k.sidecarReaction(); react != nil {
			if s := react(sig); s != nil {
				p.exit(*s)
			}
		}
	}
	return nil
}

// fakeKernel hands out fakeProcs and records every signal sent, and when.
type fakeKernel struct {
	mu      sync.Mutex
	procs   map[int]*fakeProc
	gone    map[int]bool   // Open fails with ErrGone
	refused map[int]bool   // Signal fails: not permitted (another uid)
	records map[int]record // process accounting's records, by PID
	// anchored: the PIDs Anchor was given; anchors: whether accounting is
	// on for it to anchor (off: it does nothing, as the real one); anchorErr:
	// what it then returns
	anchored  []int
	anchors   bool
	anchorErr error
	signals   []string
	at        []time.Time // when each of signals was sent
	// opened fires when a process comes to be (spawn) or is taken.
	opened event
	// sidecar reaction to signals, for procs opened without status (set it
	// with setOnSignal once the run has started)
	onSignal func(exitwatch.Signal) *exitwatch.Status
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{procs: map[int]*fakeProc{}, gone: map[int]bool{}, refused: map[int]bool{},
		// A well-behaved sidecar: any signal stops it, SIGKILL kills it, the
		// others it handles and exits 0.
		onSignal: func(sig exitwatch.Signal) *exitwatch.Status {
			if sig == exitwatch.SIGKILL {
				return &exitwatch.Status{Known: true, Signal: sig}
			}
			return &exitwatch.Status{Known: true}
		}}
}

// writeRecord writes the accounting record of pid's exit, now, which
// Recorded reads.
func (k *fakeKernel) writeRecord(pid int, s exitwatch.Status) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.records == nil {
		k.records = map[int]record{}
	}
	k.records[pid] = record{s, time.Now()}
}

type record struct {
	status exitwatch.Status
	at     time.Time
}

// Recorded is exitwatch.Watcher's: the record of an exit, if written.
func (k *fakeKernel) Recorded(p exitwatch.Process) (exitwatch.Status, time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r, ok := k.records[p.PID]
	return r.status, r.at, ok
}

// Anchor is exitwatch.Watcher's: with anchors, done the first time, unless
// refused.
func (k *fakeKernel) Anchor(p exitwatch.Process) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.anchored = append(k.anchored, p.PID)
	if !k.anchors {
		return false, nil
	}
	return k.anchorErr == nil && len(k.anchored) == 1, k.anchorErr
}

// CanAnchor is exitwatch.Watcher's: whether accounting is on to anchor.
func (k *fakeKernel) CanAnchor() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.anchors
}

func (k *fakeKernel) anchoredPIDs() []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.anchored)
}

// Watch and Track take p as an app or as a sidecar.
func (k *fakeKernel) Watch(p exitwatch.Process) (exitwatch.Proc, error) { return k.open(p, true) }
func (k *fakeKernel) Track(p exitwatch.Process) (exitwatch.Proc, error) { return k.open(p, false) }

func (k *fakeKernel) open(p exitwatch.Process, status bool) (exitwatch.Proc, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	defer k.opened.fire()
	if k.gone[p.PID] {
		return nil, exitwatch.ErrGone
	}
	if fp, ok := k.procs[p.PID]; ok {
		select {
		case <-fp.done:
			return nil, exitwatch.ErrGone // exited and reaped before it was taken
		default:
		}
		if !status {
			fp.sidecar = true
		}
		return fp, nil
	}
	fp := &fakeProc{pid: p.PID, k: k, done: make(chan struct{}), sidecar: !status}
	k.procs[p.PID] = fp
	return fp, nil
}

// spawn makes a process exist before the supervisor takes it.
func (k *fakeKernel) spawn(pid int) *fakeProc {
	k.mu.Lock()
	defer k.mu.Unlock()
	defer k.opened.fire()
	fp := &fakeProc{pid: pid, k: k, done: make(chan struct{})}
	k.procs[pid] = fp
	return fp
}

func (k *fakeKernel) proc(pid int) *fakeProc {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.procs[pid]
}

func (k *fakeKernel) sidecarReaction() func(exitwatch.Signal) *exitwatch.Status {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.onSignal
}

// refuse makes every signal to pid fail as not permitted.
func (k *fakeKernel) refuse(pid int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refused[pid] = true
}

func (k *fakeKernel) setOnSignal(f func(exitwatch.Signal) *exitwatch.Status) {
	k.mu.Lock()
	k.onSignal = f
	k.mu.Unlock()
}

func (k *fakeKernel) record(pid int, sig exitwatch.Signal) {
	k.mu.Lock()
	k.signals = append(k.signals, sig.String()+" "+strconv.Itoa(pid))
	k.at = append(k.at, time.Now())
	k.mu.Unlock()
}

func (k *fakeKernel) sent() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.signals...)
}

// sentAt is when the i-th signal (from 0) was sent, or the zero time.
func (k *fakeKernel) sentAt(i int) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	if i >= len(k.at) {
		return time.Time{}
	}
	return k.at[i]
}

func (k *fakeKernel) Method() exitwatch.Method { return "fake" }
func (k *fakeKernel) Close() error             { return nil }

// event wakes whoever waits for a change in a fake (a process opened, a
// log line written). A waiter takes next, checks what it waits for, and
// only then blocks on the channel, which fire closes: no change is
// missed. Blocking on a channel made in the test's bubble is durable
// (testing/synctest), so the bubble's clock moves on, timers and all,
// while the test waits: nothing polls.
type event struct {
	mu sync.Mutex
	ch chan struct{}
}

// next is the channel the next fire closes.
func (e *event) next() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch == nil {
		e.ch = make(chan struct{})
	}
	return e.ch
}

// fire wakes every waiter.
func (e *event) fire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch != nil {
		close(e.ch)
		e.ch = nil
	}
}
