package supervisor

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// TestDecisionWithdrawn: an app container started again after the
// decision, before any sidecar was touched, sends the run back to the
// wait (stop.go, appsAgain). The soak, seed 20261209, Job 62: under Never
// the runtime killed app1's first attempt as the kubelet restarted, the
// new kubelet started app1 again (a created container is started again
// whatever the policy), and istio-proxy, started late, was stopped under
// the second attempt. Here each attempt is a container of its own (its
// cgroup), named app1 by the kubelet's mount.
func TestDecisionWithdrawn(t *testing.T) {
	attempt := func(n, pid int) procscan.Container {
		c := kubeContainer(procscan.App, "app1", "job", pid)
		c.ID = "app1-attempt-" + string(rune('0'+n))
		return c
	}
	for _, tc := range []struct {
		name string
		// sidecar is in the pod from the start, not handling SIGTERM yet
		// (the wait for its handler; the action a graceful one: status
		// unknown); else none has started yet (the wait for one).
		sidecar bool
		end     exitwatch.Status // the first attempt's
		first   string           // the first decision, as the summary says it
	}{
		{"no sidecar yet", false, killed(exitwatch.SIGKILL), "failure: app1 killed by SIGKILL"},
		{"sidecar not handling its signal yet", true, exitwatch.Status{Reason: "no status"}, "unknown: app1 unknown (no status)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t, "SUPERVISOR_APPS=app1", "SUPERVISOR_ON_SUCCESS=SIGTERM", "SUPERVISOR_SIDECAR_START_TIMEOUT=30s")
				proxy := kubeContainer(procscan.Sidecar, "istio-proxy", "pilot-agent", 100)
				first := []procscan.Container{attempt(0, 10)}
				if tc.sidecar {
					first = append(first, proxy)
				}
				h := startWith(t, cfg, func(h *harness) {
					h.pod.named = true
					if tc.sidecar {
						h.pod.setUnhandled(100, true)
					}
				}, first...)
				h.proc(10).exit(tc.end) // the runtime's cleanup
				h.pod.remove("app1-attempt-0")
				if tc.sidecar {
					waitLog(t, h, `"message":"sidecar would die of the signal now: waiting until it handles it"`)
				} else {
					waitLog(t, h, `"message":"no sidecar running yet: waiting for one"`)
				}
				h.pod.add(attempt(1, 11))
				waitLog(t, h, `decision withdrawn, the sidecars stay up until it ends`)
				if !tc.sidecar {
					h.pod.add(proxy)
				} else {
					h.pod.setUnhandled(100, false)
				}
				noSignalFor(t, h, time.Minute) // the second attempt runs
				h.proc(11).exit(exited(0))
				ended := time.Now()
				res := h.finish(Success, "SIGTERM 100")
				h.signalledWithin(0, ended, cfg.ScanInterval, "once the second attempt ended")
				for _, want := range []string{"success: app1 exit 0", "decision withdrawn (" + tc.first + "): an app container started again"} {
					if !strings.Contains(res.Summary, want) {
						t.Errorf("summary %q, want it to say %q", res.Summary, want)
					}
				}
			})
		})
	}
}
