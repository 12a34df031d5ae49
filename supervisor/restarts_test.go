package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// TestLedger runs the restart bookkeeping through timelines, one step at a
// time, without a goroutine or a clock. Steps:
//
//	start NAME PID    a new instance (its main process PID)
//	named NAME PID    a new instance known by its Kubernetes name
//	init NAME PID     named, adopted as its runtime's init
//	execd NAME        NAME's last instance is seen running its program
//	exit NAME CODE    NAME's last instance exits with CODE (-1: unknown)
//	kill NAME [SIG]   NAME's last instance is killed by SIG (SIGKILL)
//	at SECONDS        settle at that time (the clock of the table)
//	missing           the slots never seen are filled as unknown
//
// and after the last step: whether the apps are finished, what is still
// sought, and what the decision is made on.
func TestLedger(t *testing.T) {
	tests := []struct {
		name     string
		policy   RestartPolicy
		want     int
		steps    string
		finished bool
		seeking  bool
		final    string // "container status, ..."
		replaced string // "new<old, ..." in order
		// The restart margin and timeout: unknown waits for the timeout
		// (10s) unless a margin is given.
		margin, timeout time.Duration
	}{
		{name: "never: one app exits 3", policy: Never, want: 1,
			steps: "start a 1; exit a 3", finished: true, final: "a exit 3"},
		{name: "never: the second app still runs", policy: Never, want: 2,
			steps: "start a 1; start b 2; exit a 0", final: "a exit 0, b running"},
		{name: "onfailure: fails, then the restart succeeds", policy: OnFailure, want: 1,
			steps: "start a 1; exit a 1; start a-r1 2; exit a-r1 0", finished: true,
			final: "a-r1 exit 0", replaced: "a-r1<a"},
		{name: "onfailure: a failure awaits its restart", policy: OnFailure, want: 1,
			steps: "start a 1; exit a 1", seeking: true, final: "a exit 1"},
		{name: "onfailure: a restart fills the oldest awaiting slot", policy: OnFailure, want: 2,
			steps: "start a 1; start b 2; exit b 1; exit a 1; start x 3; start y 4; exit x 0; exit y 0", finished: true,
			final: "x exit 0, y exit 0", replaced: "x<b, y<a"},
		{name: "onfailure: a first start taken for a restart leaves a slot short", policy: OnFailure, want: 2,
			steps: "start a 1; exit a 1; start b 2; exit b 0", seeking: true,
			final: "b exit 0", replaced: "b<a"},
		{name: "onfailure: unknown waits for a restart until the timeout", policy: OnFailure, want: 1,
			steps: "start a 1; exit a -1 @0; at 9", seeking: true, final: "a unknown (test)"},
		{name: "onfailure: unknown with no restart in time is finished", policy: OnFailure, want: 1,
			steps: "start a 1; exit a -1 @0; at 10", finished: true, final: "a unknown (test)"},
		{name: "onfailure: unknown, then restarted and succeeded", policy: OnFailure, want: 1,
			steps: "start a 1; exit a -1 @0; at 5; start a-r1 2; exit a-r1 0 @6; at 6", finished: true,
			final: "a-r1 exit 0", replaced: "a-r1<a"},
		{name: "unknown on the first run: finished once the margin has passed (the first restart comes at once)",
			policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "start a 1; exit a -1 @0; at 14", seeking: true, final: "a unknown (test)"},
		{name: "unknown on the first run, at the margin", policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "start a 1; exit a -1 @0; at 15", finished: true, final: "a unknown (test)"},
		{name: "unknown after two failures: the third restart's back-off (20s) and the margin",
			policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps:   "start a 1; exit a 1 @0; start a-r1 2; exit a-r1 1 @5; start a-r2 3; exit a-r2 -1 @40; at 74",
			seeking: true, final: "a-r2 unknown (test)", replaced: "a-r1<a, a-r2<a-r1"},
		{name: "unknown after two failures, at back-off plus margin",
			policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps:    "start a 1; exit a 1 @0; start a-r1 2; exit a-r1 1 @5; start a-r2 3; exit a-r2 -1 @40; at 75",
			finished: true, final: "a-r2 unknown (test)", replaced: "a-r1<a, a-r2<a-r1"},
		{name: "names: a restart is the same name, not the oldest awaiting", policy: OnFailure, want: 2,
			steps: "named a 1; named b 2; exit b 1; exit a 1; named a 3; exit a 0; named b 4; exit b 0", finished: true,
			final: "a exit 0, b exit 0", replaced: "a<a, b<b"},
		{name: "names: an instance seen at its exit, unnamed, is replaced by its named restart", policy: OnFailure, want: 2,
			steps: "named b 2; start x 1; exit x 1; named a 3; exit a 0; exit b 0", finished: true,
			final: "b exit 0, a exit 0", replaced: "a<x"},
		// The kubelet lost an instance (containerd's restart: seed
		// 20261216, Job 130) and started the container again while it
		// ran: the new instance's end is the container's last run, and
		// the old one's later end awaits no restart.
		{name: "onfailure: an instance ending after its container's new start awaits nothing", policy: OnFailure, want: 1,
			steps: "named a 1; named a 2; exit a 0; exit #1 143", finished: true,
			final: "a exit 0", replaced: "a<a"},
		// A start that failed: the runtime's init killed before its exec,
		// and the kubelet starts the container again, whatever the policy.
		{name: "never: an init killed before its exec awaits its new start", policy: Never, want: 1,
			margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "init a 1; kill a @0; at 14", seeking: true,
			final: "a unknown (killed (SIGKILL) as its runtime's init, before its program ran: its start failed, and the kubelet starts it again)"},
		{name: "never: an init killed before its exec, then started again", policy: Never, want: 1,
			margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "init a 1; kill a @0; init a 2; execd a; exit a 0 @3", finished: true, final: "a exit 0", replaced: "a<a"},
		// The kubelet stops the created container (its stop signal,
		// SIGTERM) before starting it again: the soak, seed 20261215, Job 63.
		{name: "never: an init SIGTERMed before its exec awaits its new start", policy: Never, want: 1,
			margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "init a 1; kill a SIGTERM @0; at 14", seeking: true,
			final: "a unknown (killed (SIGTERM) as its runtime's init, before its program ran: its start failed, and the kubelet starts it again)"},
		{name: "never: an init SIGTERMed before its exec, then started again", policy: Never, want: 1,
			margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "init a 1; kill a SIGTERM @0; init a 2; execd a; exit a 0 @3", finished: true, final: "a exit 0", replaced: "a<a"},
		{name: "never: SIGTERMed once its program runs is a failure", policy: Never, want: 1,
			steps: "init a 1; execd a; kill a SIGTERM", finished: true, final: "a killed by SIGTERM"},
		{name: "never: an init killed before its exec, no new start in time", policy: Never, want: 1,
			margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "init a 1; kill a @0; at 15", finished: true,
			final: "a unknown (killed (SIGKILL) as its runtime's init, and no new start was seen within 15s: it ran between two scans, or its program had run after all)"},
		{name: "never: killed once its program runs is a failure", policy: Never, want: 1,
			steps: "init a 1; execd a; kill a", finished: true, final: "a killed by SIGKILL"},
		{name: "never: an app not adopted from its init, killed, is a failure", policy: Never, want: 1,
			steps: "named a 1; kill a", finished: true, final: "a killed by SIGKILL"},
		{name: "onfailure: an init killed before its exec awaits its start for the margin, not the timeout", policy: OnFailure, want: 1,
			margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "init a 1; kill a @0; at 15", finished: true,
			final: "a unknown (killed (SIGKILL) as its runtime's init, and no new start was seen within 15s: it ran between two scans, or its program had run after all)"},
		{name: "missing slots count as unknown", policy: Never, want: 3,
			steps: "start a 1; exit a 0; missing", finished: true,
			final: "a exit 0, missing-1 unknown (never seen), missing-2 unknown (never seen)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			margin, timeout := time.Hour, 10*time.Second
			if tt.margin > 0 {
				margin, timeout = tt.margin, tt.timeout
			}
			l := newLedger(tt.policy, tt.want, timeout, margin)
			t0 := time.Unix(1000, 0)
			now := t0
			last := map[string]instance{}
			var replaced []string
			for _, step := range strings.Split(tt.steps, "; ") {
				f := strings.Fields(step)
				if len(f) > 0 && strings.HasPrefix(f[len(f)-1], "@") {
					var s int
					fmt.Sscanf(f[len(f)-1], "@%d", &s)
					now = t0.Add(time.Duration(s) * time.Second)
					f = f[:len(f)-1]
				}
				switch f[0] {
				case "named", "init":
					// An instance known by its Kubernetes name.
					var pid int
					fmt.Sscanf(f[2], "%d", &pid)
					id := instanceOf(procscan.Process{PID: pid, StartTime: uint64(pid)})
					if old, ok := l.started(id, f[1], f[1]); ok {
						replaced = append(replaced, f[1]+"<"+old)
					}
					if f[0] == "init" {
						l.adoptedInit(id)
						if !l.unexeced() {
							t.Fatalf("%s: not taken as its runtime's init", step)
						}
					}
					last[f[1]] = id
				case "execd":
					l.execd(last[f[1]])
				case "kill":
					sig := exitwatch.SIGKILL
					if len(f) > 2 {
						var err error
						if sig, err = exitwatch.ParseSignal(f[2]); err != nil {
							t.Fatal(err)
						}
					}
					l.exited(last[f[1]], exitwatch.Status{Known: true, Signal: sig}, now)
				case "start":
					var pid int
					fmt.Sscanf(f[2], "%d", &pid)
					id := instanceOf(procscan.Process{PID: pid, StartTime: uint64(pid)})
					if old, ok := l.started(id, f[1], ""); ok {
						replaced = append(replaced, f[1]+"<"+old)
					}
					if was, ok := l.rename(id, f[1]); !ok || was != f[1] || !l.running(id) {
						t.Fatalf("%s: its main process is not its instance", step)
					}
					last[strings.Split(f[1], "-")[0]] = id
				case "exit":
					var code int
					fmt.Sscanf(f[2], "%d", &code)
					s := exitwatch.Status{Known: true, Code: code}
					if code < 0 {
						s = exitwatch.Status{Reason: "test"}
					}
					id := last[strings.Split(f[1], "-")[0]]
					if pid, ok := strings.CutPrefix(f[1], "#"); ok { // an instance by its PID
						var n int
						fmt.Sscanf(pid, "%d", &n)
						id = instanceOf(procscan.Process{PID: n, StartTime: uint64(n)})
					}
					l.exited(id, s, now)
				case "at":
					var s int
					fmt.Sscanf(f[1], "%d", &s)
					l.settle(t0.Add(time.Duration(s) * time.Second))
				case "missing":
					l.missing(nil, func(i int) string { return fmt.Sprintf("missing-%d", i+1) }, "never seen")
				default:
					t.Fatalf("bad step %q", step)
				}
			}
			if got := l.finished(); got != tt.finished {
				t.Errorf("finished = %v, want %v", got, tt.finished)
			}
			if got := l.seeking(); got != tt.seeking {
				t.Errorf("seeking = %v, want %v", got, tt.seeking)
			}
			var final []string
			for _, a := range l.final() {
				st := a.Status.String()
				if !a.Status.Known && a.Status.Reason == "" {
					st = "running"
				}
				final = append(final, a.Container+" "+st)
			}
			if diff := cmp.Diff(tt.final, strings.Join(final, ", ")); diff != "" {
				t.Errorf("final (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.replaced, strings.Join(replaced, ", ")); diff != "" {
				t.Errorf("replaced (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLedgerSettleNext: settle says when the next unknown wait ends.
func TestLedgerSettleNext(t *testing.T) {
	l := newLedger(OnFailure, 2, 10*time.Second, time.Hour)
	t0 := time.Unix(1000, 0)
	a, b := instance{pid: 1, start: 1}, instance{pid: 2, start: 2}
	l.started(a, "a", "")
	l.started(b, "b", "")
	l.exited(a, exitwatch.Status{Reason: "x"}, t0)
	l.exited(b, exitwatch.Status{Reason: "x"}, t0.Add(3*time.Second))
	expired, next := l.settle(t0.Add(time.Second))
	if len(expired) != 0 || !next.Equal(t0.Add(10*time.Second)) {
		t.Errorf("at 1s: expired %d, next %v", len(expired), next.Sub(t0))
	}
	expired, next = l.settle(t0.Add(11 * time.Second))
	if len(expired) != 1 || expired[0] != "a" || !next.Equal(t0.Add(13*time.Second)) {
		t.Errorf("at 11s: expired %v, next %v", expired, next.Sub(t0))
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 0, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second,
		6: 160 * time.Second, 7: 300 * time.Second, 30: 300 * time.Second} {
		if got := backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// initContainer is an app container as adopted from its runtime's init,
// before the exec of its program (procscan.Container.Init).
func initContainer(name string, pid int) procscan.Container {
	c := container(procscan.App, name, pid)
	c.Main.Comm, c.Processes[0].Comm, c.Init = "runc:[2:INIT]", "runc:[2:INIT]", true
	return c
}

// TestStartFailedIsNoEnd: seen in the soak (seed 123, Job 7). Under
// restartPolicy Never, an app adopted from its runtime's init was killed
// (SIGKILL) before its exec, as the runtime cleaned up a start that failed
// under a containerd restart; the kubelet started the container again, as
// it does a created container whatever the policy, and the new one ran for
// 9 s. The supervisor had taken the kill for the app's failure and killed
// istio-proxy under it. Now such a kill awaits the new start; once its
// program is seen running, a SIGKILL is the app's failure.
func TestStartFailedIsNoEnd(t *testing.T) {
	// found: the app adopted from its runtime's init, istio-proxy running.
	found := func(t *testing.T) (*harness, Config) {
		cfg := testConfig(t, "SUPERVISOR_RESTART_MARGIN=15s")
		h := start(t, cfg, initContainer("app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"message":"app found"`)
		return h, cfg
	}
	// The init's end before its exec: killed by the runtime, which removes
	// the container; or of unknown status (exit-status none, or gone
	// before its pidfd), as well a start that failed, so the same wait.
	for _, end := range []struct {
		name           string
		status         exitwatch.Status
		log, noRestart string
	}{
		{"killed", killed(exitwatch.SIGKILL),
			"app killed before its program ran: its start failed, and the kubelet starts it again whatever the restart policy; the sidecar stays up",
			"app unknown (killed (SIGKILL) as its runtime's init, and no new start was seen within 15s"},
		{"stopped", killed(exitwatch.SIGTERM),
			"app killed before its program ran: its start failed, and the kubelet starts it again whatever the restart policy; the sidecar stays up",
			"app unknown (killed (SIGTERM) as its runtime's init, and no new start was seen within 15s"},
		{"status unknown", unknownStatus(),
			"app ended before its program was seen running, its status unknown: its start may have failed, and the kubelet would start it again",
			"app unknown (ended as its runtime's init, its program never seen running (test), and no new start was seen within 15s"},
	} {
		t.Run(end.name+", started again", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, _ := found(t)
				h.pod.remove("app")
				h.proc(10).exit(end.status)
				waitLog(t, h, `"container":"app","restart":1,"backoff":0,"wait":`) // the new start awaited, as for a restart
				waitLog(t, h, `"message":"`+end.log)
				h.pod.add(container(procscan.App, "app-r1", 11))
				noSignalFor(t, h, time.Minute) // past the margin: the new start was seen
				h.proc(11).exit(exited(1))
				if res := h.finish(Failure, "SIGKILL 100"); !strings.HasPrefix(res.Summary, "failure: app-r1 exit 1") {
					t.Errorf("summary %q, want the new start's failure alone", res.Summary)
				}
			})
		})
		t.Run(end.name+", no new start", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, cfg := found(t)
				h.pod.remove("app")
				h.proc(10).exit(end.status)
				ended := time.Now()
				res := h.finish(Unknown, "SIGTERM 100")
				h.signalledAt(0, ended.Add(cfg.RestartMargin), "the first start's back-off (0) and the margin after its end")
				if !strings.Contains(res.Summary, end.noRestart) {
					t.Errorf("summary %q, want %q", res.Summary, end.noRestart)
				}
			})
		})
	}
	// Once its program is seen running, an end is the app's: at once.
	for _, end := range []struct {
		status          exitwatch.Status
		outcome         Outcome
		action, summary string
	}{
		{killed(exitwatch.SIGKILL), Failure, "SIGKILL 100", "failure: app killed by SIGKILL"},
		{unknownStatus(), Unknown, "SIGTERM 100", "unknown: app unknown (test)"},
	} {
		t.Run(end.outcome.String()+" once its program runs", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, cfg := found(t)
				h.pod.move(10, container(procscan.App, "app", 10)) // the exec
				before := h.pod.scanCount()
				for deadline := time.Now().Add(time.Minute); h.pod.scanCount() < before+1; time.Sleep(cfg.ScanInterval) { // a scan that sees it
					if time.Now().After(deadline) {
						t.Fatalf("no scan within a minute of the exec: an app adopted from its init is looked at until it runs its program; log:\n%s", h.logged())
					}
				}
				synctest.Wait() // the scan's containers handled
				h.proc(10).exit(end.status)
				ended := time.Now()
				res := h.finish(end.outcome, end.action)
				h.signalledAt(0, ended, "at once: its end is the app's")
				if !strings.HasPrefix(res.Summary, end.summary) {
					t.Errorf("summary %q, want it to start with %q", res.Summary, end.summary)
				}
			})
		})
	}
}

// TestInitLookedAtClosely: an app adopted as its runtime's init is scanned
// every fastInterval (for startingHot at most), as a container being set
// up is, so that its exec is seen even where its program runs for a few
// milliseconds; once the exec is seen, only every ScanInterval.
func TestInitLookedAtClosely(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_SCAN_INTERVAL=100ms")
		h := start(t, cfg, initContainer("app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"message":"app found"`)
		scansIn := func(d time.Duration) int {
			synctest.Wait()
			before := h.pod.scanCount()
			time.Sleep(d)
			synctest.Wait()
			return h.pod.scanCount() - before
		}
		if n := scansIn(cfg.ScanInterval); n < int(cfg.ScanInterval/fastInterval)/2 {
			t.Errorf("%d scans in %s while the app is its runtime's init, want one every %s", n, cfg.ScanInterval, fastInterval)
		}
		h.pod.move(10, container(procscan.App, "app", 10)) // the exec
		scansIn(cfg.ScanInterval)                          // seen
		if n := scansIn(3 * cfg.ScanInterval); n > 4 {
			t.Errorf("%d scans in %s once the exec is seen, want one every %s at most", n, 3*cfg.ScanInterval, cfg.ScanInterval)
		}
		h.proc(10).exit(exited(0))
		h.finish(Success, "SIGTERM 100")
	})
}
