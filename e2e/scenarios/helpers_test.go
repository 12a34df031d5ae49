package scenarios

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// run builds d for b and starts it (Start).
func run(t *testing.T, b Builder, d Desc) (*pod.Pod, Built) {
	t.Helper()
	built, err := b.Build(d)
	if err != nil {
		t.Fatal(err)
	}
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

func waitPhase(t *testing.T, p *pod.Pod, within time.Duration) pod.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	st, err := p.WaitPhase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fast makes the supervisor's bounds short enough for tests.
var fast = []string{"SUPERVISOR_STOP_TIMEOUT=3s", "SUPERVISOR_SIDECAR_START_TIMEOUT=10s", "SUPERVISOR_APP_START_TIMEOUT=10s"}

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
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if rec := Record(b.PilotRecord); len(rec) > 0 && strings.HasPrefix(rec[0], "start ") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the stand-in pilot-agent never recorded its start in %s", b.PilotRecord)
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

// waitLogFor waits (bounded) for a message about a container in the
// supervisor's log.
func waitLogFor(t *testing.T, p *pod.Pod, msg, container string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, l := range ParseLog(p.Logs("supervisor")) {
			if l.Msg() == msg && l.Str("container") == container {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %q for container %s in the supervisor's log", msg, container)
}

// waitLog waits (bounded) for a message in the supervisor's log.
func waitLog(t *testing.T, p *pod.Pod, msg string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if slices.Contains(Messages(ParseLog(p.Logs("supervisor"))), msg) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %q in the supervisor's log", msg)
}
