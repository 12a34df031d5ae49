package supervisor

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// app1Attempt is the n-th attempt of container app1, named by the kubelet's
// mount: a container of its own (its cgroup), whose main process is pid,
// still its runtime's init if init.
func app1Attempt(n, pid int, init bool) procscan.Container {
	c := kubeContainer(procscan.App, "app1", "job", pid)
	if init {
		c.Main.Comm, c.Processes[0].Comm, c.Init = "runc:[2:INIT]", "runc:[2:INIT]", true
	}
	c.ID = "app1-attempt-" + string(rune('0'+n))
	return c
}

// TestDecisionWithdrawn: an app container started again after the
// decision, before any sidecar was touched, sends the run back to the
// wait (stop.go, appsAgain). The soak, seed 20261209, Job 62: under Never
// the runtime killed app1's first attempt as the kubelet restarted, the
// new kubelet started app1 again (a created container is started again
// whatever the policy), and istio-proxy, started late, was stopped under
// the second attempt. Here each attempt is a container of its own (its
// cgroup), named app1 by the kubelet's mount.
func TestDecisionWithdrawn(t *testing.T) {
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
				first := []procscan.Container{app1Attempt(0, 10, false)}
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
				h.pod.add(app1Attempt(1, 11, false))
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

// TestStartGivenUp: an app instance replaced while still its runtime's
// init is a start given up (app.abandoned), not waited for: the soak,
// seed 20261209, Job 131, where containerd restarted under app1's start,
// lost the created container (its init waited on its exec fifo until the
// pod went), the kubelet created app1 again, and the wait for the first
// init hung the Job. Whether it is seen replaced live, or by a supervisor
// carrying on from the journal (Job 131's standby); and an init that
// execs after all is waited for again.
func TestStartGivenUp(t *testing.T) {
	for _, tc := range []string{"live", "carried on", "exec after all"} {
		t.Run(tc, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := stateConfig(t, "SUPERVISOR_APPS=app1")
				named := func(h *harness) { h.pod.named = true }
				h := startWith(t, cfg, named, app1Attempt(0, 10, true), kubeContainer(procscan.Sidecar, "istio-proxy", "pilot-agent", 100))
				waitLog(t, h, `"message":"app found"`)
				if tc == "carried on" {
					h.pod.add(app1Attempt(1, 11, false))
					waitLog(t, h, `"message":"app restarted by the kubelet: watching the new container"`)
					kill(t, h)
					h = rerun(t, h, cfg)
					waitLog(t, h, `"message":"carrying on from the journal of the supervisor before"`)
				} else {
					h.pod.add(app1Attempt(1, 11, false))
					waitLog(t, h, `a start given up (the kubelet created its container again), not waited for`)
				}
				if tc == "exec after all" {
					before := h.pod.scanCount()
					h.pod.move(10, app1Attempt(0, 10, false))
					for deadline := time.Now().Add(time.Minute); h.pod.scanCount() < before+1; time.Sleep(cfg.ScanInterval) {
						if time.Now().After(deadline) {
							t.Fatalf("no scan within a minute of the exec: an init not seen running its program is looked at; log:\n%s", h.logged())
						}
					}
					synctest.Wait() // the scan's containers handled
					h.proc(11).exit(exited(0))
					noSignalFor(t, h, time.Minute) // the first attempt's program runs
					h.proc(10).exit(exited(0))
				} else {
					h.proc(11).exit(exited(0))
				}
				ended := time.Now()
				res := h.finish(Success, "SIGTERM 100")
				h.signalledWithin(0, ended, cfg.ScanInterval, "once the instance that ran its program ended")
				if !strings.HasPrefix(res.Summary, "success: app1 exit 0") {
					t.Errorf("summary %q", res.Summary)
				}
			})
		})
	}
}
