package istioproxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
)

// buildTools runs build-tools.sh once per test binary. A cold build of
// pilot-agent takes about a minute on 2 cores; warm, well under a second.
var buildTools = sync.OnceValues(func() (istioproxy.Tools, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	return istioproxy.BuildTools(ctx)
})

// The tests' bounds. Each guards against a hang and sits well past what the
// expected path takes on a loaded machine; none is the thing tested. What a
// test asserts comes from the order of events (the stand-in envoy's record,
// pilot-agent's exit) or from a lower bound, which slowness cannot break.
const (
	// readyGuard bounds pilot-agent's start until ready.
	readyGuard = 2 * time.Minute
	// requestGuard bounds one HTTP request that must be answered.
	requestGuard = 30 * time.Second
	// exitGuard bounds pilot-agent's exit (and envoy's death after it)
	// beyond the drain a test expects.
	exitGuard = time.Minute
	// longDrain is terminationDrainDuration where a test proves that
	// pilot-agent did not drain: far past exitGuard, so that an exit that
	// waited for it fails the wait, and one that did not is never slow
	// enough to be taken for it.
	longDrain = 5 * time.Minute
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: network namespaces and running pilot-agent as uid %d", istioproxy.ProxyUID)
	}
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// agent is a running pilot-agent (with the stand-in envoy) in a network
// namespace of its own.
type agent struct {
	t       *testing.T
	proxy   *istioproxy.Proxy
	ns      *netns
	http    *http.Client
	cmd     *exec.Cmd
	out     *lockedBuffer
	started time.Time
	done    chan struct{} // closed when cmd.Wait returned
	exited  time.Time
	waitErr error
}

func startAgent(t *testing.T, cfg istioproxy.Config) *agent {
	t.Helper()
	requireRoot(t)
	tools, err := buildTools()
	if err != nil {
		t.Fatalf("building the tools with e2e/%s failed: %v", istioproxy.BuildScript, err)
	}
	cfg.Tools = tools
	root := t.TempDir()
	// t.TempDir's parent is 0700; uid 1337 must be able to reach the tree.
	if err := os.Chmod(filepath.Dir(root), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := istioproxy.Prepare(root, cfg)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	cmd, err := p.Command()
	if err != nil {
		t.Fatalf("Command: %v", err)
	}
	// Should the test binary die, take pilot-agent along. Safe here (unlike
	// in general, see the stand-in's watchParent): the parent thread is the
	// namespace's locked thread, which outlives the process.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	a := &agent{t: t, proxy: p, ns: newNetns(t), cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	a.http = a.ns.httpClient(requestGuard)
	cmd.Stdout, cmd.Stderr = a.out, a.out
	a.ns.run(func() {
		a.started = time.Now()
		err = cmd.Start()
	})
	if err != nil {
		t.Fatalf("start pilot-agent: %v", err)
	}
	a.watch("pilot-agent")
	return a
}

// watch waits for the started agent's process in the background. At the
// end of the test it kills the process if it still runs (SIGKILL, then
// bounded by exitGuard), and dumps the agent if the test failed.
func (a *agent) watch(name string) {
	go func() {
		a.waitErr = a.cmd.Wait()
		a.exited = time.Now()
		close(a.done)
	}()
	a.t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			_ = a.cmd.Process.Kill()
			select {
			case <-a.done:
			case <-time.After(exitGuard):
				a.t.Errorf("%s (pid %d) did not end within %s of its kill", name, a.cmd.Process.Pid, exitGuard)
			}
		}
		if a.t.Failed() {
			a.dump()
		}
	})
}

// dump logs what a failing test needs: pilot-agent's output and the record.
func (a *agent) dump() {
	out := a.out.String()
	lines := strings.Split(out, "\n")
	if len(lines) > 80 {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines)", len(lines)-80)}, lines[len(lines)-80:]...)
	}
	a.t.Logf("pilot-agent output:\n%s", strings.Join(lines, "\n"))
	events, err := a.proxy.Record()
	a.t.Logf("stand-in envoy record (%s, err=%v):\n%s", a.proxy.RecordFile(), err, record.Format(events))
}

func (a *agent) url(port int, path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", port, path)
}

