package supervisor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// decision is what the apps' ends add up to, and the action it calls for.
type decision struct {
	apps    []AppStatus // what it was made on; nil until then
	outcome Outcome
	reason  string
	action  Action
}

// decide maps the statuses to an action. An app killed by SIGTERM may be
// the pod being deleted (the kubelet signals every container at once, and
// ours may arrive second): wait DeletionGrace for our own SIGTERM first.
func (r *run) decide(ctx context.Context) (state, error) {
	r.decision.apps = r.apps.final()
	outcome, reason := Decide(r.decision.apps)
	r.decision.outcome, r.decision.reason = outcome, reason
	if outcome == Failure && r.cfg.DeletionGrace > 0 {
		if a, ok := terminated(r.decision.apps); ok {
			r.log.Info().Str("container", a.Container).Str("grace", r.cfg.DeletionGrace.String()).
				Msg("app ended by SIGTERM: waiting to see whether the pod is being deleted")
			t := time.NewTimer(r.cfg.DeletionGrace)
			select {
			case <-ctx.Done():
				t.Stop()
				return r.deleted, nil
			case <-t.C:
			}
		}
	}
	r.decision.action = r.cfg.ActionFor(outcome)
	r.publish(fmt.Sprintf("%s (%s): action %s", outcome, reason, r.decision.action))
	r.log.Info().Stringer("outcome", outcome).Stringer("action", r.decision.action).Str("reason", reason).Msg("decision")
	if r.decision.action.Kind == ActionNone {
		r.note("sidecar left running (action none)")
		r.log.Info().Msg("sidecar left running: the action is none")
		return nil, nil
	}
	return r.stop, nil
}

// decideUnknown decides for a run that failed (p, a panic: see salvage):
// every app is taken as finished, the outcome is Unknown.
func (r *run) decideUnknown(p any) {
	r.decision = decision{apps: r.apps.final(), outcome: Unknown, action: r.cfg.OnUnknown,
		reason: fmt.Sprintf("the supervisor failed (%v) and took every app as finished", p)}
	r.log.Info().Stringer("outcome", r.decision.outcome).Stringer("action", r.decision.action).Str("reason", r.decision.reason).Msg("decision")
}

// terminated returns an app that ended the way the kubelet's SIGTERM ends
// one, if any.
func terminated(apps []AppStatus) (AppStatus, bool) {
	for _, a := range apps {
		if killedByTermination(a.Status) {
			return a, true
		}
	}
	return AppStatus{}, false
}

// Outcome is what the application containers' statuses add up to.
type Outcome int

// The outcomes, in rising order of precedence.
const (
	// Success: every app container exited 0.
	Success Outcome = iota
	// Unknown: none failed, but at least one status is unknown.
	Unknown
	// Failure: at least one exited non-zero or was killed by a signal.
	Failure
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Unknown:
		return "unknown"
	case Failure:
		return "failure"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// AppStatus is one application container's end.
type AppStatus struct {
	Container string
	Status    exitwatch.Status
}

// Decide is the whole decision table: any failure makes a Failure (a known
// failure outweighs an unknown); else any unknown status makes Unknown,
// which is never taken for success; else Success. The reason names the
// containers that decided it.
func Decide(apps []AppStatus) (Outcome, string) {
	var failed, unknown []string
	for _, a := range apps {
		switch {
		case a.Status.Failure():
			failed = append(failed, a.Container+" "+a.Status.String())
		case !a.Status.Known:
			unknown = append(unknown, a.Container+" "+a.Status.String())
		}
	}
	switch {
	case len(apps) == 0:
		return Unknown, "no application container was seen"
	case len(failed) > 0 && len(unknown) > 0:
		return Failure, strings.Join(failed, ", ") + "; unknown: " + strings.Join(unknown, ", ")
	case len(failed) > 0:
		return Failure, strings.Join(failed, ", ")
	case len(unknown) > 0:
		return Unknown, strings.Join(unknown, ", ")
	}
	if len(apps) == 1 {
		return Success, apps[0].Container + " exit 0"
	}
	return Success, fmt.Sprintf("all %d app containers exit 0", len(apps))
}

// ActionFor is the configured action for an outcome.
func (c *Config) ActionFor(o Outcome) Action {
	switch o {
	case Success:
		return c.OnSuccess
	case Failure:
		return c.OnFailure
	}
	return c.OnUnknown
}

// killedByTermination reports whether an app's end looks like the kubelet's
// SIGTERM: killed by it, or exit 143 (128+15), as a shell reports a child
// killed by it.
func killedByTermination(s exitwatch.Status) bool {
	return s.Known && (s.Signal == exitwatch.SIGTERM || (s.Signal == 0 && s.Code == 128+int(exitwatch.SIGTERM)))
}
