package supervisor

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Issue 16: a clean stop never kills a sidecar by the signal's default
// action.

// TestStopWaitsForHandler: a sidecar that neither catches nor ignores
// SIGTERM yet (SigCgt, SigIgn) gets it only once it does.
func TestStopWaitsForHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.pod.setUnhandled(100, true)
		h.proc(10).exit(exited(0))
		waitLog(t, h, `"message":"sidecar would die of the signal now: waiting until it handles it"`)
		noSignalFor(t, h, 100*time.Millisecond)
		h.pod.setUnhandled(100, false)
		handled := time.Now()
		h.finish(Success, "SIGTERM 100")
		h.signalledWithin(0, handled, cfg.ScanInterval, "at the first look once it handles SIGTERM")
		if !strings.Contains(h.logged(), `"message":"sidecar handles the signal now"`) {
			t.Errorf("no log of the handler; log:\n%s", h.logged())
		}
	})
}

// TestStopWaitsForEnvoy: pilot-agent's Go runtime catches SIGTERM from its
// start, but pilot-agent asks for it (signal.Notify) only just before it
// starts envoy: until envoy runs, SIGTERM would kill it (143). Where the
// kernel's dispositions cannot be read (gVisor's status has no SigCgt),
// envoy's start still decides, and the log says once why.
func TestStopWaitsForEnvoy(t *testing.T) {
	for _, blind := range []bool{false, true} {
		t.Run(map[bool]string{false: "dispositions read", true: "no dispositions"}[blind], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				bare := container(procscan.Sidecar, "pilot-agent", 100)
				bare.Processes = bare.Processes[:1] // no envoy yet
				cfg := testConfig(t)
				h := start(t, cfg, container(procscan.App, "app", 10), bare)
				h.pod.mu.Lock()
				h.pod.blind = blind
				h.pod.mu.Unlock()
				h.proc(10).exit(exited(0))
				waitLog(t, h, `has not started envoy yet`)
				noSignalFor(t, h, 100*time.Millisecond)
				h.pod.move(100, container(procscan.Sidecar, "pilot-agent", 100)) // envoy started
				started := time.Now()
				h.finish(Success, "SIGTERM 100")
				h.signalledWithin(0, started, cfg.ScanInterval, "at the first look once envoy runs")
				const warn = `"message":"cannot read the sidecar's signal dispositions: only a known sidecar's own sign of its handler is waited for"`
				if n := strings.Count(h.logged(), warn); n != map[bool]int{false: 0, true: 1}[blind] {
					t.Errorf("the warning logged %d times, want it once where the dispositions cannot be read; log:\n%s", n, h.logged())
				}
			})
		})
	}
}

// TestStopHandlerBound: a sidecar that never handles SIGTERM gets it after
// SIDECAR_START_TIMEOUT, and the log and the summary say so.
func TestStopHandlerBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_SIDECAR_START_TIMEOUT=100ms")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.pod.setUnhandled(100, true)
		h.proc(10).exit(exited(0))
		ended := time.Now()
		res, err := h.wait()
		h.signalledAt(0, ended.Add(cfg.SidecarStartTimeout), "SIDECAR_START_TIMEOUT after the app's end")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
		if !strings.Contains(res.Summary, "pilot-agent did not handle SIGTERM within 100ms") {
			t.Errorf("summary %q does not say the sidecar never handled SIGTERM", res.Summary)
		}
		if !strings.Contains(h.logged(), "sending it anyway") {
			t.Errorf("log does not say so:\n%s", h.logged())
		}
	})
}

// TestStopSIGKILLDoesNotWait: SIGKILL needs no handler.
func TestStopSIGKILLDoesNotWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.pod.setUnhandled(100, true)
		h.proc(10).exit(exited(3))
		ended := time.Now()
		h.finish(Failure, "SIGKILL 100")
		h.signalledAt(0, ended, "at the app's end")
		if strings.Contains(h.logged(), "waiting until it handles it") {
			t.Errorf("waited for a handler before SIGKILL; log:\n%s", h.logged())
		}
	})
}

