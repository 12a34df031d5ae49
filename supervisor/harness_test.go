package supervisor

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

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
	postAt []time.Time // when each of posts was sent
	// answer, when set before the run, answers the n-th POST (from 1)
	// other than a /drain (pilot-agent's, before its quit), which
	// drainAnswer answers, when set, else 200.
	answer      func(n int) (int, error)
	drainAnswer func(n int) (int, error)
	drains      int
	code        int
	err         error
	cancel      context.CancelFunc
	result      chan runResult
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
// It must be called in a bubble (synctest.Test): the run's timers and the
// test's waits then share the bubble's clock, which moves only when every
// goroutine of the test is blocked, whatever the machine's speed.
func startWith(t *testing.T, cfg Config, set func(*harness), containers ...procscan.Container) *harness {
	t.Helper()
	if !inBubble() {
		t.Fatal("the harness runs in a bubble: call start in synctest.Test")
	}
	h := &harness{t: t, pod: &fakePod{}, kernel: newFakeKernel(), log: &bytes.Buffer{}, code: 200, result: make(chan runResult, 1)}
	if set != nil {
		set(h)
	}
	h.pod.containers = append([]procscan.Container{
		container(procscan.Pause, "pause", 1), container(procscan.Self, "supervisor", 2),
	}, containers...)
	h.launch(cfg)
	return h
}

// rerun starts another Supervisor on h's pod and kernel, as the kubelet
// starts a killed one again: a harness of its own (its log, its result),
// the same processes.
func rerun(t *testing.T, h *harness, cfg Config) *harness {
	t.Helper()
	h2 := &harness{t: t, pod: h.pod, kernel: h.kernel, log: &bytes.Buffer{}, code: 200, result: make(chan runResult, 1)}
	h2.launch(cfg)
	return h2
}

// launch runs a Supervisor with cfg over h's fakes, in the background.
func (h *harness) launch(cfg Config) {
	t := h.t
	post := func(ctx context.Context, u *url.URL, timeout time.Duration) (int, error) {
		h.postMu.Lock()
		defer h.postMu.Unlock()
		h.posts = append(h.posts, u.String())
		h.postAt = append(h.postAt, time.Now())
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
		s.Release() // as the process's exit would
		h.result <- runResult{res, err}
	}()
}

// inBubble reports whether the caller runs in a synctest bubble, where
// synctest.Wait does not panic (and returns at once at a run's start).
func inBubble() (ok bool) {
	defer func() { ok = recover() == nil }()
	synctest.Wait()
	return true
}

// postsSent is the URLs POSTed so far.
func (h *harness) postsSent() []string {
	h.postMu.Lock()
	defer h.postMu.Unlock()
	return append([]string(nil), h.posts...)
}

// postedAt is when the i-th POST (from 0) was sent, or the zero time.
func (h *harness) postedAt(i int) time.Time {
	h.postMu.Lock()
	defer h.postMu.Unlock()
	if i < 0 || i >= len(h.postAt) {
		return time.Time{}
	}
	return h.postAt[i]
}

// syncWriter is the run's log: its mutex guards reads while the run goes
// on, and written fires on each line.
type syncWriter struct {
	mu      sync.Mutex
	w       *bytes.Buffer
	written event
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
	defer s.written.fire()
	return s.w.Write(b)
}

// waitBound bounds every wait of the harness. In a bubble it is the
// bubble's time, which costs nothing while the run sleeps: it only has
// to be past the longest bound a test sets (a minute), so that a wait
// that fails is the run's doing, not the harness's.
const waitBound = 10 * time.Minute

// await waits until ok holds, looking again each time e fires, for at
// most waitBound; it reports whether ok held.
func await(e *event, ok func() bool) bool {
	bound := time.NewTimer(waitBound)
	defer bound.Stop()
	for {
		changed := e.next() // before the look: a change after it wakes us
		if ok() {
			return true
		}
		select {
		case <-changed:
		case <-bound.C:
			return false
		}
	}
}

