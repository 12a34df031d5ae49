package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// ErrNotShared means the supervisor sees no process outside its own
// container: the pod does not share its PID namespace.
var ErrNotShared = errors.New("no process outside the supervisor's own container is visible: " +
	"the pod does not share its process namespace; set shareProcessNamespace: true in the pod spec")

// killWait bounds the wait for a sidecar to vanish after SIGKILL, which it
// cannot ignore; only a process stuck in the kernel outlasts it.
const killWait = 10 * time.Second

// Scanner returns the pod as /proc shows it now.
type Scanner interface {
	Scan() (procscan.Pod, error)
}

// ProcScanner is the real Scanner: procscan over a proc filesystem.
type ProcScanner struct {
	Procs *procscan.Scanner
	Self  int
	Rules procscan.Rules
}

// Scan reads /proc and classifies its processes.
func (p ProcScanner) Scan() (procscan.Pod, error) {
	procs, err := p.Procs.Processes()
	if err != nil {
		return procscan.Pod{}, err
	}
	return procscan.Classify(procs, p.Self, p.Rules), nil
}

// PostFunc sends an HTTP action; Post is the real one.
type PostFunc func(ctx context.Context, u *url.URL, timeout time.Duration) (int, error)

// Supervisor runs the loop described in the package documentation.
type Supervisor struct {
	cfg    Config
	log    zerolog.Logger
	scan   Scanner
	kernel Kernel
	post   PostFunc
}

// New returns a Supervisor. post may be nil for the real HTTP client.
func New(cfg Config, log zerolog.Logger, scan Scanner, kernel Kernel, post PostFunc) *Supervisor {
	if post == nil {
		post = Post
	}
	return &Supervisor{cfg: cfg, log: log, scan: scan, kernel: kernel, post: post}
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
}

// app is one application container being waited for.
type app struct {
	container string
	main      procscan.Process
	proc      Proc // nil when it was never held
	status    ExitStatus
	done      bool
}

// run holds the state of one Run: the states below are its methods, each
// returning the next state.
type run struct {
	*Supervisor
	apps   []*app
	seen   map[string]bool // container IDs already adopted
	warned map[int]bool    // stray processes already warned of
	res    Result
	notes  []string // for the summary
	// stopping is set once the action is being applied to the sidecars.
	stopping bool
}

type state func(ctx context.Context) (state, error)

// Run supervises until the sidecars are stopped or ctx is cancelled (pod
// deletion). Errors mean the supervisor cannot work here (exit 1).
func (s *Supervisor) Run(ctx context.Context) (Result, error) {
	r := &run{Supervisor: s, seen: map[string]bool{}, warned: map[int]bool{}}
	defer func() {
		for _, a := range r.apps {
			if a.proc != nil {
				a.proc.Close()
			}
		}
	}()
	var err error
	for st := r.start; st != nil && err == nil; {
		st, err = st(ctx)
	}
	if err != nil {
		return r.res, err
	}
	r.res.Summary = r.summary()
	return r.res, nil
}

// start checks the pod shares its PID namespace, then discovers.
func (r *run) start(ctx context.Context) (state, error) {
	pod, err := r.scan.Scan()
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	if !pod.Outside() {
		return nil, ErrNotShared
	}
	r.adopt(pod)
	return r.discover, nil
}

// discover looks for application containers until enough are seen, within
// AppStartTimeout. The only polling of the whole run.
func (r *run) discover(ctx context.Context) (state, error) {
	want := max(r.cfg.AppContainers, 1)
	deadline := time.NewTimer(r.cfg.AppStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(r.cfg.ScanInterval)
	defer tick.Stop()
	for len(r.apps) < want {
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case <-deadline.C:
			missing := want - len(r.apps)
			r.log.Warn().Int("expected", want).Int("seen", len(r.apps)).Dur("elapsed", r.cfg.AppStartTimeout).
				Msg("app containers missing: they finished before the supervisor started, or never started")
			for i := 0; i < missing; i++ {
				r.apps = append(r.apps, &app{
					container: fmt.Sprintf("missing-%d", i+1), done: true,
					status: ExitStatus{Reason: "never seen within " + EnvPrefix + "APP_START_TIMEOUT"},
				})
			}
			return r.wait, nil
		case <-tick.C:
			pod, err := r.scan.Scan()
			if err != nil {
				return nil, fmt.Errorf("read /proc: %w", err)
			}
			r.adopt(pod)
		}
	}
	return r.wait, nil
}