// TestHTTPRetriedUntilAnswered: pilot-agent's status server is not up yet
// (connection refused): the POST is tried again until it answers.
func TestHTTPRetriedUntilAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const quit, drain = "http://127.0.0.1:15020/quitquitquit", "http://127.0.0.1:15020/drain"
		cfg := testConfig(t, "SUPERVISOR_ON_SUCCESS="+quit)
		h := startWith(t, cfg, func(h *harness) {
			h.answer = func(n int) (int, error) {
				if n < 4 {
					return 0, refused
				}
				go func() { time.Sleep(10 * time.Millisecond); h.kernel.proc(100).exit(exited(0)) }()
				return 200, nil
			}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res, err := h.wait()
		if err != nil || res.Outcome != Success {
			t.Fatalf("res %+v err %v", res, err)
		}
		if got := h.kernel.sent(); len(got) != 0 {
			t.Errorf("signals %v, want none (the POST worked)", got)
		}
		if diff := cmp.Diff([]string{drain, quit, quit, quit, quit}, h.postsSent()); diff != "" {
			t.Errorf("posts (-want +got):\n%s", diff)
		}
		for i := 2; i <= 4; i++ {
			if d := h.postedAt(i).Sub(h.postedAt(i - 1)); d != cfg.ScanInterval {
				t.Errorf("quit %d sent %v after the one it retries, want SCAN_INTERVAL (%v)", i, d, cfg.ScanInterval)
			}
		}
	})
}

// TestHTTPNeverAnswers: the POST is tried until HTTP_TIMEOUT, then the
// SIGTERM fallback waits for the handler like any graceful signal.
func TestHTTPNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit", "SUPERVISOR_HTTP_TIMEOUT=100ms")
		h := startWith(t, cfg, func(h *harness) {
			h.answer = func(int) (int, error) { return 0, refused }
			h.pod.setUnhandled(100, true)
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		waitLog(t, h, `"message":"sidecar would die of the signal now: waiting until it handles it"`)
		n := len(h.postsSent()) // a /drain, answered, then the quits
		if n < 3 {
			t.Errorf("%d POSTs, want the quit tried again until the bound", n)
		}
		if d := h.postedAt(n - 1).Sub(h.postedAt(1)); d != cfg.HTTPTimeout {
			t.Errorf("the last quit sent %v after the first, want HTTP_TIMEOUT (%v)", d, cfg.HTTPTimeout)
		}
		h.pod.setUnhandled(100, false)
		h.finish(Success, "SIGTERM 100")
	})
}

// refused is a connection refused, as net.Dial wraps it.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// TestHTTPResentWhenNoAnswer: a POST that reached the sidecar and got no
// answer, the sidecar still up a second later (pilot-agent drops a
// /quitquitquit that comes just after its status port opens), is sent
// again; answered, it is the stop: no SIGTERM.
func TestHTTPResentWhenNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit", "SUPERVISOR_HTTP_TIMEOUT=5s")
		h := startWith(t, cfg, func(h *harness) {
			h.answer = func(n int) (int, error) {
				if n == 1 {
					return 0, errors.New("read status line: EOF")
				}
				go h.kernel.proc(100).exit(exited(0))
				return 200, nil
			}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res := h.finish(Success)
		if n := len(h.postsSent()); n != 3 {
			t.Errorf("%d POSTs, want /drain and 2 quits", n)
		}
		if d := h.postedAt(2).Sub(h.postedAt(1)); d != lostAnswerWait {
			t.Errorf("the quit sent again %v after the first, want %v", d, lostAnswerWait)
		}
		if strings.Contains(res.Summary, "POST failed") {
			t.Errorf("summary %q", res.Summary)
		}
		waitLog(t, h, `"message":"http action got no answer and the sidecar runs on: sending it again"`)
	})
}

// TestHTTPNoAnswerEver: no answer to any POST and the sidecar runs on:
// sent again until HTTP_TIMEOUT, then SIGTERM.
func TestHTTPNoAnswerEver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit", "SUPERVISOR_HTTP_TIMEOUT=3s")
		h := startWith(t, cfg, func(h *harness) {
			h.answer = func(int) (int, error) { return 0, errors.New("read status line: EOF") }
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res := h.finish(Success, "SIGTERM 100")
		n := len(h.postsSent()) // a /drain, answered, then the quits
		if n < 3 {
			t.Errorf("%d POSTs, want it sent again (every second) until the bound", n)
		}
		for i := 2; i < n; i++ {
			if d := h.postedAt(i).Sub(h.postedAt(i - 1)); d != lostAnswerWait {
				t.Errorf("quit %d sent %v after the one before, want %v", i, d, lostAnswerWait)
			}
		}
		// Sent again until HTTP_TIMEOUT, then given HTTP_TIMEOUT more to exit.
		h.signalledAt(0, h.postedAt(1).Add(2*cfg.HTTPTimeout), "twice HTTP_TIMEOUT after the first quit")
		if !strings.Contains(res.Summary, "POST failed (read status line: EOF), sent SIGTERM") {
			t.Errorf("summary %q", res.Summary)
		}
	})
}