// proc waits until the supervisor has opened pid (or the test spawned it).
func (h *harness) proc(pid int) *fakeProc {
	h.t.Helper()
	var p *fakeProc
	if !await(&h.kernel.opened, func() bool { p = h.kernel.proc(pid); return p != nil }) {
		h.t.Fatalf("pid %d never opened; log:\n%s", pid, h.logged())
	}
	return p
}

// waitLog waits until the run's log holds s.
func waitLog(t *testing.T, h *harness, s string) {
	t.Helper()
	if !await(&h.logw.written, func() bool { return strings.Contains(h.logged(), s) }) {
		t.Fatalf("the log never said %s; log:\n%s", s, h.logged())
	}
}

// noSignalUntil moves the bubble's clock to at, lets the run settle
// there (every goroutine blocked: all it does at that instant is done),
// and fails if the sidecar has been signalled.
func noSignalUntil(t *testing.T, h *harness, at time.Time) {
	t.Helper()
	time.Sleep(time.Until(at))
	synctest.Wait()
	if sent := h.kernel.sent(); len(sent) > 0 {
		t.Fatalf("sidecar signalled too early: %v at %s, checked up to %s\nlog:\n%s", sent, clock(h.kernel.sentAt(0)), clock(at), h.logged())
	}
}

// noSignalFor is noSignalUntil d from now.
func noSignalFor(t *testing.T, h *harness, d time.Duration) {
	t.Helper()
	noSignalUntil(t, h, time.Now().Add(d))
}

// just is the bubble's clock's smallest step: just before a deadline d
// is d - just.
const just = time.Nanosecond

// signalledAt checks that the i-th signal (from 0) was sent at exactly
// want, which why names.
func (h *harness) signalledAt(i int, want time.Time, why string) {
	h.t.Helper()
	if got := h.kernel.sentAt(i); !got.Equal(want) {
		h.t.Errorf("signal %d of %v sent at %s, want %s (%s); log:\n%s", i, h.kernel.sent(), clock(got), clock(want), why, h.logged())
	}
}

// signalledWithin checks that the i-th signal was sent from from to d
// later, which why names.
func (h *harness) signalledWithin(i int, from time.Time, d time.Duration, why string) {
	h.t.Helper()
	if got := h.kernel.sentAt(i); got.Before(from) || got.After(from.Add(d)) {
		h.t.Errorf("signal %d of %v sent at %s, want from %s to %v later (%s); log:\n%s", i, h.kernel.sent(), clock(got), clock(from), d, why, h.logged())
	}
}

// clock shows an instant of the bubble's clock (it starts at midnight),
// or "never" for the zero time.
func clock(at time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Format("15:04:05.000000000")
}

// finish waits for the run, which must end with outcome after sending
// exactly signals ("SIGTERM 100"), and returns its result.
func (h *harness) finish(outcome Outcome, signals ...string) Result {
	h.t.Helper()
	res, err := h.wait()
	if err != nil || res.Outcome != outcome {
		h.t.Fatalf("res %+v err %v, want %v; log:\n%s", res, err, outcome, h.logged())
	}
	if signals == nil {
		signals = []string{}
	}
	if diff := cmp.Diff(signals, append([]string{}, h.kernel.sent()...)); diff != "" {
		h.t.Errorf("signals (-want +got):\n%s", diff)
	}
	return res
}

// wait waits for the run to return.
func (h *harness) wait() (Result, error) {
	h.t.Helper()
	bound := time.NewTimer(waitBound)
	defer bound.Stop()
	select {
	case r := <-h.result:
		return r.res, r.err
	case <-bound.C:
		h.t.Fatalf("Run did not return within %v; log:\n%s", waitBound, h.logged())
	}
	return Result{}, nil
}

func exited(code int) exitwatch.Status             { return exitwatch.Status{Known: true, Code: code} }
func killed(sig exitwatch.Signal) exitwatch.Status { return exitwatch.Status{Known: true, Signal: sig} }
func unknownStatus() exitwatch.Status              { return exitwatch.Status{Reason: "test"} }
