package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// maxStopRounds bounds how often sidecars that come back (restarted, or
// started late) during the stop are stopped again.
const maxStopRounds = 3

// stop applies the action to every sidecar and sees them exit, escalating
// to SIGKILL after StopTimeout. Sidecars that appear meanwhile (one that
// was restarted, or started late) are stopped too, in a few more rounds.
func (r *run) stop(ctx context.Context) (state, error) {
	sidecars, next, err := r.findSidecars(ctx)
	if next != nil || err != nil || len(sidecars) == 0 {
		return next, err
	}
	r.stopping = true
	begun := time.Now()
	handled := map[int]bool{}
	for round := 1; ; round++ {
		for _, s := range sidecars {
			handled[s.main.PID] = true
		}
		if next := r.act(ctx, sidecars); next != nil {
			closeAll(sidecars)
			return next, nil
		}
		next, err := r.watchSidecars(ctx, sidecars, begun)
		if next == nil && err == nil {
			r.reportExits(sidecars)
		}
		closeAll(sidecars)
		if errors.Is(err, errGaveUp) {
			return nil, nil
		}
		if next != nil || err != nil {
			return next, err
		}
		// Anything new since? A sidecar the kubelet restarted at once is
		// a native sidecar, or the restartPolicy is not what we were told.
		pod, err := r.scan.Scan()
		if err != nil {
			return nil, fmt.Errorf("read /proc: %w", err)
		}
		sidecars = r.trackSidecars(pod, handled)
		if len(sidecars) == 0 {
			break
		}
		for _, s := range sidecars {
			r.log.Warn().Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).
				Str("restart_policy", string(r.cfg.RestartPolicy)).
				Msg("a sidecar appeared while stopping: started late, or restarted by the kubelet (then it is a native sidecar: set " +
					EnvPrefix + "NATIVE_SIDECAR=true; or the pod's restartPolicy is not " + EnvPrefix + "RESTART_POLICY)")
		}
		if round == maxStopRounds {
			closeAll(sidecars)
			r.note("sidecars kept coming back")
			return nil, nil
		}
	}
	r.note(fmt.Sprintf("sidecar stopped in %.1fs", time.Since(begun).Seconds()))
	return nil, nil
}

// errGaveUp ends the stop when a sidecar survived SIGKILL: already noted
// and logged, not an error of the run.
var errGaveUp = errors.New("sidecar survived SIGKILL")

// actionFor is a sidecar's action: its own, if SIDECAR_ACTIONS names it
// (by process or container name); a known sidecar's own stop (sidecars.go)
// unless it is Istio's; else the outcome's.
func (r *run) actionFor(s *sidecar) Action {
	for name, a := range r.cfg.SidecarActions {
		if s.main.Matches([]string{name}) || s.container == name {
			return a
		}
	}
	if s.known != nil && s.known.name != istio {
		return r.knownAction(s)
	}
	return r.res.Action
}

// act applies each sidecar's action: one POST per distinct URL (a failed
// one falls back to SIGTERM), signals through each pidfd, a graceful one
// only once the sidecar handles it (awaitHandler; all within one
// SidecarStartTimeout). It returns the deleted state if the pod is
// deleted meanwhile.
func (r *run) act(ctx context.Context, sidecars []*sidecar) state {
	posted := map[string]bool{} // URL -> the POST worked
	handlerDeadline := time.Now().Add(r.cfg.SidecarStartTimeout)
	for _, s := range sidecars {
		act := r.actionFor(s)
		if act != r.res.Action {
			r.own = append(r.own, s.container+": "+act.String())
		}
		if act.Kind == ActionHTTP {
			u := act.URL.String()
			ok, done := posted[u]
			if !done {
				if b := s.beforeURL(act.URL); b != nil {
					r.postBefore(ctx, b, s)
				}
				code, stopped, err := r.postUntilAnswered(ctx, act.URL, s)
				if ctx.Err() != nil {
					return r.deleted
				}
				ok = stopped || err == nil && code >= 200 && code <= 299
				posted[u] = ok
				if ok {
					// status 0: the answer was lost, the sidecar stopped.
					r.log.Info().Str("url", act.URL.Redacted()).Int("status", code).Str("method", "http").
						Str("container", s.container).Msg("sidecar asked to stop")
				} else {
					reason := fmt.Sprintf("status %d", code)
					if err != nil {
						reason = err.Error()
					}
					r.log.Warn().Str("url", act.URL.Redacted()).Str("reason", reason).Msg("http action failed: falling back to SIGTERM")
					r.note("POST failed (" + reason + "), sent SIGTERM")
				}
			}
			if ok {
				continue
			}
			act = Action{Kind: ActionSignal, Signal: exitwatch.SIGTERM}
		}
		switch act.Kind {
		case ActionSignal:
			if act.Signal.Graceful() {
				if next := r.awaitHandler(ctx, s, act.Signal, handlerDeadline); next != nil {
					return next
				}
			}
			r.signal(s, act.Signal)
		case ActionNone:
			r.log.Info().Int("pid", s.main.PID).Str("container", s.container).Msg("sidecar left running: its action is none")
			s.gone = true
		}
	}
	return nil
}