// TestHTTPAnswerLost: the request reached the sidecar, which stopped
// before its answer was read (EOF): that is a stop, not a failed POST.
func TestHTTPAnswerLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, testConfig(t, "SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"), func(h *harness) {
			h.answer = func(int) (int, error) {
				go h.kernel.proc(100).exit(exited(0))
				return 0, errors.New("read status line: EOF")
			}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res := h.finish(Success)
		if strings.Contains(res.Summary, "POST failed") {
			t.Errorf("summary %q: a lost answer taken for a failure", res.Summary)
		}
	})
}

// TestDrainBeforeQuit: pilot-agent's /quitquitquit drains first on Istio
// 1.21-1.25 unless POST /drain came before it, and 1.20 has no /drain
// (404): /drain goes first, answered before the quit is sent, on every
// release, and whatever it answers the quit follows. A /drain dropped
// unanswered (pilot-agent's agent not made yet) is sent again.
func TestDrainBeforeQuit(t *testing.T) {
	const quit, drain = "http://127.0.0.1:15020/quitquitquit", "http://127.0.0.1:15020/drain"
	eof := errors.New("read status line: EOF")
	for _, tc := range []struct {
		name   string
		drain  func(n int) (int, error)
		posts  []string
		logged string
	}{
		{name: "1.21 and later: 200", drain: func(int) (int, error) { return 200, nil },
			posts: []string{drain, quit}, logged: "sidecar drained ahead of its quit"},
		{name: "1.20: no /drain", drain: func(int) (int, error) { return 404, nil },
			posts: []string{drain, quit}, logged: "sidecar has no drain endpoint: its quit will drain first"},
		{name: "dropped once, then answered", drain: func(n int) (int, error) {
			if n == 1 {
				return 0, eof
			}
			return 200, nil
		}, posts: []string{drain, drain, quit}, logged: "sidecar drained ahead of its quit"},
		{name: "refused, then answered", drain: func(n int) (int, error) {
			if n < 3 {
				return 0, refused
			}
			return 200, nil
		}, posts: []string{drain, drain, drain, quit}, logged: "sidecar drained ahead of its quit"},
		{name: "an error status", drain: func(int) (int, error) { return 500, nil },
			posts: []string{drain, quit}, logged: "drain ahead of the quit refused: quitting anyway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startWith(t, testConfig(t, "SUPERVISOR_ON_SUCCESS="+quit), func(h *harness) {
					h.drainAnswer = tc.drain
					h.answer = func(int) (int, error) {
						go h.kernel.proc(100).exit(exited(0))
						return 200, nil
					}
				}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
				h.proc(10).exit(exited(0))
				h.finish(Success)
				if diff := cmp.Diff(tc.posts, h.postsSent()); diff != "" {
					t.Errorf("posts (-want +got):\n%s", diff)
				}
				waitLog(t, h, `"message":"`+tc.logged+`"`)
			})
		})
	}
}

// TestDrainNeverAnswered: a /drain that never answers costs at most
// HTTP_TIMEOUT, then the quit is sent all the same.
func TestDrainNeverAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit", "SUPERVISOR_HTTP_TIMEOUT=300ms")
		h := startWith(t, cfg, func(h *harness) {
			h.drainAnswer = func(int) (int, error) { return 0, refused }
			h.answer = func(int) (int, error) {
				go h.kernel.proc(100).exit(exited(0))
				return 200, nil
			}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		h.finish(Success)
		posts := h.postsSent()
		if len(posts) < 2 || posts[len(posts)-1] != "http://127.0.0.1:15020/quitquitquit" {
			t.Errorf("posts %v: want /drain tried, then the quit", posts)
		}
		if d := h.postedAt(len(posts) - 1).Sub(h.postedAt(0)); d != cfg.HTTPTimeout {
			t.Errorf("the quit sent %v after the first /drain, want HTTP_TIMEOUT (%v)", d, cfg.HTTPTimeout)
		}
		waitLog(t, h, `"message":"no answer ahead of the quit: quitting anyway"`)
	})
}
