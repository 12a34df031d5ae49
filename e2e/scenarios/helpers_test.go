package scenarios

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// run builds d for b and starts it (Start).
func run(t *testing.T, b Builder, d Desc) (*pod.Pod, Built) {
	t.Helper()
	built := b.MustBuild(t, d)
	return Start(t, built), built
}

// checkEnd fails the test unless the pod ended in phase, each container
// named in codes with its exit code there.
func checkEnd(t *testing.T, st pod.Status, phase pod.Phase, codes map[string]int) {
	t.Helper()
	if st.Phase != phase {
		t.Errorf("phase %s, want %s (%s)", st.Phase, phase, st)
	}
	for name, code := range codes {
		if got := st.Container(name).ExitCode; got != code {
			t.Errorf("%s exit %d, want %d", name, got, code)
		}
	}
}

// patient is Patient, then extra (the last setting wins).
func patient(extra ...string) []string { return append(append([]string{}, Patient...), extra...) }

// eventually polls cond every 20ms for up to EventBound, for what only a
// file or /proc tells (no event of the pod's does), and reports whether it
// came to hold.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(EventBound); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// waitRecordStart waits (bounded) for a stand-in's start line: it has its
// SIGTERM handler by then.
func waitRecordStart(t *testing.T, file string) {
	t.Helper()
	if !eventually(func() bool { rec := Record(file); return len(rec) > 0 && strings.HasPrefix(rec[0], "start ") }) {
		t.Fatalf("the stand-in never recorded its start in %s", file)
	}
}

// checkRecord checks a stand-in's record: its start line, then exactly
// want.
func checkRecord(t *testing.T, file string, want ...string) {
	t.Helper()
	if rec := Record(file); len(rec) == 0 || !strings.HasPrefix(rec[0], "start ") || !slices.Equal(rec[1:], want) {
		t.Errorf("%s: %q, want its start line, then %q", filepath.Base(file), rec, want)
	}
}

// checkSummary checks that the supervisor's termination message contains
// want.
func checkSummary(t *testing.T, p *pod.Pod, want string) {
	t.Helper()
	if msg := p.TerminationMessage("supervisor"); !strings.Contains(msg, want) {
		t.Errorf("termination message %q, want it to contain %q", msg, want)
	}
}

// checkLogOrder checks that the supervisor's log has want's messages in
// this order, among others.
func checkLogOrder(t *testing.T, p *pod.Pod, want ...string) {
	t.Helper()
	msgs, i := Messages(ParseLog(p.Logs("supervisor"))), 0
	for _, m := range msgs {
		if i < len(want) && m == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Errorf("supervisor log %q, want in order %q", msgs, want)
	}
}

// touched is what the stand-in recorded besides its start: the signals and
// requests it got. (Its start line may come after a quick supervisor has
// already exited.)
func touched(rec []string) []string {
	var out []string
	for _, l := range rec {
		if !strings.HasPrefix(l, "start ") {
			out = append(out, l)
		}
	}
	return out
}

// releaseApps waits until the supervisor has found every cued app, then
// releases them in order, each once the supervisor has seen the one before
// exit.
func releaseApps(t *testing.T, p *pod.Pod, b Built, apps []App) {
	t.Helper()
	var cued []string
	for _, a := range apps {
		if a.Cued {
			cued = append(cued, a.Name)
		}
	}
	for _, name := range cued {
		WaitLogFor(t, p, "app found", name)
	}
	for i, name := range cued {
		if i > 0 {
			WaitLogFor(t, p, "app exited", cued[i-1])
		}
		if err := b.Release(name); err != nil {
			t.Fatal(err)
		}
	}
}

// waitLog waits (bounded) for a message in the supervisor's log.
func waitLog(t *testing.T, p *pod.Pod, msg string) {
	t.Helper()
	waitLogOf(t, p, "supervisor", msg)
}

// waitLogOf waits (bounded) for a message in container's log.
func waitLogOf(t *testing.T, p *pod.Pod, container, msg string) {
	t.Helper()
	if err := AwaitLogOf(p, container, 1, Is(msg)); err != nil {
		t.Fatalf("no %q in %s's log: %v", msg, container, err)
	}
}

// releaseRuns releases the first runs runs of the cued app name (releaseRun)
// in turn. before, if set, is called before each release (TestRandomPods:
// how long a run goes on once found).
func releaseRuns(p *pod.Pod, b Built, name string, runs int, before func()) error {
	for k := 1; k <= runs; k++ {
		if err := releaseRun(p, b, name, k, before); err != nil {
			return err
		}
	}
	return nil
}

// releaseRun releases run k (from 1) of the cued app name once the
// supervisor has found it: after the k-th "app found" about it (each
// restart by the kubelet reopens the app's cue). Every run so outlives the
// supervisor's look, however slow the machine. Run k-1 must be over.
func releaseRun(p *pod.Pod, b Built, name string, k int, before func()) error {
	if err := AwaitLog(p, k, About("app found", name)); err != nil {
		return fmt.Errorf("run %d of %s never found: %w", k, name, err)
	}
	if before != nil {
		before()
	}
	if err := b.Release(name); err != nil {
		return fmt.Errorf("run %d of %s: %w", k, name, err)
	}
	return nil
}

// checkControl: without the supervisor the pod never completes: once the
// app has exited 0 and istio-proxy is up, it is given 3s more to (wrongly)
// complete.
func checkControl(t *testing.T, p *pod.Pod) {
	t.Helper()
	p.MustWaitFor(t, EventBound, func(s pod.Status) bool { return pod.Ended("app")(s) && s.Container("istio-proxy").Running })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := p.WaitPhase(ctx)
	if err == nil {
		t.Fatalf("pod reached %s without the supervisor", st.Phase)
	}
	if app := st.Container("app"); st.Phase != pod.Running || app.Running || app.ExitCode != 0 || !st.Container("istio-proxy").Running {
		t.Errorf("status %s, want Running with the app done (exit 0) and istio-proxy up", st)
	}
}

// onBackends runs f as a subtest on each backend (Builders), named by it.
func onBackends(t *testing.T, f func(t *testing.T, b Builder)) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}
