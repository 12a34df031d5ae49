package pod

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCgroupHold: on the namespaces backend, each attempt's main process
// stays out of its container's cgroup until CgroupHold returns, and the
// container reads as running only after that; an error fails the start.
func TestCgroupHold(t *testing.T) {
	tl := needTools(t)
	var held []string // each attempt's cgroup.procs, read while held
	hold := func(ctx context.Context, p *Pod, attempt int) error {
		dir := filepath.Join(p.BackendState.(*nsState).cgroup, "app")
		if attempt > 0 {
			dir += "-r1"
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		held = append(held, strings.TrimSpace(string(b)))
		if s := p.Status().Container("app"); s.Running {
			t.Errorf("attempt %d reads as running while held out of its cgroup", attempt)
		}
		return err
	}
	p := startPod(t, Namespaces{Podsim: tl.Podsim}, Spec{Name: "hold", RestartPolicy: OnFailure, RestartBackoff: 50 * time.Millisecond,
		Containers: []Container{{Name: "app", Argv: []string{tl.Podsim, "app", "--fail-first", "1", "--record", filepath.Join(t.TempDir(), "app.record")},
			CgroupHold: hold}}})
	st := p.MustWaitPhase(t, 2*time.Minute)
	if c := st.Container("app"); st.Phase != Succeeded || c.Restarts != 1 {
		t.Errorf("status %s, want Succeeded after one restart", st)
	}
	if len(held) != 2 || held[0] != "" || held[1] != "" {
		t.Errorf("cgroup.procs while held: %q, want both attempts' empty", held)
	}
}
