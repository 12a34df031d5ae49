package supervisor

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// OnFailure without exit statuses (issue 19), and failed runs whose restart
// is never seen (issue 23's soak).

// TestOnFailureUnknown: with no status, a restart is awaited for
// RestartTimeout; none comes, so the app is taken as finished (unknown).
func TestOnFailureUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_TIMEOUT=300ms"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		noSignalFor(t, h, 150*time.Millisecond)
		res, _ := h.wait()
		if res.Outcome != Unknown {
			t.Errorf("outcome %v, want unknown", res.Outcome)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestOnFailureUnknownRestarted: an unknown status followed by a restart
// was a failure after all: the new container is watched.
func TestOnFailureUnknownRestarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_TIMEOUT=1m"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		h.pod.add(container(procscan.App, "app-r1", 11))
		noSignalFor(t, h, 100*time.Millisecond)
		h.proc(11).exit(exited(0))
		res, _ := h.wait()
		if res.Outcome != Success {
			t.Errorf("outcome %v, want success; log:\n%s", res.Outcome, h.logged())
		}
	})
}

// TestOnFailureUnknownByBackoff: issue 19. Statuses unknown (Linux before
// 6.15 without CAP_SYS_PTRACE): each instance waits for the restart the
// kubelet would make if it had failed, by its back-off for that restart
// (0 for the first, 10 s for the second...) plus the margin. A first run
// that succeeded is finished after the margin alone, not RESTART_TIMEOUT.
func TestOnFailureUnknownByBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=300ms", "SUPERVISOR_RESTART_TIMEOUT=5m30s"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		noSignalFor(t, h, 150*time.Millisecond)
		res := h.finish(Unknown, "SIGTERM 100")
		if !strings.Contains(h.logged(), `"restart":1,"backoff":0,"margin":300,"wait":300`) {
			t.Errorf("the wait is not explained in the log:\n%s", h.logged())
		}
		if !strings.Contains(res.Summary, "unknown: app unknown") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestOnFailureUnknownLateRestart: where the margin is wrong. A restart
// that comes after the kubelet's back-off plus the margin (a node so slow
// that the kubelet took longer to start it) finds the sidecar stopped: the
// supervisor took the app as finished, said so, and stopped it; the late
// instance then runs without the sidecar (and, under OnFailure, a sidecar
// that exited 0 is not restarted). The supervisor has ended by then.
func TestOnFailureUnknownLateRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=100ms"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		h.finish(Unknown, "SIGTERM 100")
		h.pod.add(container(procscan.App, "app-r1", 11)) // too late
		if !strings.Contains(h.logged(), "no restart came: taking the app as finished, status unknown") {
			t.Errorf("the expiry is not logged:\n%s", h.logged())
		}
	})
}

// TestOnFailureRestartUnseen: issue 23's soak (seed 1, Job 8). A failed
// app's restarts can run and end between two scans, and leave nothing to
// see: a failed instance awaits its restart for SUPERVISOR_RESTART_TIMEOUT,
// the outer bound, then counts as finished, its status unknown (the
// restart ran unseen, or is late), and the sidecar gets ON_UNKNOWN: the Job
// ends late, but ends.
func TestOnFailureRestartUnseen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=50ms", "SUPERVISOR_RESTART_TIMEOUT=400ms"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(1))
		noSignalFor(t, h, 200*time.Millisecond) // past the back-off and the margin
		res := h.finish(Unknown, "SIGTERM 100")
		if !strings.Contains(res.Summary, "exit 1, and no restart was seen within 400ms: it ran between two scans, or is late") {
			t.Errorf("summary %q does not say why", res.Summary)
		}
	})
}

// TestOnFailureUnseenRestartFailed: the soak (seed 20261203, Job 131). The
// app failed (seen); its restart ran 17 ms between two scans and failed
// too; the kubelet's next restart came after the next, longer back-off,
// counted from an end nobody saw: past the first restart's back-off plus
// the margin. The sidecar must not be stopped before that run ends.
func TestOnFailureUnseenRestartFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=50ms", "SUPERVISOR_RESTART_TIMEOUT=1m"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(42))
		noSignalFor(t, h, 300*time.Millisecond) // the unseen run, then the back-off
		h.pod.add(container(procscan.App, "app-r2", 11))
		noSignalFor(t, h, 100*time.Millisecond)
		h.proc(11).exit(exited(0))
		res, _ := h.wait()
		if res.Outcome != Success {
			t.Errorf("outcome %v, want success; log:\n%s", res.Outcome, h.logged())
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}
