package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// A graceful stop must never kill a sidecar by the signal's default action:
// pilot-agent killed by SIGTERM exits 143, and under restartPolicy Never a
// pod whose app succeeded is then Failed (issue 16: an app that ended as
// istio-proxy was starting). Before a graceful signal the supervisor waits,
// bounded by SidecarStartTimeout, until the sidecar handles it:
//
//   - the kernel's fact, for every program: the signal is caught or ignored
//     (/proc/PID/status SigCgt, SigIgn; world-readable);
//   - for a Go program the kernel's fact is not enough: the Go runtime
//     catches nearly every signal from its first milliseconds, and until the
//     program calls signal.Notify its handler applies the default action
//     itself (procscan.TestSignalsGoRuntime). Nothing in /proc shows the
//     Notify call, so for the sidecars whose start we know, the table
//     (sidecars.go) names what does: a child the sidecar starts only after
//     the call (pilot-agent's envoy).

// unready says why s would die of sig's default action now, or "" when it
// handles sig (or is gone). Dispositions that cannot be read (gVisor's
// status has none) leave the table's fact alone to decide, and the reason
// logged once.
func (r *run) unready(s *sidecar, sig exitwatch.Signal) string {
	sigs, err := r.scan.Signals(s.main.PID)
	if s.exited() || errors.Is(err, exitwatch.ErrGone) {
		return ""
	}
	switch {
	case err != nil:
		if !s.blindDispositions {
			s.blindDispositions = true
			r.log.Warn().Err(err).Int("pid", s.main.PID).Str("container", s.container).
				Msg("cannot read the sidecar's signal dispositions: only a known sidecar's own sign of its handler is waited for")
		}
	case !sigs.Handles(int(sig)):
		return fmt.Sprintf("it neither catches nor ignores %s yet (SigCgt, SigIgn)", sig)
	}
	k := s.known
	if k == nil || !slices.Contains(k.handles, sig) || s.handlerSeen {
		return ""
	}
	if s.seeHandler(r.scan) || s.exited() {
		return ""
	}
	return fmt.Sprintf("%s has not started %s yet: it asks for %s just before, and dies of it until then", k.processes[0], k.handlerWith, sig)
}

// awaitHandler waits until s handles sig, the sidecar exits, or deadline;
// at the deadline it says so and lets the signal go. It returns the
// deleted state if the pod is deleted meanwhile, and the wait if, before
// any sidecar was touched, an app container started again (appsAgain; not
// in a settled run).
func (r *run) awaitHandler(ctx context.Context, s *sidecar, sig exitwatch.Signal, deadline time.Time) state {
	begun := time.Now()
	waiting := false
	for {
		why := r.unready(s, sig)
		if why == "" {
			if waiting {
				r.log.Info().Int("pid", s.main.PID).Str("container", s.container).Stringer("signal", sig).
					Dur("elapsed", time.Since(begun)).Msg("sidecar handles the signal now")
			}
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			r.log.Warn().Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).Stringer("signal", sig).
				Str("reason", why).Str("timeout", r.cfg.SidecarStartTimeout.String()).
				Msg("sidecar still does not handle the signal: sending it anyway, it may die of it")
			r.note(fmt.Sprintf("%s did not handle %s within %s (%s): sent anyway", s.main.Comm, sig, r.cfg.SidecarStartTimeout, why))
			return nil
		}
		if !waiting {
			waiting = true
			r.log.Info().Int("pid", s.main.PID).Str("comm", s.main.Comm).Str("container", s.container).Stringer("signal", sig).
				Str("reason", why).Str("timeout", r.cfg.SidecarStartTimeout.String()).
				Msg("sidecar would die of the signal now: waiting until it handles it")
		}
		t := time.NewTimer(min(r.cfg.ScanInterval, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return r.deleted
		case <-s.proc.Done():
		case <-t.C:
		}
		t.Stop()
		if !r.touched && !r.settled {
			// A scan's error leaves the check to the next tick.
			if pod, err := r.scan.Scan(); err == nil {
				if next := r.appsAgain(pod); next != nil {
					return next
				}
			}
		}
	}
}