// adopt starts watching the app containers not seen before.
func (r *run) adopt(pod procscan.Pod) {
	for _, c := range pod.Containers {
		for _, p := range c.Stray {
			if !r.warned[p.PID] {
				r.warned[p.PID] = true
				r.log.Warn().Int("pid", p.PID).Str("comm", p.Comm).Str("container", c.Name).
					Msg("process has a sidecar name but is not the main process of its container: not a sidecar, never stopped")
			}
		}
		if c.Kind != procscan.App || r.seen[c.ID] {
			continue
		}
		r.seen[c.ID] = true
		a := &app{container: c.Name, main: c.Main}
		r.apps = append(r.apps, a)
		if !c.HasMain {
			a.done, a.status = true, ExitStatus{Reason: "its main process had exited before the supervisor saw it"}
			r.log.Warn().Str("container", c.Name).Str("reason", a.status.Reason).Msg("app exited")
			continue
		}
		proc, err := r.kernel.Open(c.Main, true)
		switch {
		case errors.Is(err, ErrGone):
			a.done, a.status = true, ExitStatus{Reason: "it exited before the supervisor could watch it"}
			r.log.Warn().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).
				Str("reason", a.status.Reason).Msg("app exited")
		case err != nil:
			a.done, a.status = true, ExitStatus{Reason: err.Error()}
			r.log.Error().Err(err).Int("pid", c.Main.PID).Str("container", c.Name).Msg("cannot watch app; its status is unknown")
		default:
			a.proc = proc
			r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).
				Int("uid", c.Main.UID).Str("method", r.kernel.Method()).Msg("app found")
		}
	}
}

// wait blocks, without polling, until every app has exited.
func (r *run) wait(ctx context.Context) (state, error) {
	exits := make(chan *app, len(r.apps)) // buffered: no goroutine is left blocked
	pending := 0
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, a := range r.apps {
		if a.done {
			continue
		}
		pending++
		go func(a *app) {
			select {
			case <-a.proc.Done():
				exits <- a
			case <-waitCtx.Done():
			}
		}(a)
	}
	for pending > 0 {
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case a := <-exits:
			pending--
			a.done, a.status = true, a.proc.Status()
			ev := r.log.Info().Int("pid", a.main.PID).Str("comm", a.main.Comm).Str("container", a.container).
				Str("method", r.kernel.Method())
			logStatus(ev, a.status).Msg("app exited")
		}
	}
	return r.decide, nil
}

func logStatus(ev *zerolog.Event, s ExitStatus) *zerolog.Event {
	switch {
	case !s.Known:
		return ev.Str("status", "unknown").Str("reason", s.Reason)
	case s.Signal != 0:
		return ev.Stringer("signal", s.Signal).Int("exit_code", s.ContainerCode())
	}
	return ev.Int("exit_code", s.Code)
}

