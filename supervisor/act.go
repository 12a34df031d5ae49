package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// act does a round's plan (planStop), sidecar by sidecar, step by step:
// one POST per distinct URL, whose failure falls back to SIGTERM; signals
// through each pidfd, a graceful one only once the sidecar handles it
// (all within one SidecarStartTimeout from now). It returns the deleted
// state if the pod is deleted meanwhile.
func (r *run) act(ctx context.Context, plan stopPlan) state {
	posted := map[string]bool{} // URL -> its POST worked
	handlerBy := time.Now().Add(plan.handlerWait)
	for _, sp := range plan.sidecars {
		if sp.own {
			r.own = append(r.own, sp.sidecar.container+": "+sp.action.String())
		}
		failed, next := r.do(ctx, sp.sidecar, sp.steps, posted, handlerBy)
		if next == nil && failed {
			_, next = r.do(ctx, sp.sidecar, sp.fallback, posted, handlerBy)
		}
		if next != nil {
			return next
		}
	}
	return nil
}

// do does steps to s, in order, until a POST does not work (failed: the
// fallback is the caller's), or the pod is deleted (next).
func (r *run) do(ctx context.Context, s *sidecar, steps []step, posted map[string]bool, handlerBy time.Time) (failed bool, next state) {
	for _, st := range steps {
		if st.kind == stepDrain || st.kind == stepPost || st.kind == stepSignal {
			r.touched = true
		}
		switch st.kind {
		case stepDrain:
			r.postBefore(ctx, st.url, s)
		case stepPost:
			ok, next := r.postAction(ctx, st.url, s)
			if next != nil {
				return false, next
			}
			posted[st.url.String()] = ok
			if !ok {
				return true, nil
			}
		case stepPosted:
			if !posted[st.url.String()] {
				return true, nil
			}
		case stepAwaitHandler:
			if next := r.awaitHandler(ctx, s, st.signal, handlerBy); next != nil {
				return false, next
			}
		case stepSignal:
			r.signal(s, st.signal)
		case stepLeave:
			r.log.Info().Int("pid", s.main.PID).Str("container", s.container).Msg("sidecar left running: its action is none")
		}
	}
	return false, nil
}

// postAction POSTs u, s's action (postUntilAnswered), and says whether it
// worked: answered 2xx, or s exited meanwhile.
func (r *run) postAction(ctx context.Context, u *url.URL, s *sidecar) (ok bool, next state) {
	code, stopped, err := r.postUntilAnswered(ctx, u, s)
	if ctx.Err() != nil {
		return false, r.deleted
	}
	ok = stopped || err == nil && code >= 200 && code <= 299
	if ok {
		// status 0: the answer was lost, the sidecar stopped.
		r.log.Info().Str("url", u.Redacted()).Int("status", code).Str("method", "http").
			Str("container", s.container).Msg("sidecar asked to stop")
		return true, nil
	}
	reason := fmt.Sprintf("status %d", code)
	if err != nil {
		reason = err.Error()
	}
	r.log.Warn().Str("url", u.Redacted()).Str("reason", reason).Msg("http action failed: falling back to SIGTERM")
	r.note("POST failed (" + reason + "), sent SIGTERM")
	return false, nil
}

// signal sends sig to s through its pidfd, and says how it went.
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
		s.refused = true
		with(r.log.Error().Err(err).Str("fix", "run the supervisor as the sidecar's uid (istio-proxy: 1337), or use an http(s) action")).
			Msg("cannot signal sidecar: not permitted (its exit is not awaited)")
		r.note("not permitted to signal " + s.main.Comm)
	default:
		with(r.log.Error().Err(err)).Msg("cannot signal sidecar")
	}
}

// watchExits waits for the plan's sidecars to exit, and escalates as it
// says: SIGKILL to those still up killAfter after the steps, then
// giveUpAfter more before giving up on them.
func (r *run) watchExits(ctx context.Context, plan stopPlan, begun time.Time) (state, error) {
	exits := make(chan *sidecar, len(plan.sidecars))
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := map[*sidecar]bool{} // not seen to exit, and not left running
	left := 0
	for _, sp := range plan.sidecars {
		go func(s *sidecar) {
			select {
			case <-s.proc.Done():
				exits <- s
			case <-watchCtx.Done():
			}
		}(sp.sidecar)
		if sp.kill && !sp.sidecar.refused {
			up[sp.sidecar] = true
			left++
		}
	}
	timer := time.NewTimer(plan.killAfter)
	defer timer.Stop()
	killed := false
	for left > 0 {
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case s := <-exits:
			// Only an awaited sidecar counts down: one left running
			// (action none) may exit meanwhile without ending the wait,
			// and so the escalation, of the others.
			if up[s] {
				left--
				delete(up, s)
			}
			r.journalGone(s.main, s.container)
			r.log.Info().Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).
				Dur("elapsed", time.Since(begun)).Msg("sidecar stopped")
		case <-timer.C:
			if killed {
				for _, sp := range plan.sidecars {
					if s := sp.sidecar; up[s] {
						r.log.Error().Int("pid", s.main.PID).Str("container", s.container).Dur("elapsed", time.Since(begun)).
							Msg("sidecar still running after SIGKILL: giving up")
						r.note(fmt.Sprintf("%s still running after SIGKILL", s.main.Comm))
					}
				}
				return nil, errGaveUp
			}
			killed = true
			for _, sp := range plan.sidecars {
				if s := sp.sidecar; up[s] {
					r.log.Warn().Int("pid", s.main.PID).Str("container", s.container).Str("timeout", plan.killAfter.String()).
						Msg("sidecar did not stop in time: sending SIGKILL")
					r.note(fmt.Sprintf("%s did not stop within %s, sent SIGKILL", s.main.Comm, plan.killAfter))
					if r.signal(s, exitwatch.SIGKILL); s.refused {
						delete(up, s)
						left--
					}
				}
			}
			timer.Reset(plan.giveUpAfter)
		}
	}
	return nil, nil
}
