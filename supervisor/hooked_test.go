package supervisor

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// TestAwaitHook: a supervisor about to exit waits for its own postStart
// hook's mark where the pod's supervisors have hooks, and only there;
// another process's mark, or one of an earlier process of the same PID,
// is not its own; the wait ends WaitLimit after its start.
func TestAwaitHook(t *testing.T) {
	ctx := context.Background()
	start, err := startTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self := procscan.Process{PID: os.Getpid(), StartTime: start}
	young := func() (time.Duration, error) { return time.Second, nil }
	old := func() (time.Duration, error) { return WaitLimit, nil }

	dir := t.TempDir()
	if waited, err := AwaitHook(ctx, dir, old); waited != 0 || err != nil {
		t.Errorf("no hook in the pod: waited %v, err %v; want no wait", waited, err)
	}
	if err := HookStarted(dir); err != nil {
		t.Fatal(err)
	}
	if err := HookReturned(dir, procscan.Process{PID: self.PID, StartTime: start + 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := AwaitHook(ctx, dir, old); err == nil || !strings.Contains(err.Error(), "no mark of its postStart hook's return") {
		t.Errorf("a mark of another process of the same PID: err %v, want the bound's", err)
	}
	// The mark comes while it waits: written at its first look at its age.
	marked := false
	up := func() (time.Duration, error) {
		if !marked {
			marked = true
			if err := HookReturned(dir, self); err != nil {
				t.Error(err)
			}
		}
		return young()
	}
	if waited, err := AwaitHook(ctx, dir, up); waited == 0 || err != nil || !marked {
		t.Errorf("the mark written meanwhile: waited %v, err %v; want a wait that ends on it", waited, err)
	}
	if waited, err := AwaitHook(ctx, dir, old); waited != 0 || err != nil {
		t.Errorf("its own mark there: waited %v, err %v; want no wait", waited, err)
	}
}
