package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// TestLedger runs the restart bookkeeping through timelines, one step at a
// time, without a goroutine or a clock. Steps:
//
//	start NAME PID    a new instance (its main process PID)
//	exit NAME CODE    NAME's last instance exits with CODE (-1: unknown)
//	at SECONDS        settle at that time (the clock of the table)
//	missing           the slots never seen are filled as unknown
//
// and after the last step: whether the apps are finished, what is still
// sought, and what the decision is made on.
func TestLedger(t *testing.T) {
	tests := []struct {
		name     string
		policy   RestartPolicy
		want     int
		steps    string
		finished bool
		seeking  bool
		final    string // "container status, ..."
		replaced string // "new<old, ..." in order
		// The restart margin and timeout: unknown waits for the timeout
		// (10s) unless a margin is given.
		margin, timeout time.Duration
	}{
		{name: "never: one app exits 3", policy: Never, want: 1,
			steps: "start a 1; exit a 3", finished: true, final: "a exit 3"},
		{name: "never: the second app still runs", policy: Never, want: 2,
			steps: "start a 1; start b 2; exit a 0", final: "a exit 0, b running"},
		{name: "onfailure: fails, then the restart succeeds", policy: OnFailure, want: 1,
			steps: "start a 1; exit a 1; start a-r1 2; exit a-r1 0", finished: true,
			final: "a-r1 exit 0", replaced: "a-r1<a"},
		{name: "onfailure: a failure awaits its restart", policy: OnFailure, want: 1,
			steps: "start a 1; exit a 1", seeking: true, final: "a exit 1"},
		{name: "onfailure: a restart fills the oldest awaiting slot", policy: OnFailure, want: 2,
			steps: "start a 1; start b 2; exit b 1; exit a 1; start x 3; start y 4; exit x 0; exit y 0", finished: true,
			final: "x exit 0, y exit 0", replaced: "x<b, y<a"},
		{name: "onfailure: a first start taken for a restart leaves a slot short", policy: OnFailure, want: 2,
			steps: "start a 1; exit a 1; start b 2; exit b 0", seeking: true,
			final: "b exit 0", replaced: "b<a"},
		{name: "onfailure: unknown waits for a restart until the timeout", policy: OnFailure, want: 1,
			steps: "start a 1; exit a -1 @0; at 9", seeking: true, final: "a unknown (test)"},
		{name: "onfailure: unknown with no restart in time is finished", policy: OnFailure, want: 1,
			steps: "start a 1; exit a -1 @0; at 10", finished: true, final: "a unknown (test)"},
		{name: "onfailure: unknown, then restarted and succeeded", policy: OnFailure, want: 1,
			steps: "start a 1; exit a -1 @0; at 5; start a-r1 2; exit a-r1 0 @6; at 6", finished: true,
			final: "a-r1 exit 0", replaced: "a-r1<a"},
		{name: "unknown on the first run: finished once the margin has passed (the first restart comes at once)",
			policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "start a 1; exit a -1 @0; at 14", seeking: true, final: "a unknown (test)"},
		{name: "unknown on the first run, at the margin", policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps: "start a 1; exit a -1 @0; at 15", finished: true, final: "a unknown (test)"},
		{name: "unknown after two failures: the third restart's back-off (20s) and the margin",
			policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps:   "start a 1; exit a 1 @0; start a-r1 2; exit a-r1 1 @5; start a-r2 3; exit a-r2 -1 @40; at 74",
			seeking: true, final: "a-r2 unknown (test)", replaced: "a-r1<a, a-r2<a-r1"},
		{name: "unknown after two failures, at back-off plus margin",
			policy: OnFailure, want: 1, margin: 15 * time.Second, timeout: 330 * time.Second,
			steps:    "start a 1; exit a 1 @0; start a-r1 2; exit a-r1 1 @5; start a-r2 3; exit a-r2 -1 @40; at 75",
			finished: true, final: "a-r2 unknown (test)", replaced: "a-r1<a, a-r2<a-r1"},
		{name: "names: a restart is the same name, not the oldest awaiting", policy: OnFailure, want: 2,
			steps: "named a 1; named b 2; exit b 1; exit a 1; named a 3; exit a 0; named b 4; exit b 0", finished: true,
			final: "a exit 0, b exit 0", replaced: "a<a, b<b"},
		{name: "names: an instance seen at its exit, unnamed, is replaced by its named restart", policy: OnFailure, want: 2,
			steps: "named b 2; start x 1; exit x 1; named a 3; exit a 0; exit b 0", finished: true,
			final: "b exit 0, a exit 0", replaced: "a<x"},
		{name: "missing slots count as unknown", policy: Never, want: 3,
			steps: "start a 1; exit a 0; missing", finished: true,
			final: "a exit 0, missing-1 unknown (never seen), missing-2 unknown (never seen)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			margin, timeout := time.Hour, 10*time.Second
			if tt.margin > 0 {
				margin, timeout = tt.margin, tt.timeout
			}
			l := newLedger(tt.policy, tt.want, timeout, margin)
			t0 := time.Unix(1000, 0)
			now := t0
			last := map[string]instance{}
			var replaced []string
			for _, step := range strings.Split(tt.steps, "; ") {
				f := strings.Fields(step)
				if len(f) > 0 && strings.HasPrefix(f[len(f)-1], "@") {
					var s int
					fmt.Sscanf(f[len(f)-1], "@%d", &s)
					now = t0.Add(time.Duration(s) * time.Second)
					f = f[:len(f)-1]
				}
				switch f[0] {
				case "named":
					// An instance known by its Kubernetes name.
					var pid int
					fmt.Sscanf(f[2], "%d", &pid)
					id := instanceOf(procscan.Process{PID: pid, StartTime: uint64(pid)})
					if old, ok := l.started(id, f[1], f[1]); ok {
						replaced = append(replaced, f[1]+"<"+old)
					}
					last[f[1]] = id
				case "start":
					var pid int
					fmt.Sscanf(f[2], "%d", &pid)
					id := instanceOf(procscan.Process{PID: pid, StartTime: uint64(pid)})
					if old, ok := l.started(id, f[1], ""); ok {
						replaced = append(replaced, f[1]+"<"+old)
					}
					if was, ok := l.rename(id, f[1]); !ok || was != f[1] || !l.running(id) {
						t.Fatalf("%s: its main process is not its instance", step)
					}
					last[strings.Split(f[1], "-")[0]] = id
				case "exit":
					var code int
					fmt.Sscanf(f[2], "%d", &code)
					s := exitwatch.Status{Known: true, Code: code}
					if code < 0 {
						s = exitwatch.Status{Reason: "test"}
					}
					l.exited(last[strings.Split(f[1], "-")[0]], s, now)
				case "at":
					var s int
					fmt.Sscanf(f[1], "%d", &s)
					l.settle(t0.Add(time.Duration(s) * time.Second))
				case "missing":
					l.missing(nil, func(i int) string { return fmt.Sprintf("missing-%d", i+1) }, "never seen")
				default:
					t.Fatalf("bad step %q", step)
				}
			}
			if got := l.finished(); got != tt.finished {
				t.Errorf("finished = %v, want %v", got, tt.finished)
			}
			if got := l.seeking(); got != tt.seeking {
				t.Errorf("seeking = %v, want %v", got, tt.seeking)
			}
			var final []string
			for _, a := range l.final() {
				st := a.Status.String()
				if !a.Status.Known && a.Status.Reason == "" {
					st = "running"
				}
				final = append(final, a.Container+" "+st)
			}
			if diff := cmp.Diff(tt.final, strings.Join(final, ", ")); diff != "" {
				t.Errorf("final (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.replaced, strings.Join(replaced, ", ")); diff != "" {
				t.Errorf("replaced (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLedgerSettleNext: settle says when the next unknown wait ends.
func TestLedgerSettleNext(t *testing.T) {
	l := newLedger(OnFailure, 2, 10*time.Second, time.Hour)
	t0 := time.Unix(1000, 0)
	a, b := instance{pid: 1, start: 1}, instance{pid: 2, start: 2}
	l.started(a, "a", "")
	l.started(b, "b", "")
	l.exited(a, exitwatch.Status{Reason: "x"}, t0)
	l.exited(b, exitwatch.Status{Reason: "x"}, t0.Add(3*time.Second))
	expired, next := l.settle(t0.Add(time.Second))
	if len(expired) != 0 || !next.Equal(t0.Add(10*time.Second)) {
		t.Errorf("at 1s: expired %d, next %v", len(expired), next.Sub(t0))
	}
	expired, next = l.settle(t0.Add(11 * time.Second))
	if len(expired) != 1 || expired[0] != "a" || !next.Equal(t0.Add(13*time.Second)) {
		t.Errorf("at 11s: expired %v, next %v", expired, next.Sub(t0))
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 0, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second,
		6: 160 * time.Second, 7: 300 * time.Second, 30: 300 * time.Second} {
		if got := backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}