// decide maps the statuses to an action. An app killed by SIGTERM may be
// the pod being deleted (the kubelet signals every container at once, and
// ours may arrive second): wait DeletionGrace for our own SIGTERM first.
func (r *run) decide(ctx context.Context) (state, error) {
	for _, a := range r.apps {
		r.res.Apps = append(r.res.Apps, AppStatus{Container: a.container, Status: a.status})
	}
	outcome, reason := Decide(r.res.Apps)
	r.res.Outcome, r.res.Reason = outcome, reason
	if outcome == Failure && r.cfg.DeletionGrace > 0 {
		if a := r.terminated(); a != nil {
			r.log.Info().Str("container", a.container).Str("grace", r.cfg.DeletionGrace.String()).
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
	r.res.Action = r.cfg.ActionFor(outcome)
	r.log.Info().Stringer("outcome", outcome).Stringer("action", r.res.Action).Str("reason", reason).Msg("decision")
	if r.res.Action.Kind == ActionNone {
		r.note("sidecar left running (action none)")
		r.log.Info().Msg("sidecar left running: the action is none")
		return nil, nil
	}
	return r.stop, nil
}

// terminated returns an app that ended the way the kubelet's SIGTERM ends
// one, or nil.
func (r *run) terminated() *app {
	for _, a := range r.apps {
		if killedByTermination(a.status) {
			return a
		}
	}
	return nil
}

// sidecar is one sidecar main process being stopped.
type sidecar struct {
	container string
	main      procscan.Process
	proc      Proc
	gone      bool
}

// stop applies the action to every sidecar and sees them exit, escalating
// to SIGKILL after StopTimeout.
func (r *run) stop(ctx context.Context) (state, error) {
	sidecars, next, err := r.findSidecars(ctx)
	if next != nil || err != nil || len(sidecars) == 0 {
		return next, err
	}
	defer func() {
		for _, s := range sidecars {
			s.proc.Close()
		}
	}()
	r.stopping = true
	begun := time.Now()
	act := r.res.Action
	if act.Kind == ActionHTTP {
		code, err := r.post(ctx, act.URL, r.cfg.HTTPTimeout)
		switch {
		case ctx.Err() != nil:
			return r.deleted, nil
		case err != nil || code < 200 || code > 299:
			reason := fmt.Sprintf("status %d", code)
			if err != nil {
				reason = err.Error()
			}
			r.log.Warn().Str("url", act.URL.Redacted()).Str("reason", reason).Msg("http action failed: falling back to SIGTERM")
			r.note("POST failed (" + reason + "), sent SIGTERM")
			act = Action{Kind: ActionSignal, Signal: SIGTERM}
		default:
			r.log.Info().Str("url", act.URL.Redacted()).Int("status", code).Str("method", "http").Msg("sidecar asked to stop")
		}
	}
	if act.Kind == ActionSignal {
		for _, s := range sidecars {
			r.signal(s, act.Signal)
		}
	}
	return r.watchSidecars(ctx, sidecars, begun)
}

// findSidecars holds the sidecars' main processes, waiting up to
// SidecarStartTimeout for one to appear if none runs yet.
func (r *run) findSidecars(ctx context.Context) ([]*sidecar, state, error) {
	deadline := time.NewTimer(r.cfg.SidecarStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(r.cfg.ScanInterval)
	defer tick.Stop()
	waiting := false
	for {
		pod, err := r.scan.Scan()
		if err != nil {
			return nil, nil, fmt.Errorf("read /proc: %w", err)
		}
		var out []*sidecar
		for _, c := range pod.Of(procscan.Sidecar) {
			proc, err := r.kernel.Open(c.Main, false)
			if errors.Is(err, ErrGone) {
				continue
			}
			if err != nil {
				for _, s := range out {
					s.proc.Close()
				}
				return nil, nil, fmt.Errorf("hold sidecar %s (pid %d): %w", c.Name, c.Main.PID, err)
			}
			out = append(out, &sidecar{container: c.Name, main: c.Main, proc: proc})
		}
		if len(out) > 0 {
			return out, nil, nil
		}
		if !waiting {
			waiting = true
			r.log.Info().Strs("names", r.cfg.SidecarProcesses).Str("timeout", r.cfg.SidecarStartTimeout.String()).
				Msg("no sidecar running yet: waiting for one")
		}
		select {
		case <-ctx.Done():
			return nil, r.deleted, nil
		case <-deadline.C:
			r.log.Warn().Strs("names", r.cfg.SidecarProcesses).Str("timeout", r.cfg.SidecarStartTimeout.String()).
				Msg("no sidecar appeared: nothing to stop")
			r.note("no sidecar appeared")
			return nil, nil, nil
		case <-tick.C:
		}
	}
}

func (r *run) signal(s *sidecar, sig Signal) {
	err := s.proc.Signal(sig)
	ev := r.log.Info()
	msg := "sidecar signalled"
	switch {
	case errors.Is(err, ErrGone):
		msg = "sidecar already gone"
	case err != nil:
		ev = r.log.Error().Err(err)
		msg = "cannot signal sidecar"
	}
	ev.Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).
		Stringer("signal", sig).Str("method", "pidfd").Msg(msg)
}

// watchSidecars waits for every sidecar to exit: SIGKILL after StopTimeout,
// then killWait more before giving up.
func (r *run) watchSidecars(ctx context.Context, sidecars []*sidecar, begun time.Time) (state, error) {
	exits := make(chan *sidecar, len(sidecars))
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, s := range sidecars {
		go func(s *sidecar) {
			select {
			case <-s.proc.Done():
				exits <- s
			case <-watchCtx.Done():
			}
		}(s)
	}
	timer := time.NewTimer(r.cfg.StopTimeout)
	defer timer.Stop()
	killed := false
	for left := len(sidecars); left > 0; {
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case s := <-exits:
			left--
			s.gone = true
			r.log.Info().Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).
				Dur("elapsed", time.Since(begun)).Msg("sidecar stopped")
		case <-timer.C:
			if killed {
				for _, s := range sidecars {
					if !s.gone {
						r.log.Error().Int("pid", s.main.PID).Str("container", s.container).Dur("elapsed", time.Since(begun)).
							Msg("sidecar still running after SIGKILL: giving up")
						r.note(fmt.Sprintf("%s still running after SIGKILL", s.main.Comm))
					}
				}
				return nil, nil
			}
			killed = true
			for _, s := range sidecars {
				if !s.gone {
					r.log.Warn().Int("pid", s.main.PID).Str("container", s.container).Str("timeout", r.cfg.StopTimeout.String()).
						Msg("sidecar did not stop in time: sending SIGKILL")
					r.note(fmt.Sprintf("%s did not stop within %s, sent SIGKILL", s.main.Comm, r.cfg.StopTimeout))
					r.signal(s, SIGKILL)
				}
			}
			timer.Reset(killWait)
		}
	}
	r.note(fmt.Sprintf("sidecar stopped in %.1fs", time.Since(begun).Seconds()))
	return nil, nil
}

