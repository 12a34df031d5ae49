package scenarios

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// drainApp is an app that, once SIGTERM comes, drains until the test ends
// its drain (App.DrainCued), calling through the sidecar (its readiness
// port) every 200ms meanwhile, and then exits 0.
var drainApp = App{Name: "app", UID: 1000, DrainCued: true, Args: []string{"--sleep", "1h", "--term-exit", "0",
	"--get", "http://127.0.0.1:15021/healthz/ready"}}

// deletePod deletes p as the kubelet does and returns the status and how
// long the deletion took.
func deletePod(t *testing.T, p *pod.Pod) (pod.Status, time.Duration) {
	begun := time.Now()
	return <-deleting(p), time.Since(begun)
}

// deleting starts p's deletion as the kubelet does, in the background: the
// status comes on the channel once every container has stopped.
func deleting(p *pod.Pod) <-chan pod.Status {
	out := make(chan pod.Status, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*EventBound)
		defer cancel()
		out <- p.Delete(ctx)
	}()
	return out
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

// waitRecord polls (bounded) a record file until cond holds for it.
func waitRecord(t *testing.T, file, what string, cond func([]string) bool) {
	t.Helper()
	if !eventually(func() bool { return cond(Record(file)) }) {
		t.Fatalf("no %s in %s within %s:\n%s", what, file, EventBound, strings.Join(Record(file), "\n"))
	}
}

// startUp builds d, with the hold bounded by hold (WithHold) unless hold
// is 0, and starts it; it returns once the pod is up (waitUp), as a Ready
// pod is: HoldApp starts the app once the proxy is ready. The grace period
// only bounds the deletion.
func startUp(t *testing.T, b Builder, d Desc, hold time.Duration) (*pod.Pod, Built) {
	t.Helper()
	d.HoldApp, d.Grace = true, EventBound
	built := b.MustBuild(t, d)
	if hold > 0 {
		var err error
		if built, err = WithHold(built, pod.MustTools(t), hold); err != nil {
			t.Fatal(err)
		}
	}
	p := Start(t, built)
	waitUp(t, p, built)
	return p, built
}

// TestHoldDrain: a Deployment's pod is deleted while its app drains
// through the sidecar for as long as the test lets it. With the hold the
// sidecar gets no SIGTERM while the app drains, and every call works;
// without it the sidecar is gone after its 5 s drain and the app's calls
// fail. The app's drain ends, with the hold, once it has made 5 calls
// through the held sidecar; without it, once istio-proxy has exited and a
// call has failed.
func TestHoldDrain(t *testing.T) {
	const calls = 5
	for _, b := range Builders(t) {
		for _, hold := range []bool{true, false} {
			name := b.Name + "/without hold"
			if hold {
				name = b.Name + "/with hold"
			}
			t.Run(name, func(t *testing.T) {
				var bound time.Duration
				if hold {
					bound = EventBound // not the outcome: the hold ends with the app's exit
				}
				p, built := startUp(t, b, Desc{Name: "deploy", Policy: pod.Always, NoSupervisor: true, Apps: []App{drainApp},
					ProxyDrain: 5 * time.Second}, bound)
				deleted := deleting(p)
				recFile := appRecord(built, "app")
				if hold {
					waitRecord(t, recFile, fmt.Sprintf("%d calls through the sidecar", calls), func(rec []string) bool {
						ok, _ := gets(rec)
						return ok >= calls
					})
					if rec := Record(built.PilotRecord); slices.Contains(rec, "signal SIGTERM") || !p.Status().Container("istio-proxy").Running {
						t.Errorf("the sidecar was stopped while the app drained: record %q, %s", rec, p.Status())
					}
				} else {
					p.MustWaitFor(t, EventBound, pod.Ended("istio-proxy")) // while the app drains
					waitRecord(t, recFile, "failed call", func(rec []string) bool { _, failed := gets(rec); return failed > 0 })
				}
				if err := built.Release(DrainCue("app")); err != nil {
					t.Fatal(err)
				}
				st := <-deleted
				rec := Record(recFile)
				ok, failed := gets(rec)
				t.Logf("calls during the app's drain: %d ok, %d failed", ok, failed)
				if c := st.Container("app"); c.ExitCode != 0 {
					t.Errorf("app exit %d, want 0 (it finished its drain)", c.ExitCode)
				}
				if hold {
					if failed != 0 || ok < calls {
						t.Errorf("with the hold: %d calls ok, %d failed; want all ok:\n%s", ok, failed, strings.Join(rec, "\n"))
					}
					if c := st.Container("istio-proxy"); c.ExitCode != 0 {
						t.Errorf("istio-proxy exit %d, want 0", c.ExitCode)
					}
					if l := p.Logs("istio-proxy"); !strings.Contains(l, "hold released after") {
						t.Errorf("istio-proxy's log does not say the hold was released:\n%s", l)
					}
				}
			})
		}
	}
}

// TestHoldBound: an app that drains for good holds the sidecar only for
// SUPERVISOR_HOLD_TIMEOUT (3 s, the outcome); the hook says it gave up,
// and the sidecar drains and exits 0 while the app still runs. The test
// then ends the app's drain (its grace period, long, only bounds the
// deletion).
func TestHoldBound(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, built := startUp(t, b, Desc{Name: "stuck", Policy: pod.Always, NoSupervisor: true,
			Apps: []App{{Name: "app", DrainCued: true, Args: []string{"--sleep", "1h"}}}, ProxyDrain: time.Second}, 3*time.Second)
		deleted := deleting(p)
		st := p.MustWaitFor(t, EventBound, pod.Ended("istio-proxy")) // while the app drains
		if !st.Container("app").Running {
			t.Errorf("the app ended before istio-proxy: %s", st)
		}
		if err := built.Release(DrainCue("app")); err != nil {
			t.Fatal(err)
		}
		st = <-deleted
		if l := p.Logs("istio-proxy"); !strings.Contains(l, "hold gave up after") {
			t.Errorf("istio-proxy's log does not say the hold gave up:\n%s", l)
		}
		// The sidecar stopped on its own after the hold and its drain.
		if c := st.Container("istio-proxy"); c.ExitCode != 0 {
			t.Errorf("istio-proxy exit %d, want 0: it should not wait for the grace period", c.ExitCode)
		}
		if c := st.Container("app"); c.ExitCode != 143 {
			t.Errorf("app exit %d, want 143 (its drain ended by the test)", c.ExitCode)
		}
	})
}

// TestHoldQuick: an app that exits at once on SIGTERM releases the hold at
// once, and a Job pod (no hold) is deleted as fast as without us: no
// container waits for the grace period.
func TestHoldQuick(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		for _, job := range []bool{false, true} {
			// The grace period and the hold's bound only guard against a
			// hang: a container still running at the end of either would
			// show as killed (137).
			d := Desc{Name: "quick", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}}, ProxyDrain: 500 * time.Millisecond}
			var hold time.Duration
			if !job {
				d.Policy, d.NoSupervisor, hold = pod.Always, true, EventBound
			}
			p, _ := startUp(t, b, d, hold)
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

// waitUp waits until the app has recorded its start (its SIGTERM handler
// is set by then) and istio-proxy runs: a pod deleted only once it is up,
// as a Ready pod is.
func waitUp(t *testing.T, p *pod.Pod, b Built) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), EventBound)
	defer cancel()
	if _, err := p.WaitRunning(ctx, "istio-proxy", 0); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool {
		rec := Record(appRecord(b, "app"))
		return len(rec) > 0 && strings.HasPrefix(rec[0], "app start")
	}) {
		t.Fatalf("the app never started: %s", p.Status())
	}
}
