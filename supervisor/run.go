package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// ErrNotShared means the supervisor sees no process outside its own
// container: the pod does not share its PID namespace.
var ErrNotShared = errors.New("no process outside the supervisor's own container is visible: " +
	"the pod does not share its process namespace; set shareProcessNamespace: true in the pod spec")

// Watcher keeps processes by pidfd and reports their exits:
// exitwatch.Watcher, or a fake in tests. Watch is for an app, whose exit
// status is wanted; Track for a sidecar (or an app in the hold), whose
// exit alone matters.
type Watcher interface {
	Watch(p exitwatch.Process) (exitwatch.Proc, error)
	Track(p exitwatch.Process) (exitwatch.Proc, error)
	Method() exitwatch.Method
}

// process names a scanned process for exitwatch.
func process(p procscan.Process) exitwatch.Process {
	return exitwatch.Process{PID: p.PID, StartTime: p.StartTime}
}

// PostFunc sends an HTTP action; Post is the real one.
type PostFunc func(ctx context.Context, u *url.URL, timeout time.Duration) (int, error)

// Supervisor runs the loop described in the package documentation.
type Supervisor struct {
	cfg   Config
	log   zerolog.Logger
	scan  Scanner
	watch Watcher
	post  PostFunc
	// lock is the leader's lock, held from the run's start (lead.go).
	lock *os.File
}

// New returns a Supervisor. post may be nil for the real HTTP client.
func New(cfg Config, log zerolog.Logger, scan Scanner, watch Watcher, post PostFunc) *Supervisor {
	if post == nil {
		post = Post
	}
	return &Supervisor{cfg: cfg, log: log, scan: scan, watch: watch, post: post}
}

// Result is what a run did.
type Result struct {
	Outcome Outcome
	Reason  string
	Action  Action
	Apps    []AppStatus
	// Deleted is true when a SIGTERM (pod deletion) ended the run early.
	Deleted bool
	// Summary is the one-line account written as the termination message.
	Summary string
	// Restarting names the sidecars the kubelet will start again, under
	// OnFailure: their exit after the stop was not 0 (Guard).
	Restarting []string
	// acted holds the PIDs of the sidecar processes the stop acted on:
	// Guard stops only others (one the kubelet started again).
	acted map[int]bool
}

// run is the state of one Run: the states below are its methods, each
// returning the next state. Each field is written in one file, named
// beside it; the others only read it.
type run struct {
	*Supervisor
	// apps are the app instances and the restarts awaited (run.go makes
	// it; it changes only through its methods, restarts.go).
	apps *ledger

	// discover.go: kinds is what each container is taken for (kindOf);
	// warned, the stray processes already warned of; watched, the app
	// instances watched by pidfd, in the order they were found; found,
	// the sidecars seen while the apps ran, each kept by a pidfd until the
	// stop takes them (takeFound). look.go: starting, the containers seen
	// being set up (an app adopted from its runtime's init among them),
	// when first seen: kept from one look to the next, from discovery into
	// the wait.
	kinds    map[string]procscan.Kind
	warned   map[int]bool
	execd    map[instance]bool // said by execdBefore
	watched  []watchedApp
	found    []*sidecar
	starting map[instance]time.Time
	// offered: once a sidecar was offered to anchor accounting (anchor,
	// discover.go), or the wait's look for one ended (seekingAnchor,
	// wait.go, which keeps anchorBy, until when it looks).
	offered  bool
	anchorBy time.Time

	// decide.go: what the apps' ends add up to, and the action.
	decision decision

	// stop.go: stopping is set once the sidecars found are being stopped;
	// acted, the PIDs of the sidecar processes a round of the stop acted on.
	// act.go: touched, once this stop drained, asked or signalled
	// a sidecar (appsAgain withdraws a decision only before).
	stopping bool
	acted    map[int]bool
	touched  bool
	// guard.go, salvage: settled, the decision stands whatever is seen
	// (Guard's run has no ledger; salvage's no longer trusts its own).
	settled bool
	// act.go: own lists the sidecars stopped by an action of their own
	// ("cloud-sql-proxy: POST ..."), for the summary. stop.go: restarting,
	// those the kubelet will start again (reportExits).
	own        []string
	restarting []string

	// run.go: podDeleted, once a SIGTERM (pod deletion) ended the run;
	// notes, for the summary (note); unready, the ready file could not be
	// written: the kubelet's hooks on it may hold the apps back WaitLimit
	// (discover looks for them that much longer). lead.go: standby, the
	// leader a standby waited for to the pod's deletion.
	podDeleted  bool
	notes       []string
	readyFailed bool
	standby     string

	// progress.go: the progress last written (publish).
	published string

	// resume.go: journal keeps the run's facts in SUPERVISOR_STATE_DIR
	// (nil: none); resumed, what was taken over from an earlier
	// supervisor's.
	journal *journal
	resumed resumed
}

