package supervisor

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// Issue 32: a supervisor killed and started again by the kubelet carries on
// from the journal the killed one kept in SUPERVISOR_STATE_DIR. The killed
// one is a run cancelled at that point (its journal is written as each
// fact happens, so a kill leaves what a cancel does); the next one runs on
// the same pod and processes.

func stateConfig(t *testing.T, env ...string) Config {
	return testConfig(t, append([]string{"SUPERVISOR_STATE_DIR=" + t.TempDir()}, env...)...)
}

// kill ends h's run where it is, and waits for it.
func kill(t *testing.T, h *harness) {
	t.Helper()
	h.cancel()
	if _, err := h.wait(); err != nil {
		t.Fatal(err)
	}
}

// TestResumeAppRunning: killed while the app runs, the next supervisor
// watches the same app instance again at once (no new look for it), and
// stops the sidecar on its exit.
func TestResumeAppRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"message":"app found"`)
		synctest.Wait() // the run looks now
		if err := Ready(cfg.StateDir); err != nil {
			t.Errorf("no ready file once looking: %v", err)
		}
		kill(t, h)
		h2 := rerun(t, h, cfg)
		waitLog(t, h2, `"apps":1,"ended":0,"ended_unwatched":0,"ended_recorded":0,"watched":1,"sidecars":1,"sidecars_running":1`)
		h2.proc(10).exit(exited(0))
		res := h2.finish(Success, "SIGTERM 100")
		if strings.Contains(h2.logged(), `"message":"app found"`) {
			t.Errorf("the app was looked for again; log:\n%s", h2.logged())
		}
		if !strings.HasPrefix(res.Summary, "success: app exit 0") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestResumeNothingSeen: killed before it saw anything (an app of
// milliseconds missed on a loaded node, the soak's seed 20261206), the next
// supervisor still says it carries on from the one before, with nothing to
// take over, and looks for the app as the first one would have.
func TestResumeNothingSeen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		h := start(t, cfg)
		synctest.Wait() // the run looks now, and has seen nothing
		kill(t, h)
		h2 := rerun(t, h, cfg)
		waitLog(t, h2, `"apps":0,"ended":0,"ended_unwatched":0,"ended_recorded":0,"watched":0,"sidecars":0,"sidecars_running":0,"message":"carrying on from the journal of the supervisor before"`)
		h2.pod.add(container(procscan.App, "app", 10))
		h2.pod.add(container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h2, `"message":"app found"`)
		h2.proc(10).exit(exited(0))
		if res := h2.finish(Success, "SIGTERM 100"); !strings.HasPrefix(res.Summary, "success: app exit 0") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestResumeStatusKept: two apps; the first exits 0, the supervisor is
// killed, the second exits 0: success, the first one's status read back
// from the journal (without it, the first app would be looked for in vain
// and counted unknown).
func TestResumeStatusKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t, "SUPERVISOR_APP_CONTAINERS=2")
		h := start(t, cfg, container(procscan.App, "a1", 10), container(procscan.App, "a2", 11),
			container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"container":"a2","uid":0,"method":"fake","message":"app found"`)
		h.proc(10).exit(exited(0))
		waitLog(t, h, `"container":"a1","pid":10,"comm":"a1","method":"fake","exit_code":0,"message":"app exited"`)
		kill(t, h)
		h.pod.remove("a1") // gone with its container
		h2 := rerun(t, h, cfg)
		waitLog(t, h2, `"apps":2,"ended":1,"ended_unwatched":0,"ended_recorded":0,"watched":1`)
		began := time.Now()
		h2.proc(11).exit(exited(0))
		res := h2.finish(Success, "SIGTERM 100")
		h2.signalledAt(0, began, "at the second app's exit")
		if !strings.HasPrefix(res.Summary, "success: all 2 app containers exit 0") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestResumeEndedUnwatched: the app ends while no supervisor runs: no one