// deleted ends the run on SIGTERM: the kubelet is stopping every container,
// the sidecar included, so nothing is done to it.
func (r *run) deleted(ctx context.Context) (state, error) {
	r.res.Deleted = true
	r.log.Info().Msg("pod is being deleted (SIGTERM): leaving the sidecar to the kubelet")
	return nil, nil
}

func (r *run) note(s string) { r.notes = append(r.notes, s) }

// summary is the one-line account for the termination message.
func (r *run) summary() string {
	var b strings.Builder
	switch {
	case r.res.Deleted && r.res.Apps == nil:
		b.WriteString("pod deleted before the apps finished: sidecar left to the kubelet")
	case r.res.Deleted && !r.stopping:
		fmt.Fprintf(&b, "%s: %s; pod deleted: sidecar left to the kubelet", r.res.Outcome, r.res.Reason)
	case r.res.Deleted:
		fmt.Fprintf(&b, "%s: %s; action %s; pod deleted while stopping: sidecar left to the kubelet", r.res.Outcome, r.res.Reason, r.res.Action)
	default:
		fmt.Fprintf(&b, "%s: %s; action %s", r.res.Outcome, r.res.Reason, r.res.Action)
	}
	for _, n := range r.notes {
		b.WriteString("; ")
		b.WriteString(n)
	}
	return b.String()
}
