package scenarios

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// drainApp is an app that needs 8 s to finish after SIGTERM and keeps
// calling through the sidecar (its readiness port) meanwhile.
var drainApp = App{Name: "app", UID: 1000, Args: []string{"--sleep", "1h", "--on-term", "8s", "--term-exit", "0",
	"--get", "http://127.0.0.1:15021/healthz/ready"}}

// deletePod deletes p as the kubelet does and returns the status and how
// long the deletion took.
func deletePod(t *testing.T, p *pod.Pod) (pod.Status, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begun := time.Now()
	st := p.Delete(ctx)
	return st, time.Since(begun)
}

// gets sorts the app's recorded calls made while draining.
func gets(record []string) (ok, failed int) {
	for _, l := range record {
		switch {
		case strings.HasPrefix(l, "get ok"):
			ok++
		case strings.HasPrefix(l, "get fail"):
			failed++
		}
	}
	return
}

// TestHoldDrain: a Deployment's pod is deleted while its app needs 8 s to
// drain through the sidecar. With the hold every call of the drain works;
// without it the sidecar is gone after its 5 s drain and the last calls
// fail.
func TestHoldDrain(t *testing.T) {
	for _, b := range Builders(t) {
		for _, hold := range []bool{true, false} {
			name := b.Name + "/without hold"
			if hold {
				name = b.Name + "/with hold"
			}
			t.Run(name, func(t *testing.T) {
				tl := pod.MustTools(t)
				// HoldApp: the app starts once the proxy is ready, so the
				// deletion finds both up (as in any pod that was Ready).
				built, err := b.Build(Desc{Name: "deploy", Policy: pod.Always, NoSupervisor: true, Apps: []App{drainApp},
					ProxyDrain: 5 * time.Second, Grace: 30 * time.Second, HoldApp: true})
				if err != nil {
					t.Fatal(err)
				}
				if hold {
					if built, err = WithHold(built, tl, 20*time.Second); err != nil {
						t.Fatal(err)
					}
				}
				p := Start(t, built)
				waitUp(t, p, built)
				st, took := deletePod(t, p)
				rec := Record(appRecord(built, "app"))
				ok, failed := gets(rec)
				t.Logf("deletion took %.1fs; calls during the app's drain: %d ok, %d failed", took.Seconds(), ok, failed)
				if c := st.Container("app"); c.ExitCode != 0 {
					t.Errorf("app exit %d, want 0 (it finished its drain)", c.ExitCode)
				}
				if hold {
					if failed != 0 || ok < 20 {
						t.Errorf("with the hold: %d calls ok, %d failed; want all (about 40) ok:\n%s", ok, failed, strings.Join(rec, "\n"))
					}
					if c := st.Container("istio-proxy"); c.ExitCode != 0 {
						t.Errorf("istio-proxy exit %d, want 0", c.ExitCode)
					}
					if l := p.Logs("istio-proxy"); !strings.Contains(l, "hold released after") {
						t.Errorf("istio-proxy's log does not say the hold was released:\n%s", l)
					}
				} else if failed == 0 {
					t.Errorf("without the hold no call failed (%d ok): the test does not show the problem:\n%s", ok, strings.Join(rec, "\n"))
				}
			})
		}
	}
}

// TestHoldBound: an app that never exits holds the sidecar only for
// SUPERVISOR_HOLD_TIMEOUT; the hook says it gave up.
func TestHoldBound(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			tl := pod.MustTools(t)
			built, err := b.Build(Desc{Name: "stuck", Policy: pod.Always, NoSupervisor: true,
				Apps:       []App{{Name: "app", Args: []string{"--sleep", "1h", "--on-term", "1h"}}},
				ProxyDrain: time.Second, Grace: 12 * time.Second, HoldApp: true})
			if err != nil {
				t.Fatal(err)
			}
			if built, err = WithHold(built, tl, 3*time.Second); err != nil {
				t.Fatal(err)
			}
			p := Start(t, built)
			waitUp(t, p, built)
			st, took := deletePod(t, p)
			t.Logf("deletion took %.1fs (hold 3s, drain 1s, grace 12s)", took.Seconds())
			if l := p.Logs("istio-proxy"); !strings.Contains(l, "hold gave up after") {
				t.Errorf("istio-proxy's log does not say the hold gave up:\n%s", l)
			}
			// The sidecar stopped on its own after the hold and its drain;
			// only the app had to be killed at the end of the grace period.
			if c := st.Container("istio-proxy"); c.ExitCode != 0 {
				t.Errorf("istio-proxy exit %d, want 0: it should not wait for the grace period", c.ExitCode)
			}
			if c := st.Container("app"); c.ExitCode != 137 {
				t.Errorf("app exit %d, want 137 (killed at the end of the grace period)", c.ExitCode)
			}
		})
	}
}

// TestHoldQuick: an app that exits at once on SIGTERM releases the hold at
// once, and a Job pod (no hold) is deleted as fast as without us: no
// container waits for the grace period.
func TestHoldQuick(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			tl := pod.MustTools(t)
			for _, job := range []bool{false, true} {
				d := Desc{Name: "quick", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}},
					ProxyDrain: 500 * time.Millisecond, Grace: 30 * time.Second, HoldApp: true}
				if !job {
					d.Policy, d.NoSupervisor = pod.Always, true
				}
				built, err := b.Build(d)
				if err != nil {
					t.Fatal(err)
				}
				if !job {
					if built, err = WithHold(built, tl, 20*time.Second); err != nil {
						t.Fatal(err)
					}
				}
				p := Start(t, built)
				waitUp(t, p, built)
				if job {
					waitLog(t, p, "app found")
				}
				st, took := deletePod(t, p)
				t.Logf("job %v: deletion took %.1fs", job, took.Seconds())
				for _, c := range st.Containers {
					if c.ExitCode == 137 {
						t.Errorf("job %v: %s was killed at the end of the grace period (%s)", job, c.Name, st)
					}
				}
				if !job {
					if l := p.Logs("istio-proxy"); !strings.Contains(l, "hold released after") {
						t.Errorf("istio-proxy's log does not say the hold was released:\n%s", l)
					}
				}
			}
		})
	}
}

// waitUp waits until the app has recorded its start (its SIGTERM handler
// is set by then) and istio-proxy runs: a pod deleted only once it is up,
// as a Ready pod is.
func waitUp(t *testing.T, p *pod.Pod, b Built) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.WaitRunning(ctx, "istio-proxy", 0); err != nil {
		t.Fatal(err)
	}
	for {
		if rec := Record(appRecord(b, "app")); len(rec) > 0 && strings.HasPrefix(rec[0], "app start") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the app never started: %s", p.Status())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
