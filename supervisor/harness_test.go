package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// fakePod is a Scanner whose containers the test changes as it goes.
type fakePod struct {
	mu         sync.Mutex
	containers []procscan.Container
	err        error
	scans      int
	unhandled  map[int]bool     // PIDs that handle no signal (Signals)
	named      bool             // containers carry their Kubernetes names
	panicAt    int              // Scan panics at this scan (a bug injected)
	args       map[int][]string // command lines (Args)
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
// otherwise for its PID.
func (f *fakePod) Signals(pid int) (procscan.Signals, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unhandled[pid] {
		return procscan.Signals{}, nil
	}
	return procscan.Signals{Caught: ^uint64(0)}, nil
}

// Args is the command line args says for pid, if any.
func (f *fakePod) Args(pid int) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.args[pid], nil
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
	if p.sidecar {
		// Looked up now, not when the supervisor held the process: a test
		// may set the reaction after the run has started.
		if react := p.k.sidecarReaction(); react != nil {
			if s := react(sig); s != nil {
				p.exit(*s)
			}
		}
	}
	return nil
}

// fakeKernel hands out fakeProcs and records every signal sent.
type fakeKernel struct {
	mu       sync.Mutex
	procs    map[int]*fakeProc
	gone     map[int]bool // Open fails with ErrGone
	signals  []string
	signaled chan struct{}
	// sidecar reaction to signals, for procs opened without status (set it
	// with setOnSignal once the run has started)
	onSignal func(exitwatch.Signal) *exitwatch.Status
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{procs: map[int]*fakeProc{}, gone: map[int]bool{}, signaled: make(chan struct{}, 100),
		// A well-behaved sidecar: any signal stops it, SIGKILL kills it, the
		// others it handles and exits 0.
		onSignal: func(sig exitwatch.Signal) *exitwatch.Status {
			if sig == exitwatch.SIGKILL {
				return &exitwatch.Status{Known: true, Signal: sig}
			}
			return &exitwatch.Status{Known: true}
		}}
}

// Watch and Hold hold p as an app or as a sidecar.
func (k *fakeKernel) Watch(p exitwatch.Process) (exitwatch.Proc, error) { return k.open(p, true) }
func (k *fakeKernel) Hold(p exitwatch.Process) (exitwatch.Proc, error)  { return k.open(p, false) }

