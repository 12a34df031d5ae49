package scenarios

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// unseenBound bounds the stop once the supervisor runs again: far above
// the supervisor's own wait for the restart of a failed run
// (SUPERVISOR_RESTART_TIMEOUT, 5s here), far below "never".
const unseenBound = 60 * time.Second

// TestRestartUnseen: issue 23's soak on the real cluster (e2e/soak.sh,
// seed 1, Job 8: OnFailure, app1 947ms→1 27ms→255 11ms→0, app2
// 6.815s→0). app1's first run failed and the supervisor saw it; the
// kubelet's restarts of app1 then ran 27 ms (exit 255) and, after the
// back-off, 11 ms (exit 0), each between two of the supervisor's scans
// (100 ms apart): it saw neither, kept waiting for the restart of the first
// run, and the Job stayed Running with istio-proxy up, for good.
//
// Here the restart is kept from the supervisor every time, not by chance:
// the supervisor is stopped (SIGSTOP) from before the first run ends until
// the restart has run and exited 0, then continued. Every app run is then
// over and nothing will restart it; the supervisor must stop istio-proxy,
// after the last run's end and within unseenBound.
func TestRestartUnseen(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		d := Desc{Name: "unseen", Policy: pod.OnFailure,
			Apps:          []App{{Name: "app", Args: []string{"--fail-first", "1"}, Cued: true}},
			SupervisorEnv: patient("SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=2s", "SUPERVISOR_RESTART_TIMEOUT=5s")}
		built := b.MustBuild(t, d)
		stampFiles := withStamps(&built, []string{"app"})
		p := Start(t, built)
		WaitLogFor(t, p, "app found", "app")
		if err := p.Signal("supervisor", syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		continued := false
		cont := func() {
			if !continued {
				continued = true
				if err := p.Signal("supervisor", syscall.SIGCONT); err != nil {
					t.Error(err)
				}
			}
		}
		defer cont()
		// The first run fails; the restart, cued too, exits 0 (the
		// simulated kubelet restarts a failed app after 200ms).
		if err := built.Release("app"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), EventBound)
		defer cancel()
		if _, err := p.WaitFor(ctx, func(s pod.Status) bool { return s.Container("app").Restarts == 1 }); err != nil {
			t.Fatalf("the app was not restarted: %v", err)
		}
		if err := built.Release("app"); err != nil {
			t.Fatal(err)
		}
		if _, err := p.WaitFor(ctx, func(s pod.Status) bool {
			c := s.Container("app")
			return c.Restarts == 1 && c.Started && !c.Running
		}); err != nil {
			t.Fatalf("the app's restart did not end: %v", err)
		}
		if c := p.Status().Container("app"); c.ExitCode != 0 {
			t.Fatalf("the app's restart exited %d, want 0", c.ExitCode)
		}
		lastEnd := time.Now()
		cont()

		wctx, wcancel := context.WithTimeout(context.Background(), unseenBound)
		defer wcancel()
		st, err := p.WaitPhase(wctx)
		if err != nil {
			t.Fatalf("every app run ended (the restart exit 0) and none will come, but istio-proxy still runs %s after the supervisor was continued: "+
				"it waits for a restart it never saw (%v)", unseenBound, err)
		}
		succeeded(t, st)
		ends, signalled := appEnds(stampFiles), signalledAt(p)
		if len(ends) != 2 {
			t.Fatalf("%d app runs stamped their end, want 2", len(ends))
		}
		last := slices.MaxFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
		// The log's time is cut to the millisecond.
		if signalled.IsZero() || signalled.Add(time.Millisecond).Before(last) {
			t.Errorf("istio-proxy signalled at %s, want it after the last run's end at %s",
				signalled.Format("15:04:05.000000"), last.Format("15:04:05.000000"))
		}
		t.Logf("istio-proxy signalled %s after the restart's end; summary %q",
			signalledAt(p).Sub(lastEnd).Round(time.Millisecond), strings.TrimSpace(p.TerminationMessage("supervisor")))
	})
}
