package supervisor

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// fakePod is a Scanner whose containers the test changes as it goes.
type fakePod struct {
	mu         sync.Mutex
	containers []procscan.Container
	err        error
	scans      int
	unhandled  map[int]bool // PIDs that handle no signal (Signals)
}

func (f *fakePod) Scan() (procscan.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scans++
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
		// A well-behaved sidecar: any signal stops it.
		onSignal: func(sig exitwatch.Signal) *exitwatch.Status { return &exitwatch.Status{Known: true, Signal: sig} }}
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
	// answer, when set before the run, answers the n-th POST (from 1).
	answer func(n int) (int, error)
	code   int
	err    error
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
		if h.answer != nil {
			return h.answer(len(h.posts))
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

func TestRunOutcomes(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		status   exitwatch.Status
		outcome  Outcome
		signals  []string
		posts    []string
		postErr  error
		postCode int
	}{
		{name: "exit 0", status: exited(0), outcome: Success, signals: []string{"SIGTERM 100"}},
		{name: "exit 3", status: exited(3), outcome: Failure, signals: []string{"SIGKILL 100"}},
		{name: "killed by SIGSEGV", status: killed(11), outcome: Failure, signals: []string{"SIGKILL 100"}},
		{name: "unknown", status: unknownStatus(), outcome: Unknown, signals: []string{"SIGTERM 100"}},
		{name: "custom actions", env: []string{"SUPERVISOR_ON_FAILURE=SIGINT"}, status: exited(1), outcome: Failure, signals: []string{"SIGINT 100"}},
		{name: "none", env: []string{"SUPERVISOR_ON_SUCCESS=none"}, status: exited(0), outcome: Success},
		{name: "http", env: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}, status: exited(0),
			outcome: Success, posts: []string{"http://127.0.0.1:15020/quitquitquit"}},
		{name: "http answers an error", env: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}, status: exited(0),
			outcome: Success, posts: []string{"http://127.0.0.1:15020/quitquitquit"}, postCode: 503,
			signals: []string{"SIGTERM 100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, testConfig(t, tt.env...),
				container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
			h.err = tt.postErr
			if tt.postCode != 0 {
				h.code = tt.postCode
			}
			if tt.posts != nil && tt.postErr == nil && tt.postCode == 0 {
				// pilot-agent exits on its own after /quitquitquit.
				go func() { p := h.proc(100); <-time.After(10 * time.Millisecond); p.exit(exited(0)) }()
			}
			h.proc(10).exit(tt.status)
			res, err := h.wait()
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != tt.outcome || res.Deleted {
				t.Errorf("outcome %v deleted %v, want %v; log:\n%s", res.Outcome, res.Deleted, tt.outcome, h.log)
			}
			if diff := cmp.Diff(tt.signals, h.kernel.sent()); diff != "" {
				t.Errorf("signals (-want +got):\n%s\nlog:\n%s", diff, h.log)
			}
			if diff := cmp.Diff(tt.posts, h.posts); diff != "" {
				t.Errorf("posts (-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(res.Summary, tt.outcome.String()+": ") {
				t.Errorf("summary %q does not start with the outcome", res.Summary)
			}
		})
	}
}