// waitReady polls the pod's readiness probe (envoy's :15021, forwarded to
// pilot-agent's :15020) as the kubelet would, until it answers 200, and
// returns how long that took since pilot-agent started. Readiness has no
// push notification, so polling is the event here; the context bounds it.
func (a *agent) waitReady(ctx context.Context) time.Duration {
	a.t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		code, body, err := a.get(ctx, a.url(istioproxy.HealthPort, "/healthz/ready"))
		if err == nil && code == http.StatusOK {
			return time.Since(a.started)
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %q", code, body)
		}
		select {
		case <-ctx.Done():
			a.t.Fatalf("pilot-agent not ready on :%d/healthz/ready after %v: last answer: %s",
				istioproxy.HealthPort, time.Since(a.started).Round(time.Millisecond), last)
		case <-a.done:
			a.t.Fatalf("pilot-agent exited before becoming ready: %v", a.waitErr)
		case <-tick.C:
		}
	}
}

func (a *agent) get(ctx context.Context, url string) (int, string, error) {
	return a.do(ctx, http.MethodGet, url)
}

func (a *agent) do(ctx context.Context, method, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitExit waits for pilot-agent to exit and returns its status.
func (a *agent) waitExit(ctx context.Context) syscall.WaitStatus {
	a.t.Helper()
	select {
	case <-a.done:
	case <-ctx.Done():
		a.t.Fatalf("pilot-agent still running %v after start", time.Since(a.started).Round(time.Millisecond))
	}
	var ee *exec.ExitError
	if a.waitErr != nil && !errors.As(a.waitErr, &ee) {
		a.t.Fatalf("wait for pilot-agent: %v", a.waitErr)
	}
	return a.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func (a *agent) signal(sig syscall.Signal) time.Time {
	a.t.Helper()
	at := time.Now()
	if err := a.cmd.Process.Signal(sig); err != nil {
		a.t.Fatalf("signal pilot-agent: %v", err)
	}
	return at
}

func (a *agent) record() []record.Event {
	a.t.Helper()
	events, err := a.proxy.Record()
	if err != nil {
		a.t.Fatalf("read record: %v", err)
	}
	return events
}

// envoyStart returns the stand-in's start event, failing if it never started.
func (a *agent) envoyStart() record.Event {
	a.t.Helper()
	starts := record.OfKind(a.record(), record.Start)
	if len(starts) != 1 {
		a.t.Fatalf("want exactly one envoy start in the record, got %d", len(starts))
	}
	return starts[0]
}

// assertDies waits (exitGuard) until pid is dead: gone or a zombie. pilot-agent
// SIGKILLs envoy but does not wait for it before exiting itself, so right
// after pilot-agent's exit envoy may still be dying or be an unreaped
// zombie that init collects later.
func assertDies(t *testing.T, pid int, what string) {
	t.Helper()
	ctx := ctxTimeout(t, exitGuard)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if err == nil {
			if rest := b[bytes.LastIndexByte(b, ')')+1:]; bytes.HasPrefix(rest, []byte(" Z")) {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Errorf("%s (pid %d) still alive %s after pilot-agent exited: %q", what, pid, exitGuard, b)
			return
		case <-tick.C:
		}
	}
}

// checkDrainThenWait checks the one graceful drain d of a SIGTERM sent at
// sent: it came after the SIGTERM, and pilot-agent exited no sooner than
// drain after it, so it drained on the signal and then waited
// terminationDrainDuration, as Istio's Agent.terminate does. Both are
// orders of events (the stand-in's clock and ours are the host's): a slow
// machine only moves them further apart.
func (a *agent) checkDrainThenWait(d record.Event, sent time.Time, drain time.Duration) {
	a.t.Helper()
	if d.Time.Before(sent) {
		a.t.Errorf("drain at %v, before the SIGTERM at %v", d.Time, sent)
	}
	if after := a.exited.Sub(d.Time); after < drain {
		a.t.Errorf("pilot-agent exited %v after the drain, want at least terminationDrainDuration %v after it (a drain at the exit, not on SIGTERM?)", after, drain)
	}
}

func exitDesc(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit %d", ws.ExitStatus())
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("read stat of pid %d: %v", pid, err)
	}
	// Fields after the last ')' (comm may contain spaces): state, ppid, ...
	var state string
	var ppid int
	if _, err := fmt.Sscanf(string(b[bytes.LastIndexByte(b, ')')+2:]), "%s %d", &state, &ppid); err != nil {
		t.Fatalf("parse stat of pid %d: %v", pid, err)
	}
	return ppid
}

func containsSeq(s, sub []string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if slices.Equal(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}
