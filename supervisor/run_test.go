package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

func TestRunOutcomes(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		status   exitwatch.Status
		outcome  Outcome
		signals  []string
		posts    []string
		postErr  error
		postCode int
	}{
		{name: "exit 0", status: exited(0), outcome: Success, signals: []string{"SIGTERM 100"}},
		{name: "exit 3", status: exited(3), outcome: Failure, signals: []string{"SIGKILL 100"}},
		{name: "killed by SIGSEGV", status: killed(11), outcome: Failure, signals: []string{"SIGKILL 100"}},
		{name: "unknown", status: unknownStatus(), outcome: Unknown, signals: []string{"SIGTERM 100"}},
		{name: "custom actions", env: []string{"SUPERVISOR_ON_FAILURE=SIGINT"}, status: exited(1), outcome: Failure, signals: []string{"SIGINT 100"}},
		{name: "none", env: []string{"SUPERVISOR_ON_SUCCESS=none"}, status: exited(0), outcome: Success},
		{name: "http", env: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}, status: exited(0),
			outcome: Success, posts: []string{"http://127.0.0.1:15020/drain", "http://127.0.0.1:15020/quitquitquit"}},
		{name: "http answers an error", env: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}, status: exited(0),
			outcome: Success, posts: []string{"http://127.0.0.1:15020/drain", "http://127.0.0.1:15020/quitquitquit"}, postCode: 503,
			signals: []string{"SIGTERM 100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startWith(t, testConfig(t, tt.env...), func(h *harness) {
					h.err = tt.postErr
					if tt.postCode != 0 {
						h.code = tt.postCode
					}
					if tt.posts != nil && tt.postErr == nil && tt.postCode == 0 {
						// pilot-agent exits on its own once it has
						// answered /quitquitquit.
						h.answer = func(int) (int, error) {
							go h.kernel.proc(100).exit(exited(0))
							return 200, nil
						}
					}
				}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				h.proc(10).exit(tt.status)
				res, err := h.wait()
				if err != nil {
					t.Fatal(err)
				}
				if res.Outcome != tt.outcome || res.Deleted {
					t.Errorf("outcome %v deleted %v, want %v; log:\n%s", res.Outcome, res.Deleted, tt.outcome, h.logged())
				}
				if diff := cmp.Diff(tt.signals, h.kernel.sent()); diff != "" {
					t.Errorf("signals (-want +got):\n%s\nlog:\n%s", diff, h.logged())
				}
				if diff := cmp.Diff(tt.posts, h.postsSent()); diff != "" {
					t.Errorf("posts (-want +got):\n%s", diff)
				}
				if !strings.HasPrefix(res.Summary, tt.outcome.String()+": ") {
					t.Errorf("summary %q does not start with the outcome", res.Summary)
				}
			})
		})
	}
}

// TestRunTwoApps: the sidecar is stopped only after the second app is done.
func TestRunTwoApps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_APP_CONTAINERS=2"),
			container(procscan.App, "app-a", 10), container(procscan.Sidecar, "pilot-agent", 100))
		// The second app container starts later.
		time.Sleep(20 * time.Millisecond)
		h.pod.add(container(procscan.App, "app-b", 20))
		h.proc(10).exit(exited(0))
		b := h.proc(20)
		noSignalFor(t, h, time.Hour) // however long app-b runs
		b.exit(exited(0))
		ended := time.Now()
		res, err := h.wait()
		h.signalledAt(0, ended, "at app-b's end")
		if err != nil || res.Outcome != Success || len(res.Apps) != 2 {
			t.Fatalf("res %+v err %v", res, err)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestRunMissingApp: an expected app container never appears: bounded wait,
// then the unknown action.
func TestRunMissingApp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APP_START_TIMEOUT=50ms")
		began := time.Now()
		h := start(t, cfg, container(procscan.App, "app-a", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res, _ := h.wait()
		h.signalledAt(0, began.Add(cfg.AppStartTimeout), "APP_START_TIMEOUT after the start")
		if res.Outcome != Unknown || !strings.Contains(res.Reason, "never seen") {
			t.Errorf("outcome %v reason %q, want unknown/never seen", res.Outcome, res.Reason)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestRunAppGoneBeforeWatch: the app was scanned but exited before its
// pidfd could be opened: its status is unknown, not success.
func TestRunAppGoneBeforeWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pod := []procscan.Container{container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100)}
		k := newFakeKernel()
		k.gone[10] = true
		fp := &fakePod{containers: pod}
		cfg := testConfig(t)
		res, err := New(cfg, zerolog.Nop(), fp, k, nil).Run(context.Background())
		if err != nil || res.Outcome != Unknown {
			t.Fatalf("res %+v err %v, want unknown", res, err)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, k.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestRunLateSidecar: the app finished before the sidecar started; the
// supervisor waits for it, then stops it.
func TestRunLateSidecar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		h := start(t, cfg, container(procscan.App, "app", 10))
		h.proc(10).exit(exited(0))
		noSignalFor(t, h, 30*time.Millisecond) // no sidecar to signal yet
		h.pod.add(container(procscan.Sidecar, "pilot-agent", 100))
		came := time.Now()
		h.finish(Success, "SIGTERM 100")
		h.signalledWithin(0, came, cfg.ScanInterval, "at the first scan after the sidecar came")
	})
}

// TestRunNoSidecar: no sidecar ever appears: log it and finish.
func TestRunNoSidecar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_SIDECAR_START_TIMEOUT=50ms")
		h := start(t, cfg, container(procscan.App, "app", 10))
		h.proc(10).exit(exited(0))
		ended := time.Now()
		res, err := h.wait()
		if err != nil || !strings.Contains(res.Summary, "no sidecar appeared") {
			t.Fatalf("res %+v err %v", res, err)
		}
		if waited := time.Since(ended); waited != cfg.SidecarStartTimeout {
			t.Errorf("the run ended %v after the app, want SIDECAR_START_TIMEOUT (%v)", waited, cfg.SidecarStartTimeout)
		}
		if got := h.kernel.sent(); len(got) != 0 {
			t.Errorf("signals: %v", got)
		}
	})
}

