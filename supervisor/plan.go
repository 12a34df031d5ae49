package supervisor

import (
	"net/url"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// The stop is planned, then done, the way the kubelet's SyncPod carries
// out the podActions that computePodActions decided
// (pkg/kubelet/kuberuntime/kuberuntime_manager.go). planStop decides,
// from the outcome, the settings and what is known of each sidecar, every
// step of a round of the stop: for each sidecar in turn, its POSTs, its
// wait for a handler, its signal, the fallback of a failed POST, and the
// escalation. It reads no clock and does no I/O, so every path of the
// stop is a row of a table (TestStopPlan). act (act.go) does the steps
// and watchExits the escalation; what only the doing can learn picks
// between branches the plan holds: whether a POST worked (else the
// fallback), when the sidecar handles its signal (the wait ends), whether
// it exits in time (else SIGKILL).

// stepKind is a kind of thing done to a sidecar.
type stepKind int

const (
	// stepDrain POSTs url ahead of the quit and awaits its answer
	// (postBefore); whatever the answer, the next step follows.
	stepDrain stepKind = iota
	// stepPost POSTs url until it is answered or the sidecar exits
	// (postUntilAnswered); if it does not work, the fallback follows.
	stepPost
	// stepPosted: an earlier sidecar of the round POSTs url, once for all
	// (sidecars may share one endpoint); its result is this one's, and
	// if it did not work, this one's fallback follows.
	stepPosted
	// stepAwaitHandler waits until the sidecar handles signal (handler.go),
	// within handlerWait of the round's start.
	stepAwaitHandler
	// stepSignal sends signal through the sidecar's pidfd.
	stepSignal
	// stepLeave leaves the sidecar running: its action is none.
	stepLeave
)

// step is one thing done to a sidecar.
type step struct {
	kind   stepKind
	url    *url.URL         // stepDrain, stepPost, stepPosted
	signal exitwatch.Signal // stepAwaitHandler, stepSignal
}

// sidecarStop is the plan for one sidecar.
type sidecarStop struct {
	sidecar *sidecar
	// action is its action (actionFor); own, when it is not the outcome's:
	// the summary names it.
	action Action
	own    bool
	steps  []step
	// fallback follows a POST that did not work: SIGTERM, once handled.
	fallback []step
	// kill: if it is still up killAfter after the round's steps, SIGKILL;
	// false for a sidecar left running.
	kill bool
}

// stopPlan is a round of the stop.
type stopPlan struct {
	// sidecars are done in this order, each step in turn.
	sidecars []sidecarStop
	// handlerWait bounds the waits for handlers, from the round's start
	// (SidecarStartTimeout); killAfter is when, after the steps, a sidecar
	// still up gets SIGKILL (StopTimeout); giveUpAfter, when after that it
	// is given up (killWait).
	handlerWait, killAfter, giveUpAfter time.Duration
}

// killWait bounds the wait for a sidecar to vanish after SIGKILL, which it
// cannot ignore; only a process stuck in the kernel outlasts it.
const killWait = 10 * time.Second

// planStop plans a round of the stop of sidecars, in their order, after
// outcome.
func planStop(outcome Outcome, cfg *Config, sidecars []*sidecar) stopPlan {
	p := stopPlan{handlerWait: cfg.SidecarStartTimeout, killAfter: cfg.StopTimeout, giveUpAfter: killWait}
	posting := map[string]bool{} // the URLs an earlier sidecar POSTs
	for _, s := range sidecars {
		action := actionFor(outcome, cfg, s)
		sp := sidecarStop{sidecar: s, action: action, own: action != cfg.ActionFor(outcome), kill: action.Kind != ActionNone}
		switch action.Kind {
		case ActionHTTP:
			if u := action.URL.String(); posting[u] {
				sp.steps = []step{{kind: stepPosted, url: action.URL}}
			} else {
				posting[u] = true
				if b := s.beforeURL(action.URL); b != nil {
					sp.steps = append(sp.steps, step{kind: stepDrain, url: b})
				}
				sp.steps = append(sp.steps, step{kind: stepPost, url: action.URL})
			}
			sp.fallback = signalSteps(exitwatch.SIGTERM)
		case ActionSignal:
			sp.steps = signalSteps(action.Signal)
		case ActionNone:
			sp.steps = []step{{kind: stepLeave}}
		}
		p.sidecars = append(p.sidecars, sp)
	}
	return p
}

// signalSteps send sig; a graceful one only once the sidecar handles it.
func signalSteps(sig exitwatch.Signal) []step {
	if sig.Graceful() {
		return []step{{kind: stepAwaitHandler, signal: sig}, {kind: stepSignal, signal: sig}}
	}
	return []step{{kind: stepSignal, signal: sig}}
}

// actionFor is a sidecar's action: its own, if SIDECAR_ACTIONS names it
// (by process or container name); a known sidecar's own stop (sidecars.go)
// unless it is Istio's; else the outcome's.
func actionFor(outcome Outcome, cfg *Config, s *sidecar) Action {
	for name, a := range cfg.SidecarActions {
		if s.main.Matches([]string{name}) || s.container == name {
			return a
		}
	}
	if s.known != nil && s.known.name != istio {
		return knownAction(outcome, cfg, s)
	}
	return cfg.ActionFor(outcome)
}

// knownAction is how a known sidecar other than Istio's is stopped, where
// SUPERVISOR_SIDECAR_ACTIONS does not say: its HTTP stop where it has one
// (it works across uids, a signal does not), else SIGTERM on success and
// the outcome's action otherwise.
func knownAction(outcome Outcome, cfg *Config, s *sidecar) Action {
	if u := s.known.stopURL(s.args); u != nil {
		return Action{Kind: ActionHTTP, URL: u}
	}
	if outcome == Success {
		return Action{Kind: ActionSignal, Signal: exitwatch.SIGTERM}
	}
	return cfg.ActionFor(outcome)
}