// findSidecars takes the sidecars' main processes, waiting up to
// SidecarStartTimeout for one to appear if none runs yet.
func (r *run) findSidecars(ctx context.Context) ([]*sidecar, state, error) {
	// The sidecars found by discovery, if still up, spare a scan of the
	// whole of /proc on the way to the stop (28 ms with 1,000 processes in
	// the pod); any started since are found by the scan after the stop.
	var alive []*sidecar
	for _, s := range r.found {
		select {
		case <-s.proc.Done():
			s.proc.Close()
		default:
			alive = append(alive, s)
		}
	}
	r.found = nil
	if len(alive) > 0 {
		return alive, nil, nil
	}
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
		if out := r.trackSidecars(pod, nil); len(out) > 0 {
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

// trackSidecars opens a pidfd on every sidecar main process not in skip.
// One that is gone already is skipped; one that cannot be tracked is
// logged and skipped (it cannot be signalled safely either).
func (r *run) trackSidecars(pod procscan.Pod, skip map[int]bool) []*sidecar {
	var out []*sidecar
	for _, c := range pod.Of(procscan.Sidecar) {
		// A container first seen as something else (an app's, an ignored
		// one's, with a process exec'd in after its main exited) is not one.
		if kind, _ := r.kindOf(c); skip[c.Main.PID] || kind != procscan.Sidecar {
			continue
		}
		proc, err := r.watch.Track(process(c.Main))
		if errors.Is(err, exitwatch.ErrGone) {
			continue
		}
		if err != nil {
			r.log.Error().Err(err).Int("pid", c.Main.PID).Str("container", c.Name).Msg("cannot hold sidecar")
			continue
		}
		out = append(out, newSidecar(c, proc, r.scan))
	}
	return out
}

func (r *run) signal(s *sidecar, sig exitwatch.Signal) {
	err := s.proc.Signal(sig)
	if err == nil {
		s.sent = sig
	}
	with := func(ev *zerolog.Event) *zerolog.Event {
		return ev.Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).
			Stringer("signal", sig).Str("method", "pidfd")
	}
	switch {
	case err == nil:
		with(r.log.Info()).Msg("sidecar signalled")
	case errors.Is(err, exitwatch.ErrGone):
		with(r.log.Info()).Msg("sidecar already gone")
	case errors.Is(err, os.ErrPermission):
		with(r.log.Error().Err(err).Str("fix", "run the supervisor as the sidecar's uid (istio-proxy: 1337), or use an http(s) action")).
			Msg("cannot signal sidecar: not permitted")
		r.note("not permitted to signal " + s.main.Comm)
	default:
		with(r.log.Error().Err(err)).Msg("cannot signal sidecar")
	}
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
	left := len(sidecars)
	for _, s := range sidecars {
		if s.gone { // left running on purpose
			left--
		}
	}
	for left > 0 {
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
				return nil, errGaveUp
			}
			killed = true
			for _, s := range sidecars {
				if !s.gone {
					r.log.Warn().Int("pid", s.main.PID).Str("container", s.container).Str("timeout", r.cfg.StopTimeout.String()).
						Msg("sidecar did not stop in time: sending SIGKILL")
					r.note(fmt.Sprintf("%s did not stop within %s, sent SIGKILL", s.main.Comm, r.cfg.StopTimeout))
					r.signal(s, exitwatch.SIGKILL)
				}
			}
			timer.Reset(killWait)
		}
	}
	return nil, nil
}
