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
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_TIMEOUT=300ms")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		ended := time.Now()
		// The restart is awaited up to RESTART_TIMEOUT (under the default
		// margin), not a moment less, then no longer.
		noSignalUntil(t, h, ended.Add(cfg.RestartTimeout-just))
		res, _ := h.wait()
		h.signalledAt(0, ended.Add(cfg.RestartTimeout), "RESTART_TIMEOUT after the app's end")
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
		ended := time.Now()
		h.pod.add(container(procscan.App, "app-r1", 11))
		// The restart runs on past every bound of the first instance's
		// wait for it (the margin, 15 s, within RESTART_TIMEOUT).
		noSignalUntil(t, h, ended.Add(time.Minute))
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
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=300ms", "SUPERVISOR_RESTART_TIMEOUT=5m30s")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		ended := time.Now()
		noSignalUntil(t, h, ended.Add(cfg.RestartMargin-just))
		res := h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, ended.Add(cfg.RestartMargin), "the first restart's back-off (0) and the margin after the app's end")
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
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=100ms")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		ended := time.Now()
		h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, ended.Add(cfg.RestartMargin), "the margin after the app's end")
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
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=50ms", "SUPERVISOR_RESTART_TIMEOUT=400ms")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(1))
		ended := time.Now()
		// Past the back-off and the margin, up to RESTART_TIMEOUT.
		noSignalUntil(t, h, ended.Add(cfg.RestartTimeout-just))
		res := h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, ended.Add(cfg.RestartTimeout), "RESTART_TIMEOUT after the failure")
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
		ended := time.Now()
		// The unseen run of 17 ms, then the kubelet's back-off before
		// the next restart (10 s), far past the first one's back-off
		// plus the margin.
		noSignalUntil(t, h, ended.Add(17*time.Millisecond+backoff(2)))
		h.pod.add(container(procscan.App, "app-r2", 11))
		r2 := h.proc(11)
		noSignalFor(t, h, 100*time.Millisecond)
		r2.exit(exited(0))
		r2ended := time.Now()
		res, _ := h.wait()
		h.signalledAt(0, r2ended, "at the restart's end")
		if res.Outcome != Success {
			t.Errorf("outcome %v, want success; log:\n%s", res.Outcome, h.logged())
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestOnFailureShortRestartSeen: issue 32. A restart visible for a few tens
// of milliseconds (the runtime's init, then a run that fails at once),
// between two SCAN_INTERVAL scans, is seen all the same: the wait for it
// looks as discovery does (the kernel's last PID every 2 ms). Missed, it
// made the next restart come a back-off step later than counted, and with
// statuses unknown the sidecar was stopped under that run (the soak: 1 to 2
// Jobs in 38).
func TestOnFailureShortRestartSeen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_SCAN_INTERVAL=100ms",
			"SUPERVISOR_RESTART_MARGIN=1s", "SUPERVISOR_RESTART_TIMEOUT=5m30s")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(unknownStatus())
		// The kubelet's restart comes at once, and is gone 20 ms later:
		// well within one 100 ms scan interval.
		time.Sleep(10 * time.Millisecond)
		h.pod.add(container(procscan.App, "app-r1", 11))
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		p := h.kernel.proc(11)
		if p == nil {
			t.Fatalf("the restart that lived 20 ms was not seen; log:\n%s", h.logged())
		}
		h.pod.remove("app-r1")
		p.exit(unknownStatus())
		ended := time.Now()
		// Its end awaits the second restart: the back-off (10 s) and the
		// margin, not the first one's margin alone.
		noSignalUntil(t, h, ended.Add(backoff(2)+cfg.RestartMargin-just))
		h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, ended.Add(backoff(2)+cfg.RestartMargin), "the second restart's back-off and the margin after the unseen-no-more run")
	})
}
