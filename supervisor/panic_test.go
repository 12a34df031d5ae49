package supervisor

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Issue 23: no crash path. A panic anywhere in the loop (injected here in
// the scanner) still stops the sidecar once the apps it holds are done,
// with the on-unknown action, and says so.

// TestPanicDuringDiscovery: the second app is still being looked for when
// the scan panics; the first app still runs, so the sidecar is stopped
// only after it exits.
func TestPanicDuringDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, testConfig(t, "SUPERVISOR_APP_CONTAINERS=2"), func(h *harness) { h.pod.panicAt = 3 },
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		app := h.proc(10)
		waitLog(t, h, "the supervisor failed (a bug")
		noSignalFor(t, h, time.Hour) // the app still runs
		app.exit(exited(0))
		ended := time.Now()
		res := h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, ended, "at the app's end")
		if !strings.Contains(res.Summary, "the supervisor failed (injected panic at scan 3)") || !strings.Contains(res.Summary, "action SIGTERM") {
			t.Errorf("summary %q does not say what happened", res.Summary)
		}
		if !strings.Contains(h.logged(), `"stack":"goroutine`) {
			t.Errorf("no stack in the log:\n%s", h.logged())
		}
	})
}

// TestPanicTwice: the stop's scan for a late sidecar panics, and so
// does the recovery's: the second panic leaves the sidecar as it is and
// is an error (exit 1), never a hang.
func TestPanicTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, testConfig(t, "SUPERVISOR_SIDECAR_START_TIMEOUT=1s"), func(h *harness) { h.pod.panicAt, h.pod.panicAgain = 2, true },
			container(procscan.App, "app", 10))
		h.proc(10).exit(exited(0))
		_, err := h.wait()
		if err == nil || !strings.Contains(err.Error(), "the supervisor failed twice") {
			t.Fatalf("err = %v, want the double failure", err)
		}
		if got := h.kernel.sent(); len(got) != 0 {
			t.Errorf("signals %v after the second failure", got)
		}
	})
}

// TestPanicThenLateSidecar: the run panics before any sidecar has
// started; the recovery's stop still finds the sidecar that starts after
// the app's end, and stops it (a settled run adopts no app, but finds its
// sidecars).
func TestPanicThenLateSidecar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, testConfig(t, "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_SIDECAR_START_TIMEOUT=1m"), func(h *harness) { h.pod.panicAt = 3 },
			container(procscan.App, "app", 10))
		waitLog(t, h, "the supervisor failed (a bug")
		h.proc(10).exit(exited(0))
		waitLog(t, h, `"message":"no sidecar running yet: waiting for one"`)
		h.pod.add(container(procscan.Sidecar, "pilot-agent", 100))
		added := time.Now()
		h.finish(Unknown, "SIGTERM 100")
		h.signalledWithin(0, added, time.Second, "once the late sidecar runs")
	})
}
