package supervisor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// guarded runs a pod of one app and pilot-agent (pid 100) to its stop,
// pilot-agent exiting first (its exit on the first SIGTERM), then Guard
// with the run's result in the background: done closes when it returns.
func guarded(t *testing.T, cfg Config, first int) (h *harness, res Result, cancel context.CancelFunc, done chan struct{}) {
	h = start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
		if len(h.kernel.sent()) == 1 {
			return &exitwatch.Status{Known: true, Code: first}
		}
		return &exitwatch.Status{Known: true}
	})
	h.proc(10).exit(exited(0))
	res = h.finish(Success, "SIGTERM 100")
	h.pod.remove("pilot-agent")
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		New(cfg, zerolog.New(h.logw), h.pod, h.kernel, nil).Guard(ctx, res)
		close(done)
	}()
	return h, res, cancel, done
}

func returned(done chan struct{}) bool {
	synctest.Wait()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// TestGuardNative: seed 20261210, Job 126. containerd, restarted as
// istio-proxy exited after the supervisor's quit, lost its exit (255,
// "Unknown"), and the kubelet started istio-proxy again under OnFailure:
// the Job hung. Seed 20261217, Job 64: under Never, the kubelet started
// istio-proxy again after its start failed. A native supervisor, idle
// until the kubelet stops it, stops such a sidecar again, maxStopRounds
// times at most, whatever its exit seemed, under either policy.
func TestGuardNative(t *testing.T) {
	for _, policy := range []string{"OnFailure", "Never"} {
		t.Run(policy, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY="+policy, "SUPERVISOR_SHAPE=native", "SUPERVISOR_STATE_DIR="+t.TempDir())
				h, _, cancel, done := guarded(t, cfg, 0)
				want := []string{"SIGTERM 100"}
				for round := 1; round <= maxStopRounds+1; round++ {
					pid := 100 + round
					h.pod.add(container(procscan.Sidecar, "pilot-agent", pid)) // the kubelet's restart
					time.Sleep(10 * cfg.ScanInterval)
					synctest.Wait()
					if round <= maxStopRounds {
						want = append(want, fmt.Sprintf("SIGTERM %d", pid))
					}
					if got := h.kernel.sent(); !slices.Equal(got, want) {
						t.Fatalf("round %d: signals %q, want %q; log:\n%s", round, got, want, h.logged())
					}
					h.pod.remove("pilot-agent")
				}
				if again := strings.Count(h.logged(), "runs again after the stop"); again != maxStopRounds {
					t.Errorf("%d sidecars said to run again; log:\n%s", again, h.logged())
				}
				if returned(done) {
					t.Fatal("Guard returned before the kubelet's SIGTERM")
				}
				cancel()
				<-done
			})
		})
	}
}

// TestGuardContainer: a container supervisor has exited when the kubelet
// starts a sidecar again, unless it knows a restart comes: the sidecar's
// exit after the stop was not 0 (Result.Restarting). It then waits for
// the restart (at most its back-off plus RESTART_MARGIN) and stops the new
// instance; once that one has exited 0 it is done.
func TestGuardContainer(t *testing.T) {
	t.Run("exit 0: nothing to wait for", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, res, _, done := guarded(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure"), 0)
			if len(res.Restarting) != 0 || !returned(done) {
				t.Errorf("restarting %q, returned %v; want none, at once", res.Restarting, returned(done))
			}
		})
	})
	t.Run("exit 1, restarted, stopped again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure")
			h, res, _, done := guarded(t, cfg, 1)
			if !slices.Equal(res.Restarting, []string{"pilot-agent"}) || !strings.Contains(res.Summary, "pilot-agent exited 1: the kubelet will restart it") {
				t.Fatalf("restarting %q, summary %q", res.Restarting, res.Summary)
			}
			time.Sleep(time.Second)
			if returned(done) {
				t.Fatalf("Guard returned before the restart; log:\n%s", h.logged())
			}
			h.pod.add(container(procscan.Sidecar, "pilot-agent", 101))
			time.Sleep(10 * cfg.ScanInterval)
			if !returned(done) || !slices.Equal(h.kernel.sent(), []string{"SIGTERM 100", "SIGTERM 101"}) {
				t.Errorf("signals %q, returned %v; want the new one SIGTERMed, then done; log:\n%s", h.kernel.sent(), returned(done), h.logged())
			}
		})
	})
	// The restarted sidecar does not handle SIGTERM at first: the wait
	// for its handler adopts no app (Guard's run has no ledger: the first
	// proof of 5025a1c panicked there, e2e TestSidecarBackAfterStop).
	t.Run("exit 1, restarted, its handler awaited", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure")
			h, _, _, done := guarded(t, cfg, 1)
			h.pod.setUnhandled(101, true)
			h.pod.add(container(procscan.Sidecar, "pilot-agent", 101))
			waitLog(t, h, `"message":"sidecar would die of the signal now: waiting until it handles it"`)
			time.Sleep(10 * cfg.ScanInterval)
			synctest.Wait()
			if len(h.kernel.sent()) != 1 {
				t.Fatalf("signals %q before the handler", h.kernel.sent())
			}
			h.pod.setUnhandled(101, false)
			time.Sleep(10 * cfg.ScanInterval)
			if !returned(done) || !slices.Equal(h.kernel.sent(), []string{"SIGTERM 100", "SIGTERM 101"}) {
				t.Errorf("signals %q, returned %v; want the new one SIGTERMed once it handles it, then done; log:\n%s", h.kernel.sent(), returned(done), h.logged())
			}
		})
	})
	t.Run("exit 1, no restart", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=15s")
			h, _, _, done := guarded(t, cfg, 1)
			time.Sleep(cfg.RestartMargin - time.Millisecond)
			if returned(done) {
				t.Fatal("Guard returned before its bound")
			}
			time.Sleep(2 * time.Millisecond)
			if !returned(done) || !strings.Contains(h.logged(), "no restart of the sidecars came") {
				t.Errorf("returned %v; want done at RESTART_MARGIN; log:\n%s", returned(done), h.logged())
			}
		})
	})
}

// TestGuardLeavesWhatTheStopActedOn: a sidecar the run's stop could not
// signal (another uid, no CAP_KILL) runs on after the stop. A native
// supervisor's Guard, under either policy, does not take it for one the
// kubelet started again: it is the same process, which the stop acted on.
func TestGuardLeavesWhatTheStopActedOn(t *testing.T) {
	for _, policy := range []string{"OnFailure", "Never"} {
		t.Run(policy, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY="+policy, "SUPERVISOR_SHAPE=native", "SUPERVISOR_STATE_DIR="+t.TempDir())
				h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				h.kernel.refuse(100)
				h.proc(10).exit(exited(0))
				res, err := h.wait()
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					New(cfg, zerolog.New(h.logw), h.pod, h.kernel, nil).Guard(ctx, res)
					close(done)
				}()
				time.Sleep(10 * cfg.ScanInterval)
				synctest.Wait()
				if got := h.kernel.sent(); !slices.Equal(got, []string{"SIGTERM 100"}) {
					t.Errorf("signals %q, want the stop's SIGTERM alone; log:\n%s", got, h.logged())
				}
				if strings.Contains(h.logged(), "runs again after the stop") {
					t.Errorf("the refused sidecar taken for one started again; log:\n%s", h.logged())
				}
				cancel()
				<-done
			})
		})
	}
}