// TestRunTwoApps: the sidecar is stopped only after the second app is done.
func TestRunTwoApps(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_APP_CONTAINERS=2"),
		container(procscan.App, "app-a", 10), container(procscan.Sidecar, "pilot-agent", 100))
	// The second app container starts later.
	time.Sleep(20 * time.Millisecond)
	h.pod.add(container(procscan.App, "app-b", 20))
	h.proc(10).exit(exited(0))
	b := h.proc(20)
	select {
	case <-h.kernel.signaled:
		t.Fatalf("sidecar signalled while app-b runs: %v", h.kernel.sent())
	case <-time.After(100 * time.Millisecond):
	}
	b.exit(exited(0))
	res, err := h.wait()
	if err != nil || res.Outcome != Success || len(res.Apps) != 2 {
		t.Fatalf("res %+v err %v", res, err)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

// TestRunMissingApp: an expected app container never appears: bounded wait,
// then the unknown action.
func TestRunMissingApp(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APP_START_TIMEOUT=50ms"),
		container(procscan.App, "app-a", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10).exit(exited(0))
	res, _ := h.wait()
	if res.Outcome != Unknown || !strings.Contains(res.Reason, "never seen") {
		t.Errorf("outcome %v reason %q, want unknown/never seen", res.Outcome, res.Reason)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

// TestRunAppGoneBeforeWatch: the app was scanned but exited before its
// pidfd could be opened: its status is unknown, not success.
func TestRunAppGoneBeforeWatch(t *testing.T) {
	pod := []procscan.Container{container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100)}
	k := newFakeKernel()
	k.gone[10] = true
	fp := &fakePod{containers: pod}
	cfg := testConfig(t)
	res, err := New(cfg, zerolog.Nop(), fp, k, nil).Run(context.Background())
	if err != nil || res.Outcome != Unknown {
		t.Fatalf("res %+v err %v, want unknown", res, err)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, k.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

// TestRunLateSidecar: the app finished before the sidecar started; the
// supervisor waits for it, then stops it.
func TestRunLateSidecar(t *testing.T) {
	h := start(t, testConfig(t), container(procscan.App, "app", 10))
	h.proc(10).exit(exited(0))
	time.Sleep(30 * time.Millisecond)
	if got := h.kernel.sent(); len(got) != 0 {
		t.Fatalf("signals before any sidecar: %v", got)
	}
	h.pod.add(container(procscan.Sidecar, "pilot-agent", 100))
	res, err := h.wait()
	if err != nil || res.Outcome != Success {
		t.Fatalf("res %+v err %v", res, err)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

// TestRunNoSidecar: no sidecar ever appears: log it and finish.
func TestRunNoSidecar(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_SIDECAR_START_TIMEOUT=50ms"), container(procscan.App, "app", 10))
	h.proc(10).exit(exited(0))
	res, err := h.wait()
	if err != nil || !strings.Contains(res.Summary, "no sidecar appeared") {
		t.Fatalf("res %+v err %v", res, err)
	}
	if got := h.kernel.sent(); len(got) != 0 {
		t.Errorf("signals: %v", got)
	}
}

// TestRunSidecarIgnoresSIGTERM: SIGKILL after the stop timeout.
func TestRunSidecarIgnoresSIGTERM(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_STOP_TIMEOUT=50ms"),
		container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
		if sig == exitwatch.SIGKILL {
			return &exitwatch.Status{Known: true, Signal: exitwatch.SIGKILL}
		}
		return nil
	})
	h.proc(10).exit(exited(0))
	res, err := h.wait()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100", "SIGKILL 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	if !strings.Contains(res.Summary, "sent SIGKILL") {
		t.Errorf("summary %q does not mention the SIGKILL", res.Summary)
	}
}

// TestRunDeletedMidWait: SIGTERM to the supervisor while the app runs: it
// returns at once and touches nothing.
func TestRunDeletedMidWait(t *testing.T) {
	h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10)
	h.cancel()
	res, err := h.wait()
	if err != nil || !res.Deleted {
		t.Fatalf("res %+v err %v, want deleted", res, err)
	}
	if got := h.kernel.sent(); len(got) != 0 {
		t.Errorf("signals: %v", got)
	}
}

// TestRunDeletionGrace: an app killed by SIGTERM is not a failure when the
// supervisor's own SIGTERM follows within the grace; otherwise it is.
func TestRunDeletionGrace(t *testing.T) {
	for _, deleted := range []bool{true, false} {
		for _, st := range []exitwatch.Status{killed(exitwatch.SIGTERM), exited(143)} {
			h := start(t, testConfig(t, "SUPERVISOR_DELETION_GRACE=1s"),
				container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
			h.proc(10).exit(st)
			if deleted {
				time.Sleep(20 * time.Millisecond)
				h.cancel()
			}
			res, err := h.wait()
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			if !deleted {
				want = []string{"SIGKILL 100"}
			}
			if res.Deleted != deleted || !cmp.Equal(want, h.kernel.sent()) {
				t.Errorf("%v, pod deleted %v: got deleted %v signals %v; log:\n%s", st, deleted, res.Deleted, h.kernel.sent(), h.log)
			}
		}
	}
}

func TestRunNotShared(t *testing.T) {
	fp := &fakePod{containers: []procscan.Container{container(procscan.Self, "supervisor", 1)}}
	_, err := New(testConfig(t), zerolog.Nop(), fp, newFakeKernel(), nil).Run(context.Background())
	if !errors.Is(err, ErrNotShared) || !strings.Contains(err.Error(), "shareProcessNamespace: true") {
		t.Errorf("err = %v, want ErrNotShared naming the fix", err)
	}
}

func TestRunScanError(t *testing.T) {
	fp := &fakePod{err: errors.New("permission denied")}
	_, err := New(testConfig(t), zerolog.Nop(), fp, newFakeKernel(), nil).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "read /proc: permission denied") {
		t.Errorf("err = %v, want the /proc error", err)
	}
}

// TestRunLog: the log reads as a timeline of the run's events.
func TestRunLog(t *testing.T) {
	h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10).exit(exited(0))
	h.wait()
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(h.log.String()), "\n") {
		i := strings.Index(line, `"message":"`)
		msgs = append(msgs, strings.SplitN(line[i+11:], `"`, 2)[0])
	}
	want := []string{"app found", "sidecar found", "app exited", "decision", "sidecar signalled", "sidecar stopped"}
	if diff := cmp.Diff(want, msgs); diff != "" {
		t.Errorf("log messages (-want +got):\n%s\n%s", diff, h.log)
	}
}