type state func(ctx context.Context) (state, error)

// Run supervises until the sidecars are stopped or ctx is cancelled (pod
// deletion). Errors mean the supervisor cannot work here (exit 1).
// A panic in the loop (a bug) is recovered: see salvage.
func (s *Supervisor) Run(ctx context.Context) (res Result, err error) {
	r := &run{Supervisor: s, apps: newLedger(s.cfg.RestartPolicy, s.cfg.WantApps(), s.cfg.RestartTimeout, s.cfg.RestartMargin),
		kinds: map[string]procscan.Kind{}, warned: map[int]bool{}, execd: map[instance]bool{}}
	defer func() {
		r.journal.close()
		for _, w := range r.watched {
			w.proc.Close()
		}
		closeAll(r.found)
	}()
	defer func() {
		if p := recover(); p != nil {
			res, err = r.salvage(ctx, p)
		}
	}()
	first := r.start
	if s.cfg.StateDir != "" {
		first = r.lead
	}
	if err := r.loop(ctx, first); err != nil {
		return r.result(), err
	}
	res = r.result()
	res.Summary = r.summary()
	return res, nil
}

// result is what the run did so far, without its summary.
func (r *run) result() Result {
	return Result{Outcome: r.decision.outcome, Reason: r.decision.reason, Action: r.decision.action,
		Apps: r.decision.apps, Deleted: r.podDeleted, Restarting: r.restarting, acted: r.acted}
}

// loop runs the states from st until one returns none, or an error.
func (r *run) loop(ctx context.Context, st state) error {
	var err error
	for st != nil && err == nil {
		st, err = st(ctx)
	}
	return err
}

// salvage ends a run whose loop panicked. Under restartPolicy Never
// nothing restarts the supervisor and nothing else stops the sidecar: the
// Job would hang for good. So it waits for the apps it watches to exit
// (their statuses no longer trusted), then applies the on-unknown action
// to the sidecars, and says so; the pod's phase stays the apps' to decide
// (exit 0). A second panic leaves the sidecar as it is.
func (r *run) salvage(ctx context.Context, p any) (res Result, err error) {
	r.log.Error().Str("panic", fmt.Sprint(p)).Str("stack", string(debug.Stack())).
		Msg("the supervisor failed (a bug: please report it): waiting for the apps it holds, then applying the on-unknown action")
	defer func() {
		if q := recover(); q != nil {
			r.log.Error().Str("panic", fmt.Sprint(q)).Msg("the supervisor failed again while recovering: the sidecar is left as it is")
			res, err = r.result(), fmt.Errorf("the supervisor failed twice (a bug): %v; %v", p, q)
		}
	}()
	for _, w := range r.watched {
		if !r.apps.running(w.id()) {
			continue
		}
		select {
		case <-w.proc.Done():
		case <-ctx.Done():
			r.podDeleted = true
			res = r.result()
			res.Summary = "the supervisor failed (" + fmt.Sprint(p) + "); pod deleted: sidecar left to the kubelet"
			return res, nil
		}
	}
	r.decideUnknown(p)
	r.settled = true
	if r.decision.action.Kind != ActionNone {
		if err := r.loop(ctx, r.stop); err != nil {
			return r.result(), err
		}
	}
	res = r.result()
	res.Summary = r.summary()
	return res, nil
}