// in the pod can read its status any more. The next supervisor takes it as
// ended, status unknown, at once (no look for an app it knows it saw).
func TestResumeEndedUnwatched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"message":"app found"`)
		kill(t, h)
		h.proc(10).exit(exited(0))
		h.pod.remove("app")
		began := time.Now()
		h2 := rerun(t, h, cfg)
		res := h2.finish(Unknown, "SIGTERM 100")
		h2.signalledAt(0, began, "at once")
		if !strings.Contains(res.Summary, "it ended while no supervisor watched it") {
			t.Errorf("summary %q does not say why the status is unknown", res.Summary)
		}
	})
}

// TestResumeEndedRecorded: the app ends while no supervisor runs, with
// process accounting on: the next supervisor reads its status from the
// kernel's record. Under Never, a failure: SIGKILL at once. Under
// OnFailure, a record of exit 0, which reads unknown (exitwatch's
// acct_linux.go: the kernel writes 0 too for a threaded program whose
// main thread had not taken its code): the restart a failure would bring
// is awaited (its margin), then SIGTERM. The margin counts from the end
// the record gives, not from the restarted supervisor's start: the kubelet
// took seconds to restart it (dead).
func TestResumeEndedRecorded(t *testing.T) {
	zero := exitwatch.Status{Reason: "its accounting record says exit 0"}
	for _, tc := range []struct {
		name, policy string
		status       exitwatch.Status
		outcome      Outcome
		signal       string
		after, dead  time.Duration
	}{
		{"Never", "Never", exited(3), Failure, "SIGKILL 100", 0, 0},
		{"Never, back 10s after the end", "Never", exited(3), Failure, "SIGKILL 100", 0, 10 * time.Second},
		{"OnFailure", "OnFailure", zero, Unknown, "SIGTERM 100", 15 * time.Second, 0},
		{"OnFailure, back 10s after the end", "OnFailure", zero, Unknown, "SIGTERM 100", 15 * time.Second, 10 * time.Second},
		{"OnFailure, back 20s after the end", "OnFailure", zero, Unknown, "SIGTERM 100", 15 * time.Second, 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := stateConfig(t, "SUPERVISOR_RESTART_POLICY="+tc.policy, "SUPERVISOR_RESTART_MARGIN=15s")
				h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				waitLog(t, h, `"message":"app found"`)
				kill(t, h)
				h.proc(10).exit(tc.status)
				h.kernel.writeRecord(10, tc.status)
				ended := time.Now()
				h.pod.remove("app")
				time.Sleep(tc.dead)
				h2 := rerun(t, h, cfg)
				h2.finish(tc.outcome, tc.signal)
				h2.signalledAt(0, ended.Add(max(tc.after, tc.dead)), "the record read at once; for exit 0 under OnFailure, the margin after the end it records")
				waitLog(t, h2, `"ended_unwatched":0,"ended_recorded":1`)
			})
		})
	}
}

// TestAnchor: each sidecar found is offered to keep accounting on past the
// supervisor's container (exitwatch's Anchor), and the log says what came
// of it: done, or why not.
func TestAnchor(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		log  string
	}{
		{"done", nil, `"pid":100,"container":"pilot-agent","message":"accounting goes through the sidecar's mount of the state directory`},
		{"refused", errors.New("no CAP_SYS_PTRACE"), `"why":"no CAP_SYS_PTRACE","message":"accounting ends with this supervisor's container`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startWith(t, stateConfig(t), func(h *harness) { h.kernel.anchors, h.kernel.anchorErr = true, tc.err },
					container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				waitLog(t, h, tc.log)
				h.proc(10).exit(exited(0))
				h.finish(Success, "SIGTERM 100")
				if got := h.kernel.anchoredPIDs(); !slices.Equal(got, []int{100}) {
					t.Errorf("Anchor given %v, want the sidecar's main process, 100", got)
				}
			})
		})
	}
}