// TestRunSidecarIgnoresSIGTERM: SIGKILL after the stop timeout.
func TestRunSidecarIgnoresSIGTERM(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_STOP_TIMEOUT=50ms")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
			if sig == exitwatch.SIGKILL {
				return &exitwatch.Status{Known: true, Signal: exitwatch.SIGKILL}
			}
			return nil
		})
		h.proc(10).exit(exited(0))
		res, err := h.wait()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100", "SIGKILL 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
		h.signalledAt(1, h.kernel.sentAt(0).Add(cfg.StopTimeout), "STOP_TIMEOUT after the SIGTERM")
		if !strings.Contains(res.Summary, "sent SIGKILL") {
			t.Errorf("summary %q does not mention the SIGKILL", res.Summary)
		}
	})
}

// TestRunDeletedMidWait: SIGTERM to the supervisor while the app runs: it
// returns at once and touches nothing.
func TestRunDeletedMidWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10)
		h.cancel()
		res, err := h.wait()
		if err != nil || !res.Deleted {
			t.Fatalf("res %+v err %v, want deleted", res, err)
		}
		if got := h.kernel.sent(); len(got) != 0 {
			t.Errorf("signals: %v", got)
		}
	})
}

// TestRunDeletionGrace: an app killed by SIGTERM is not a failure when the
// supervisor's own SIGTERM follows within the grace, even at its last
// instant; otherwise it is, once the grace is over.
func TestRunDeletionGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, deleted := range []bool{true, false} {
			for _, st := range []exitwatch.Status{killed(exitwatch.SIGTERM), exited(143)} {
				cfg := testConfig(t, "SUPERVISOR_DELETION_GRACE=1s")
				h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				h.proc(10).exit(st)
				ended := time.Now()
				if deleted {
					time.Sleep(cfg.DeletionGrace - just)
					h.cancel()
				}
				res, err := h.wait()
				if err != nil {
					t.Fatal(err)
				}
				var want []string
				if !deleted {
					want = []string{"SIGKILL 100"}
				}
				if res.Deleted != deleted || !cmp.Equal(want, h.kernel.sent()) {
					t.Errorf("%v, pod deleted %v: got deleted %v signals %v; log:\n%s", st, deleted, res.Deleted, h.kernel.sent(), h.logged())
				}
				if !deleted {
					h.signalledAt(0, ended.Add(cfg.DeletionGrace), "DELETION_GRACE after the app's end")
				}
			}
		}
	})
}

func TestRunNotShared(t *testing.T) {
	fp := &fakePod{containers: []procscan.Container{container(procscan.Self, "supervisor", 1)}}
	_, err := New(testConfig(t), zerolog.Nop(), fp, newFakeKernel(), nil).Run(context.Background())
	if !errors.Is(err, ErrNotShared) || !strings.Contains(err.Error(), "shareProcessNamespace: true") {
		t.Errorf("err = %v, want ErrNotShared naming the fix", err)
	}
}

func TestRunScanError(t *testing.T) {
	fp := &fakePod{err: errors.New("permission denied")}
	_, err := New(testConfig(t), zerolog.Nop(), fp, newFakeKernel(), nil).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "read /proc: permission denied") {
		t.Errorf("err = %v, want the /proc error", err)
	}
}

// TestRunLog: the log reads as a timeline of the run's events.
func TestRunLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		h.wait()
		var msgs []string
		for _, line := range strings.Split(strings.TrimSpace(h.logged()), "\n") {
			i := strings.Index(line, `"message":"`)
			msgs = append(msgs, strings.SplitN(line[i+11:], `"`, 2)[0])
		}
		want := []string{"app found", "sidecar found", "app exited", "decision", "sidecar signalled", "sidecar stopped"}
		if diff := cmp.Diff(want, msgs); diff != "" {
			t.Errorf("log messages (-want +got):\n%s\n%s", diff, h.logged())
		}
	})
}

// TestRunProgress: while it runs the supervisor keeps what it waits for in
// its termination-message file (for `status`); the summary replaces it.
func TestRunProgress(t *testing.T) {
	msg := filepath.Join(t.TempDir(), "termination-log")
	if err := os.WriteFile(msg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_TERMINATION_MESSAGE_PATH="+msg),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		p := h.proc(10)
		synctest.Wait() // the run waits for the app, its progress written
		b, _ := os.ReadFile(msg)
		got := string(b)
		for _, want := range []string{Progress + "waiting for app app (pid 10)", "app app (pid 10): running", "sidecar pilot-agent (pid 100): held"} {
			if !strings.Contains(got, want) {
				t.Errorf("progress %q lacks %q", got, want)
			}
		}
		p.exit(exited(0))
		h.finish(Success, "SIGTERM 100")
	})
}
