package istioproxy_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
)

// TestReady: the real pilot-agent, run as uid 1337 with the layout, starts the
// stand-in with its envoy command line and becomes ready through envoy's
// :15021 listener.
func TestReady(t *testing.T) {
	a := startAgent(t, istioproxy.Config{})
	ready := a.waitReady(ctxTimeout(t, readyGuard))
	t.Logf("ready after %v", ready.Round(time.Millisecond))

	ctx := ctxTimeout(t, requestGuard)
	if code, body, err := a.get(ctx, a.url(istioproxy.StatusPort, "/healthz/ready")); err != nil || code != http.StatusOK {
		t.Errorf("pilot-agent :%d/healthz/ready = %d %q, %v; want 200", istioproxy.StatusPort, code, body, err)
	}

	start := a.envoyStart()
	if start.UID == nil || *start.UID != istioproxy.ProxyUID {
		t.Errorf("envoy runs as uid %v, want %d (pilot-agent's)", start.UID, istioproxy.ProxyUID)
	}
	if ppid := parentOf(t, start.PID); ppid != a.cmd.Process.Pid {
		t.Errorf("envoy pid %d has parent %d, want pilot-agent %d", start.PID, ppid, a.cmd.Process.Pid)
	}
	// The command line pilot-agent builds for envoy (pkg/envoy/proxy.go).
	for _, want := range [][]string{
		{"./" + istioproxy.EnvoyPath},
		{"-c", "etc/istio/proxy/envoy-rev.json"},
		{"--drain-time-s", "45"},
		{"--drain-strategy", "immediate"},
		{"--disable-hot-restart"},
		{"--concurrency", "2"},
	} {
		if !containsSeq(start.Args, want) {
			t.Errorf("envoy args %q lack %q", start.Args, want)
		}
	}
	events := a.record()
	// pilot-agent's readiness probe read envoy's stats...
	if stats := record.AdminRequests(events, "/stats"); len(stats) == 0 {
		t.Errorf("pilot-agent never read envoy's /stats")
	}
	// ...and the kubelet-style probe went through envoy's listener to the agent.
	proxied := record.Filter(events, func(e record.Event) bool {
		return e.Kind == record.Proxy && e.Path == "/healthz/ready" && e.Cluster == "agent" && e.Status == http.StatusOK
	})
	if len(proxied) == 0 {
		t.Errorf("no /healthz/ready forwarded by envoy to cluster agent with 200")
	}
	if d := record.OfKind(events, record.Drain); len(d) != 0 {
		t.Errorf("drain while merely running: %v", d)
	}
	// pilot-agent wrote its bootstrap into the writable config dir, as uid 1337.
	fi, err := os.Stat(a.proxy.Path("etc/istio/proxy/envoy-rev.json"))
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != istioproxy.ProxyUID {
		t.Errorf("envoy-rev.json owned by uid %d, want %d", uid, istioproxy.ProxyUID)
	}
	// Everything the running container created lies in Proxy.Writable.
	var created []string
	err = filepath.Walk(a.proxy.Root, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(a.proxy.Root, path)
		if fi.Sys().(*syscall.Stat_t).Uid != istioproxy.ProxyUID || slices.Contains(a.proxy.Writable, rel) {
			return nil
		}
		created = append(created, fmt.Sprintf("%s (%v)", rel, fi.Mode()))
		if !slices.ContainsFunc(a.proxy.Writable, func(w string) bool { return strings.HasPrefix(rel, w+"/") }) {
			t.Errorf("%s created outside Proxy.Writable", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("written by the running container: %s", strings.Join(created, ", "))
}

// TestReadyAsRoot: the same layout works with the container running as root.
func TestReadyAsRoot(t *testing.T) {
	a := startAgent(t, istioproxy.Config{RunAsRoot: true})
	a.waitReady(ctxTimeout(t, readyGuard))
	if start := a.envoyStart(); start.UID == nil || *start.UID != 0 {
		t.Errorf("envoy runs as uid %v, want 0", start.UID)
	}
}

// TestNotReadyUntilEnvoyIs: readiness follows the envoy stats, not just
// pilot-agent being up.
func TestNotReadyUntilEnvoyIs(t *testing.T) {
	const delay = 1500 * time.Millisecond
	a := startAgent(t, istioproxy.Config{EnvoyReadyDelay: delay})
	ready := a.waitReady(ctxTimeout(t, readyGuard))
	if ready < delay {
		t.Errorf("ready after %v, before the stand-in's %v delay", ready, delay)
	}
	if r := record.OfKind(a.record(), record.Ready); len(r) != 1 {
		t.Errorf("want one ready event, got %d", len(r))
	}
}

// TestSIGTERMDrains: SIGTERM makes pilot-agent ask envoy to drain inbound
// listeners gracefully, wait terminationDrainDuration, kill envoy, exit 0.
func TestSIGTERMDrains(t *testing.T) {
	testSIGTERM(t, time.Second)
}

// TestSIGTERMDefaultDrain checks Istio's default 5s once.
func TestSIGTERMDefaultDrain(t *testing.T) {
	testSIGTERM(t, 0)
}

func testSIGTERM(t *testing.T, drain time.Duration) {
	a := startAgent(t, istioproxy.Config{TerminationDrainDuration: drain})
	want := a.proxy.TerminationDrainDuration
	if drain == 0 && want != istioproxy.DefaultTerminationDrainDuration {
		t.Fatalf("default drain %v, want %v", want, istioproxy.DefaultTerminationDrainDuration)
	}
	a.waitReady(ctxTimeout(t, readyGuard))
	envoy := a.envoyStart()

	sent := a.signal(syscall.SIGTERM)
	took := a.exitZero(t, sent, want+exitGuard, fmt.Sprintf("SIGTERM (terminationDrainDuration %v)", want))
	if took < want {
		t.Errorf("SIGTERM to exit took %v, less than terminationDrainDuration %v", took, want)
	}
	events := a.record()
	drains := record.OfKind(events, record.Drain)
	if len(drains) != 1 {
		t.Fatalf("want exactly one drain, got %d", len(drains))
	}
	d := drains[0]
	if !d.Graceful || !d.InboundOnly || d.SkipExit {
		t.Errorf("drain %v: want graceful, inboundonly, no skip_exit", d)
	}
	a.checkDrainThenWait(d, sent, want)
	req := record.AdminRequests(events, "/drain_listeners")
	if len(req) != 1 || req[0].Method != http.MethodPost || req[0].Query != "inboundonly&graceful" {
		t.Errorf("drain requests %v, want one POST /drain_listeners?inboundonly&graceful", req)
	}
	// pilot-agent ends envoy with SIGKILL: no signal or exit of its own is recorded.
	if s := record.OfKind(events, record.Signal); len(s) != 0 {
		t.Errorf("envoy got catchable signals %v, want none (pilot-agent SIGKILLs it)", s)
	}
	if e := record.OfKind(events, record.Exit); len(e) != 0 {
		t.Errorf("envoy exited by itself %v, want killed", e)
	}
	assertDies(t, envoy.PID, "envoy")
}

// TestQuitQuitQuit: POST :15020/quitquitquit answers 200 and pilot-agent
// exits 0 at once, without draining envoy: no drain in the record, and an
// exit well before terminationDrainDuration, made longDrain so that the
// difference does not depend on the machine's speed.
func TestQuitQuitQuit(t *testing.T) {
	a := startAgent(t, istioproxy.Config{TerminationDrainDuration: longDrain})
	a.waitReady(ctxTimeout(t, readyGuard))
	envoy := a.envoyStart()

	ctx := ctxTimeout(t, requestGuard)
	// Only POST is accepted.
	if code, _, err := a.get(ctx, a.url(istioproxy.StatusPort, "/quitquitquit")); err != nil || code != http.StatusMethodNotAllowed {
		t.Errorf("GET /quitquitquit = %d, %v; want 405", code, err)
	}
	sent := time.Now()
	code, body, err := a.do(ctx, http.MethodPost, a.url(istioproxy.StatusPort, "/quitquitquit"))
	if err != nil || code != http.StatusOK || body != "OK" {
		t.Fatalf("POST /quitquitquit = %d %q, %v; want 200 \"OK\"", code, body, err)
	}
	events := a.wantQuickExit(t, sent, "quitquitquit")
	if d := record.AdminRequests(events, "/drain_listeners"); len(d) != 0 {
		t.Errorf("quitquitquit called /drain_listeners: %v", d)
	}
	assertDies(t, envoy.PID, "envoy")
}

// TestSIGKILL: pilot-agent dies at once; the stand-in notices its parent is
// gone and exits, as the container runtime would have killed it.
func TestSIGKILL(t *testing.T) {
	a := startAgent(t, istioproxy.Config{})
	a.waitReady(ctxTimeout(t, readyGuard))
	envoy := a.envoyStart()

	a.signal(syscall.SIGKILL)
	ws := a.waitExit(ctxTimeout(t, exitGuard))
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("pilot-agent after SIGKILL: %s, want killed by SIGKILL", exitDesc(ws))
	}
	// Bounded wait for the orphaned stand-in to record its exit.
	ctx := ctxTimeout(t, exitGuard)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		exits := record.OfKind(a.record(), record.Exit)
		if len(exits) == 1 {
			if !strings.Contains(exits[0].Reason, "parent") {
				t.Errorf("envoy exit %v, want reason parent exited", exits[0])
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("orphaned envoy pid %d did not exit within %s", envoy.PID, exitGuard)
		case <-tick.C:
		}
	}
	if d := record.OfKind(a.record(), record.Drain); len(d) != 0 {
		t.Errorf("SIGKILL path drained envoy: %v", d)
	}
}

// TestEnvoyQuitQuitQuit: stopping envoy through its own admin API (some Job
// sidecar killers do POST :15000/quitquitquit) makes envoy exit 0, and
// pilot-agent follows it, exiting 0 with no drain (none in the record, and
// well before a longDrain terminationDrainDuration).
func TestEnvoyQuitQuitQuit(t *testing.T) {
	a := startAgent(t, istioproxy.Config{TerminationDrainDuration: longDrain})
	a.waitReady(ctxTimeout(t, readyGuard))

	ctx := ctxTimeout(t, requestGuard)
	sent := time.Now()
	code, body, err := a.do(ctx, http.MethodPost, a.url(istioproxy.AdminPort, "/quitquitquit"))
	if err != nil || code != http.StatusOK {
		t.Fatalf("POST envoy /quitquitquit = %d %q, %v; want 200", code, body, err)
	}
	events := a.wantQuickExit(t, sent, "envoy's quitquitquit")
	exits := record.OfKind(events, record.Exit)
	if len(exits) != 1 || exits[0].Code != 0 || exits[0].Reason != "POST /quitquitquit" {
		t.Errorf("envoy exits %v, want one exit 0 for POST /quitquitquit", exits)
	}
}

// wantQuickExit waits for pilot-agent's exit after what, sent at sent: it
// must exit 0 well before a longDrain terminationDrainDuration and without
// draining envoy. It returns the stand-in's record.
func (a *agent) wantQuickExit(t *testing.T, sent time.Time, what string) []record.Event {
	t.Helper()
	if took := a.exitZero(t, sent, exitGuard, what); took >= longDrain {
		t.Errorf("%s to exit took %v, want it well under terminationDrainDuration %v (no drain)", what, took, longDrain)
	}
	events := a.record()
	if d := record.OfKind(events, record.Drain); len(d) != 0 {
		t.Errorf("%s drained envoy: %v", what, d)
	}
	return events
}

// exitZero waits, up to guard, for pilot-agent's exit after what, sent at
// sent, which must be exit 0, and returns how long after sent it came.
func (a *agent) exitZero(t *testing.T, sent time.Time, guard time.Duration, what string) time.Duration {
	t.Helper()
	ws := a.waitExit(ctxTimeout(t, guard))
	took := a.exited.Sub(sent)
	t.Logf("%s to pilot-agent exit: %v, %s", what, took.Round(time.Millisecond), exitDesc(ws))
	if ws.Signaled() || ws.ExitStatus() != 0 {
		t.Errorf("pilot-agent after %s: %s, want exit 0", what, exitDesc(ws))
	}
	return took
}

// TestDrainThenSIGTERM: the native-sidecar shutdown. POST :15020/drain
// drains envoy at once with skip_exit; a later SIGTERM then exits without
// waiting terminationDrainDuration again (longDrain: an exit that waited
// for it cannot be mistaken for a slow one).
func TestDrainThenSIGTERM(t *testing.T) {
	a := startAgent(t, istioproxy.Config{TerminationDrainDuration: longDrain})
	a.waitReady(ctxTimeout(t, readyGuard))

	ctx := ctxTimeout(t, requestGuard)
	if code, body, err := a.do(ctx, http.MethodPost, a.url(istioproxy.StatusPort, "/drain")); err != nil || code != http.StatusOK {
		t.Fatalf("POST /drain = %d %q, %v; want 200", code, body, err)
	}
	drains := record.OfKind(a.record(), record.Drain)
	if len(drains) != 1 || !drains[0].SkipExit || !drains[0].Graceful || !drains[0].InboundOnly {
		t.Fatalf("drains after POST /drain: %v, want one graceful inboundonly skip_exit", drains)
	}
	sent := a.signal(syscall.SIGTERM)
	if took := a.exitZero(t, sent, exitGuard, "SIGTERM after /drain"); took >= a.proxy.TerminationDrainDuration {
		t.Errorf("SIGTERM after /drain took %v, want well under terminationDrainDuration %v", took, a.proxy.TerminationDrainDuration)
	}
	if n := len(record.OfKind(a.record(), record.Drain)); n != 1 {
		t.Errorf("want the one drain from /drain only, got %d", n)
	}
}