// TestAnchorSidecarLate: istio-proxy starts after the apps (no hold); on a
// loaded node, seconds after every app was found. Where accounting can be
// anchored, the wait looks for it (SCAN_INTERVAL) and anchors through it
// while the app runs; if none comes within APP_START_TIMEOUT, it says so
// and looks no more. Where it cannot, the wait does not look at all.
func TestAnchorSidecarLate(t *testing.T) {
	const anchoredMsg = `"message":"accounting goes through the sidecar's mount of the state directory`
	const noneMsg = `"message":"no sidecar seen within SUPERVISOR_APP_START_TIMEOUT of the apps`
	for _, tc := range []struct {
		name     string
		anchors  bool
		after    float64 // when the sidecar starts, from the wait's start, in APP_START_TIMEOUTs
		anchored bool
	}{
		{"found while the app runs", true, 0.9, true},
		{"too late", true, 1.1, false},
		{"cannot anchor", false, 0.5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := stateConfig(t)
				h := startWith(t, cfg, func(h *harness) { h.kernel.anchors = tc.anchors }, container(procscan.App, "app", 10))
				waitLog(t, h, `"message":"app found"`)
				synctest.Wait() // the wait has begun
				time.Sleep(time.Duration(tc.after * float64(cfg.AppStartTimeout)))
				h.pod.add(container(procscan.Sidecar, "pilot-agent", 100))
				time.Sleep(time.Second)
				synctest.Wait()
				if got := strings.Contains(h.logged(), anchoredMsg); got != tc.anchored {
					t.Errorf("anchored while the app runs: %v, want %v; log:\n%s", got, tc.anchored, h.logged())
				}
				if got, want := strings.Contains(h.logged(), noneMsg), tc.anchors && !tc.anchored; got != want {
					t.Errorf("said no sidecar came: %v, want %v; log:\n%s", got, want, h.logged())
				}
				h.proc(10).exit(exited(0))
				h.finish(Success, "SIGTERM 100")
			})
		})
	}
}

// TestResumeAfterStop: the sidecar was stopped and seen to exit before the
// supervisor died (the native shape's restart, or a kill in its last
// moments): the next one finds nothing to stop and waits for nothing
// (without the journal: SIDECAR_START_TIMEOUT for a sidecar to appear).
func TestResumeAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		h.finish(Success, "SIGTERM 100")
		h.pod.remove("app")
		h.pod.remove("pilot-agent")
		began := time.Now()
		h2 := rerun(t, h, cfg)
		res, err := h2.wait()
		if err != nil || res.Outcome != Success {
			t.Fatalf("res %+v err %v; log:\n%s", res, err, h2.logged())
		}
		if d := time.Since(began); d != 0 {
			t.Errorf("the restarted supervisor took %v, want no wait at all", d)
		}
		if !strings.Contains(res.Summary, "sidecars exited before the supervisor's restart") {
			t.Errorf("summary %q", res.Summary)
		}
		if got := h.kernel.sent(); len(got) != 1 {
			t.Errorf("signals %v: the restarted supervisor signalled again", got)
		}
	})
}

