package scenarios

import (
	"context"
	"fmt"
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

// waitStatus waits, up to EventBound, until the pod's status meets cond,
// and returns that status; the test fails if it never does.
func waitStatus(t *testing.T, p *pod.Pod, cond func(pod.Status) bool) pod.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), EventBound)
	defer cancel()
	st, err := p.WaitFor(ctx, cond)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ended is the condition, for waitStatus, that container name has started
// and is no longer running.
func ended(name string) func(pod.Status) bool {
	return func(s pod.Status) bool { c := s.Container(name); return c.Started && !c.Running }
}

func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// waitStandIn waits (bounded) for the stand-in pilot-agent's start line.
func waitStandIn(t *testing.T, b Built) {
	t.Helper()
	waitRecordStart(t, b.PilotRecord)
}

// waitRecordStart waits (bounded) for a stand-in's start line: it has its
// SIGTERM handler by then. (A file: polled.)
func waitRecordStart(t *testing.T, file string) {
	t.Helper()
	deadline := time.Now().Add(EventBound)
	for time.Now().Before(deadline) {
		if rec := Record(file); len(rec) > 0 && strings.HasPrefix(rec[0], "start ") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the stand-in never recorded its start in %s", file)
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
		waitLogFor(t, p, "app found", name)
	}
	for i, name := range cued {
		if i > 0 {
			waitLogFor(t, p, "app exited", cued[i-1])
		}
		if err := b.Release(name); err != nil {
			t.Fatal(err)
		}
	}
}

// logCount is how many lines of the supervisor's log match.
func logCount(p *pod.Pod, match func(LogLine) bool) int {
	n := 0
	for _, l := range ParseLog(p.Logs("supervisor")) {
		if match(l) {
			n++
		}
	}
	return n
}

// awaitLog waits (bounded) until n lines of the supervisor's log match:
// the pod wakes the wait at each line written (pod.Pod.Await).
func awaitLog(p *pod.Pod, n int, match func(LogLine) bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), EventBound)
	defer cancel()
	return p.Await(ctx, func() bool { return logCount(p, match) >= n })
}

// about matches the lines with message msg about container.
func about(msg, container string) func(LogLine) bool {
	return func(l LogLine) bool { return l.Msg() == msg && l.Str("container") == container }
}

// waitLogFor waits (bounded) for a message about a container in the
// supervisor's log.
func waitLogFor(t *testing.T, p *pod.Pod, msg, container string) {
	t.Helper()
	if err := awaitLog(p, 1, about(msg, container)); err != nil {
		t.Fatalf("no %q for container %s in the supervisor's log: %v", msg, container, err)
	}
}

// waitLog waits (bounded) for a message in the supervisor's log.
func waitLog(t *testing.T, p *pod.Pod, msg string) {
	t.Helper()
	if err := awaitLog(p, 1, func(l LogLine) bool { return l.Msg() == msg }); err != nil {
		t.Fatalf("no %q in the supervisor's log: %v", msg, err)
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
	if err := awaitLog(p, k, about("app found", name)); err != nil {
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

// terminated is a pod.Container.StartAfter: the named containers have run
// and ended.
func terminated(names ...string) func(context.Context, *pod.Pod) error {
	return func(ctx context.Context, p *pod.Pod) error {
		_, err := p.WaitFor(ctx, func(s pod.Status) bool {
			for _, n := range names {
				if c := s.Container(n); !c.Started || c.Running {
					return false
				}
			}
			return true
		})
		return err
	}
}