func (k *fakeKernel) open(p exitwatch.Process, status bool) (exitwatch.Proc, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gone[p.PID] {
		return nil, exitwatch.ErrGone
	}
	if fp, ok := k.procs[p.PID]; ok {
		select {
		case <-fp.done:
			return nil, exitwatch.ErrGone // exited and reaped before it was held
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

// spawn makes a process exist before the supervisor holds it.
func (k *fakeKernel) spawn(pid int) *fakeProc {
	k.mu.Lock()
	defer k.mu.Unlock()
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

func (k *fakeKernel) setOnSignal(f func(exitwatch.Signal) *exitwatch.Status) {
	k.mu.Lock()
	k.onSignal = f
	k.mu.Unlock()
}

func (k *fakeKernel) record(pid int, sig exitwatch.Signal) {
	k.mu.Lock()
	k.signals = append(k.signals, sig.String()+" "+strconv.Itoa(pid))
	k.mu.Unlock()
	k.signaled <- struct{}{}
}

func (k *fakeKernel) sent() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.signals...)
}

func (k *fakeKernel) Method() exitwatch.Method { return "fake" }
func (k *fakeKernel) Close() error             { return nil }

func testConfig(t *testing.T, env ...string) Config {
	t.Helper()
	base := []string{
		"SUPERVISOR_APP_START_TIMEOUT=2s", "SUPERVISOR_SIDECAR_START_TIMEOUT=2s",
		"SUPERVISOR_STOP_TIMEOUT=2s", "SUPERVISOR_SCAN_INTERVAL=5ms", "SUPERVISOR_DELETION_GRACE=200ms",
	}
	cfg, _, err := LoadConfig(append(base, env...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

type harness struct {
	t      *testing.T
	pod    *fakePod
	kernel *fakeKernel
	log    *bytes.Buffer
	logw   *syncWriter // writes log; its mutex guards reads while the run goes on
	postMu sync.Mutex
	posts  []string
	// answer, when set before the run, answers the n-th POST (from 1)
	// other than a /drain (pilot-agent's, before its quit), which
	// drainAnswer answers, when set, else 200.
	answer      func(n int) (int, error)
	drainAnswer func(n int) (int, error)
	drains      int
	code        int
	err         error
	cancel context.CancelFunc
	result chan runResult
}

type runResult struct {
	res Result
	err error
}

// start runs a Supervisor over a fake pod holding pause, self and the
// given containers, in the background.
func start(t *testing.T, cfg Config, containers ...procscan.Container) *harness {
	t.Helper()
	return startWith(t, cfg, nil, containers...)
}

// startWith is start with set called on the harness before the run starts.
func startWith(t *testing.T, cfg Config, set func(*harness), containers ...procscan.Container) *harness {
	t.Helper()
	h := &harness{t: t, pod: &fakePod{}, kernel: newFakeKernel(), log: &bytes.Buffer{}, code: 200, result: make(chan runResult, 1)}
	if set != nil {
		set(h)
	}
	h.pod.containers = append([]procscan.Container{
		container(procscan.Pause, "pause", 1), container(procscan.Self, "supervisor", 2),
	}, containers...)
	post := func(ctx context.Context, u *url.URL, timeout time.Duration) (int, error) {
		h.postMu.Lock()
		defer h.postMu.Unlock()
		h.posts = append(h.posts, u.String())
		if u.Path == "/drain" {
			h.drains++
			if h.drainAnswer != nil {
				return h.drainAnswer(h.drains)
			}
			return 200, nil
		}
		if h.answer != nil {
			return h.answer(len(h.posts) - h.drains)
		}
		return h.code, h.err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	t.Cleanup(cancel)
	h.logw = &syncWriter{w: h.log}
	logger := zerolog.New(h.logw)
	s := New(cfg, logger, h.pod, h.kernel, post)
	go func() {
		res, err := s.Run(ctx)
		h.result <- runResult{res, err}
	}()
	return h
}

// postsSent is the URLs POSTed so far.
func (h *harness) postsSent() []string {
	h.postMu.Lock()
	defer h.postMu.Unlock()
	return append([]string(nil), h.posts...)
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

// logged is the log so far.
func (h *harness) logged() string {
	h.logw.mu.Lock()
	defer h.logw.mu.Unlock()
	return h.log.String()
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// proc waits (bounded) until the supervisor has opened pid.
func (h *harness) proc(pid int) *fakeProc {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if p := h.kernel.proc(pid); p != nil {
			return p
		}
		time.Sleep(time.Millisecond)
	}
	h.t.Fatalf("pid %d never opened", pid)
	return nil
}

// finish waits for the run, which must end with outcome after sending
// exactly signals ("SIGTERM 100"), and returns its result.
func (h *harness) finish(outcome Outcome, signals ...string) Result {
	h.t.Helper()
	res, err := h.wait()
	if err != nil || res.Outcome != outcome {
		h.t.Fatalf("res %+v err %v, want %v; log:\n%s", res, err, outcome, h.log)
	}
	if signals == nil {
		signals = []string{}
	}
	if diff := cmp.Diff(signals, append([]string{}, h.kernel.sent()...)); diff != "" {
		h.t.Errorf("signals (-want +got):\n%s", diff)
	}
	return res
}

func (h *harness) wait() (Result, error) {
	h.t.Helper()
	select {
	case r := <-h.result:
		return r.res, r.err
	case <-time.After(10 * time.Second):
		h.t.Fatalf("Run did not return; log:\n%s", h.log.String())
	}
	return Result{}, nil
}

func exited(code int) exitwatch.Status                 { return exitwatch.Status{Known: true, Code: code} }
func killed(sig exitwatch.Signal) exitwatch.Status     { return exitwatch.Status{Known: true, Signal: sig} }
func unknownStatus() exitwatch.Status                  { return exitwatch.Status{Reason: "test"} }
func ignoreSignals(exitwatch.Signal) *exitwatch.Status { return nil }