// TestResumeOnFailure: under OnFailure the app failed once (seen), the
// supervisor is killed, the restart runs and succeeds: the next supervisor
// adopts the restart as the same slot's, and the outcome is success (the
// failed run superseded), not a second app nor an unknown.
func TestResumeOnFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(1))
		waitLog(t, h, `"message":"app failed under restartPolicy OnFailure: the kubelet restarts it, the sidecar stays up"`)
		kill(t, h)
		h.pod.remove("app")
		h.pod.add(container(procscan.App, "app-r1", 11))
		h2 := rerun(t, h, cfg)
		waitLog(t, h2, `"message":"app restarted by the kubelet: watching the new container"`)
		h2.proc(11).exit(exited(0))
		res := h2.finish(Success, "SIGTERM 100")
		if !strings.HasPrefix(res.Summary, "success: app-r1 exit 0") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestResumeContradicted: a journal /proc contradicts (it says an app
// ended whose process runs) is ignored whole: the run starts over, as a
// first one, and says why.
func TestResumeContradicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		head := journalHead("", cfg)
		end := entry{Kind: "end", ID: &entryInstance{PID: 10, Start: 10}, Status: &entryStatus{Known: true}, At: 1}
		app := entry{Kind: "app", ID: &entryInstance{PID: 10, Start: 10}, Container: "app"}
		j, err := createJournal(cfg.StateDir, head, []entry{app, end})
		if err != nil {
			t.Fatal(err)
		}
		j.close()
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"reason":"it says process 10 ended, and it runs","message":"the journal of an earlier supervisor is ignored: starting over"`)
		waitLog(t, h, `"message":"app found"`)
		h.proc(10).exit(exited(3))
		h.finish(Failure, "SIGKILL 100")
	})
}

// TestResumeEndedExiting: the journal says the app ended, and its main
// process is still there, exiting (a zombie its runtime has not reaped
// yet): what a standby finds when it leads within milliseconds of the
// leader's death. The journal stands; the status it holds is the app's.
func TestResumeEndedExiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		head := journalHead("", cfg)
		end := entry{Kind: "end", ID: &entryInstance{PID: 10, Start: 10}, Status: &entryStatus{Known: true, Code: 3}, At: 1}
		app := entry{Kind: "app", ID: &entryInstance{PID: 10, Start: 10}, Container: "app"}
		j, err := createJournal(cfg.StateDir, head, []entry{app, end})
		if err != nil {
			t.Fatal(err)
		}
		j.close()
		exiting := container(procscan.App, "app", 10)
		exiting.Main.Exiting, exiting.Main.State = true, "Z"
		h := start(t, cfg, exiting, container(procscan.Sidecar, "pilot-agent", 100))
		res := h.finish(Failure, "SIGKILL 100")
		if strings.Contains(h.logged(), "the journal of an earlier supervisor is ignored") || !strings.HasPrefix(res.Summary, "failure: app exit 3") {
			t.Errorf("summary %q; log:\n%s", res.Summary, h.logged())
		}
	})
}

// TestResumeSidecarGoneUnseen: killed during the stop, after its SIGTERM
// but before the sidecar's exit was seen; the sidecar exits meanwhile. The
// next supervisor finds it gone (it runs no more: a fact) and waits for no
// sidecar to appear.
func TestResumeSidecarGoneUnseen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := stateConfig(t)
		h := startWith(t, cfg, func(h *harness) {
			h.kernel.setOnSignal(func(exitwatch.Signal) *exitwatch.Status { return nil }) // drains on
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		waitLog(t, h, `"message":"sidecar signalled"`)
		kill(t, h)
		h.proc(100).exit(exited(0))
		h.pod.remove("app")
		h.pod.remove("pilot-agent")
		began := time.Now()
		h2 := rerun(t, h, cfg)
		res, err := h2.wait()
		if err != nil || res.Outcome != Success || time.Since(began) != 0 {
			t.Fatalf("res %+v err %v after %v; log:\n%s", res, err, time.Since(began), h2.logged())
		}
		if !strings.Contains(res.Summary, "sidecars exited before the supervisor's restart") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestResumeInit: killed while an app is still its runtime's init, the
// next supervisor reads from /proc whether it still is: a kill before its
// exec is then a failed start, awaiting its new start (TestStartFailedIsNoEnd),
// and a kill after an exec that happened while no supervisor watched is
// the app's failure.
func TestResumeInit(t *testing.T) {
	killedAfterRestart := func(t *testing.T, execd bool) (*harness, Config) {
		cfg := stateConfig(t, "SUPERVISOR_RESTART_MARGIN=15s")
		h := start(t, cfg, initContainer("app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		waitLog(t, h, `"message":"app found"`)
		synctest.Wait()
		kill(t, h)
		if execd {
			h.pod.move(10, container(procscan.App, "app", 10))
		}
		h2 := rerun(t, h, cfg)
		waitLog(t, h2, `"apps":1,"ended":0,"ended_unwatched":0,"ended_recorded":0,"watched":1`)
		if !execd {
			h2.pod.remove("app")
		}
		h2.proc(10).exit(killed(exitwatch.SIGKILL))
		return h2, cfg
	}
	t.Run("still its init", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h, cfg := killedAfterRestart(t, false)
			ended := time.Now()
			waitLog(t, h, `"message":"app killed before its program ran: its start failed, and the kubelet starts it again whatever the restart policy; the sidecar stays up"`)
			res := h.finish(Unknown, "SIGTERM 100")
			h.signalledAt(0, ended.Add(cfg.RestartMargin), "the margin after the kill: no new start came")
			if !strings.Contains(res.Summary, "app unknown (killed (SIGKILL) as its runtime's init") {
				t.Errorf("summary %q", res.Summary)
			}
		})
	})
	t.Run("execd meanwhile", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h, _ := killedAfterRestart(t, true)
			ended := time.Now()
			res := h.finish(Failure, "SIGKILL 100")
			h.signalledAt(0, ended, "at once: the app failed")
			if !strings.HasPrefix(res.Summary, "failure: app killed by SIGKILL") {
				t.Errorf("summary %q", res.Summary)
			}
		})
	})
}
