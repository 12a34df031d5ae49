package supervisor

import (
	"strings"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

func TestDecide(t *testing.T) {
	ok := AppStatus{"a", exited(0)}
	ok2 := AppStatus{"b", exited(0)}
	fail := AppStatus{"c", exited(3)}
	sig := AppStatus{"d", killed(9)}
	unk := AppStatus{"e", exitwatch.Status{Reason: "no pidfd exit info"}}
	tests := []struct {
		apps   []AppStatus
		want   Outcome
		inWhy  string
		action string
	}{
		{[]AppStatus{ok}, Success, "a exit 0", "SIGTERM"},
		{[]AppStatus{ok, ok2}, Success, "all 2 app containers exit 0", "SIGTERM"},
		{[]AppStatus{ok, fail}, Failure, "c exit 3", "SIGKILL"},
		{[]AppStatus{sig}, Failure, "d killed by SIGKILL", "SIGKILL"},
		{[]AppStatus{ok, unk}, Unknown, "e unknown (no pidfd exit info)", "SIGTERM"},
		// A known failure outweighs an unknown status.
		{[]AppStatus{unk, fail}, Failure, "c exit 3; unknown: e unknown (no pidfd exit info)", "SIGKILL"},
		{nil, Unknown, "no application container", "SIGTERM"},
	}
	cfg, _, _ := LoadConfig(nil)
	for _, tt := range tests {
		got, why := Decide(tt.apps)
		if got != tt.want || !strings.Contains(why, tt.inWhy) {
			t.Errorf("Decide(%v) = %v %q, want %v containing %q", tt.apps, got, why, tt.want, tt.inWhy)
		}
		if a := cfg.ActionFor(got).String(); a != tt.action {
			t.Errorf("ActionFor(%v) = %s, want %s", got, a, tt.action)
		}
	}
}

func TestKilledByTermination(t *testing.T) {
	if !killedByTermination(killed(15)) || !killedByTermination(exited(143)) || killedByTermination(exited(1)) {
		t.Error("killedByTermination wrong")
	}
}
