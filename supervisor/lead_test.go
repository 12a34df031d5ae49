package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// leadRun is a run of cfg whose log is read with logged, for lead alone.
func leadRun(cfg Config) (r *run, logged func() string) {
	w := &syncWriter{w: &bytes.Buffer{}}
	s := New(cfg, zerolog.New(w), nil, nil, nil)
	return &run{Supervisor: s}, func() string {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.w.String()
	}
}

// leadResult is what lead returned.
type leadResult struct {
	next bool // a next state
	err  error
}

// goLead runs r.lead in the background once it has said it stands by.
func goLead(t *testing.T, ctx context.Context, r *run, logged func() string) <-chan leadResult {
	t.Helper()
	ch := make(chan leadResult, 1)
	go func() {
		st, err := r.lead(ctx)
		ch <- leadResult{st != nil, err}
	}()
	// Said before it blocks on the lock; a generous bound, for a loaded
	// machine: the log line is the event waited for.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logged(), "standby: another supervisor of the pod leads"); {
		if time.Now().After(deadline) {
			t.Fatalf("no standby said so in 10s; log:\n%s", logged())
		}
		time.Sleep(time.Millisecond)
	}
	return ch
}

// TestStandby: supervisors with one state directory lead one at a time,
// with real flocks on a real directory. The second waits while the first
// leads, and leads once the first has given up the lock (as its process's
// exit does, however it ends); a third, whose pod is deleted while it
// waits, ends there, saying whom it stood by.
func TestStandby(t *testing.T) {
	cfg := stateConfig(t)
	ctx := context.Background()
	r1, _ := leadRun(cfg)
	if st, err := r1.lead(ctx); st == nil || err != nil || r1.Supervisor.lock == nil {
		t.Fatalf("the first supervisor: state %v, err %v, lock %v; want the lead", st != nil, err, r1.Supervisor.lock)
	}
	pid := fmt.Sprint(os.Getpid())
	if b, err := os.ReadFile(filepath.Join(cfg.StateDir, leaderFile)); err != nil || strings.TrimSpace(string(b)) != pid {
		t.Errorf("the lock file holds %q (%v), want the leader's PID %s", b, err, pid)
	}

	r2, logged2 := leadRun(cfg)
	led2 := goLead(t, ctx, r2, logged2)
	ctx3, deleted := context.WithCancel(ctx)
	r3, logged3 := leadRun(cfg)
	led3 := goLead(t, ctx3, r3, logged3)
	select {
	case res := <-led2:
		t.Fatalf("the second led (%+v) while the first held the lock", res)
	default:
	}
	if !strings.Contains(logged2(), `"leader":"pid `+pid+`"`) {
		t.Errorf("the standby does not name the leader, pid %s:\n%s", pid, logged2())
	}

	deleted()
	res := <-led3
	if !res.next || res.err != nil || r3.Supervisor.lock != nil {
		t.Errorf("the standby deleted: %+v, lock %v; want its end, without the lead", res, r3.Supervisor.lock)
	}
	if got, want := r3.summary(), "standby: pid "+pid+" led to the pod's deletion"; got != want {
		t.Errorf("the deleted standby's summary %q, want %q", got, want)
	}

	r1.Supervisor.Release()
	select {
	case res := <-led2:
		if !res.next || res.err != nil || r2.Supervisor.lock == nil {
			t.Errorf("the standby once the leader ended: %+v, lock %v; want the lead", res, r2.Supervisor.lock)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the standby did not lead within a minute of the lock's release; log:\n%s", logged2())
	}
	if !strings.Contains(logged2(), "standby: the leading supervisor has ended: leading from here") {
		t.Errorf("the new leader does not say it leads:\n%s", logged2())
	}
	r2.Supervisor.Release()
}

// TestLeadWithoutLock: where the lock cannot be had (a state directory the
// supervisor cannot write), the supervisor leads without it, and says so:
// never a wait on a lock that no one can take.
func TestLeadWithoutLock(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r, logged := leadRun(testConfig(t, "SUPERVISOR_STATE_DIR="+file+"/state"))
	if st, err := r.lead(context.Background()); st == nil || err != nil || r.Supervisor.lock != nil {
		t.Fatalf("state %v, err %v, lock %v; want the start, without a lock", st != nil, err, r.Supervisor.lock)
	}
	if !strings.Contains(logged(), "cannot take the leader's lock: leading without it") {
		t.Errorf("no warning:\n%s", logged())
	}
}