// start checks the pod shares its PID namespace, then discovers. Once the
// first scan is taken in, the ready file says so (the kubelet's hooks wait
// for it to start the apps), whatever comes next.
func (r *run) start(ctx context.Context) (state, error) {
	pod, err := r.scan.Scan()
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	if !pod.Outside() {
		return nil, ErrNotShared
	}
	next := r.first(pod)
	if r.cfg.StateDir != "" {
		if err := ready(r.cfg.StateDir, true); err != nil {
			r.readyFailed = true
			r.log.Warn().Err(err).Str("dir", r.cfg.StateDir).Str("bound", WaitLimit.String()).
				Msg("cannot write the ready file: the kubelet's hooks on it wait out their bound before starting the apps, and the look for the apps is that much longer")
		}
	}
	return next, nil
}

// first takes in the first scan: what to do next.
func (r *run) first(pod procscan.Pod) state {
	switch {
	case r.cfg.NativeSidecar && r.cfg.RestartPolicy == Always:
		r.log.Info().Msg("the sidecar is a native sidecar, stopped by the kubelet: nothing to do; idle until the pod is deleted")
		return r.idle
	case r.cfg.NativeSidecar:
		r.log.Info().Msg("the sidecar is a native sidecar, stopped by the kubelet: nothing to do")
		r.note("native sidecar: nothing to do")
		return nil
	case r.cfg.RestartPolicy == Always:
		r.log.Info().Msg("restartPolicy Always: an app's exit never stops the sidecar; idle until the pod is deleted")
		return r.idle
	}
	r.resume(pod)
	r.adopt(pod)
	return r.discover
}

// deleted ends the run on SIGTERM: the kubelet is stopping every container,
// the sidecar included, so nothing is done to it.
func (r *run) deleted(ctx context.Context) (state, error) {
	r.podDeleted = true
	r.log.Info().Msg("pod is being deleted (SIGTERM): leaving the sidecar to the kubelet")
	return nil, nil
}

// ownActions names the sidecars stopped by an action of their own.
func (r *run) ownActions() string {
	if len(r.own) == 0 {
		return ""
	}
	return " (" + strings.Join(r.own, ", ") + ")"
}

// idle waits for the pod's deletion: under restartPolicy Always (or with a
// native sidecar) the sidecar is never the supervisor's to stop.
func (r *run) idle(ctx context.Context) (state, error) {
	<-ctx.Done()
	return r.deleted, nil
}

func (r *run) note(s string) { r.notes = append(r.notes, s) }

// summary is the one-line account for the termination message.
func (r *run) summary() string {
	var b strings.Builder
	d := r.decision
	switch {
	case r.standby != "":
		b.WriteString("standby: " + r.standby + " led to the pod's deletion")
	case d.apps == nil && !r.podDeleted:
		// Nothing was waited for (a native sidecar).
	case r.podDeleted && d.apps == nil:
		b.WriteString("pod deleted before the apps finished: sidecar left to the kubelet")
	case r.podDeleted && !r.stopping:
		fmt.Fprintf(&b, "%s: %s; pod deleted: sidecar left to the kubelet", d.outcome, d.reason)
	case r.podDeleted:
		fmt.Fprintf(&b, "%s: %s; action %s%s; pod deleted while stopping: sidecar left to the kubelet", d.outcome, d.reason, d.action, r.ownActions())
	default:
		fmt.Fprintf(&b, "%s: %s; action %s%s", d.outcome, d.reason, d.action, r.ownActions())
	}
	for _, n := range r.notes {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(n)
	}
	return b.String()
}
