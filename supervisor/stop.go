package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// maxStopRounds bounds how often sidecars that come back (restarted, or
// started late) during the stop are stopped again.
const maxStopRounds = 3

// stop finds the sidecars, plans their stop (planStop), does it (act) and
// sees them exit, escalating to SIGKILL after StopTimeout (watchExits).
// Sidecars that appear meanwhile (one that was restarted, or started late)
// are stopped too, in a few more rounds, each planned anew.
func (r *run) stop(ctx context.Context) (state, error) {
	// Not yet: a stop begun again (salvage) has not acted either.
	r.stopping, r.touched = false, false
	sidecars, next, err := r.findSidecars(ctx)
	if next != nil || err != nil || len(sidecars) == 0 {
		return next, err
	}
	r.stopping = true
	begun := time.Now()
	if r.acted == nil {
		r.acted = map[int]bool{}
	}
	for round := 1; ; round++ {
		for _, s := range sidecars {
			r.acted[s.main.PID] = true
		}
		r.awaitArgs(ctx, sidecars)
		plan := planStop(r.decision.outcome, &r.cfg, sidecars)
		if next := r.act(ctx, plan); next != nil {
			closeAll(sidecars)
			return next, nil
		}
		next, err := r.watchExits(ctx, plan, begun)
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
		sidecars = r.trackSidecars(pod, r.acted)
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

// argsWait bounds the wait for a sidecar found in the middle of its exec
// to show its command line: the rest of an exec, work of the kernel's of a
// few milliseconds at most.
const argsWait = 2 * time.Second

// awaitArgs reads the command line of each sidecar whose stop needs it
// and that was found in the middle of its exec (sidecar.readArgs), waiting
// up to argsWait for it, or until it exits or the pod is deleted. Past the
// bound, its stop is planned without its flags, and the log says so.
func (r *run) awaitArgs(ctx context.Context, sidecars []*sidecar) {
	deadline := time.Now().Add(argsWait)
	for _, s := range sidecars {
		for !s.readArgs(r.scan) && !s.exited() && ctx.Err() == nil {
			if !time.Now().Before(deadline) {
				r.log.Warn().Int("pid", s.main.PID).Str("container", s.container).Dur("waited", argsWait).
					Msg("the sidecar's command line is still empty (a process in the middle of its exec shows none): its stop is planned without its flags")
				break
			}
			select {
			case <-s.proc.Done():
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

// errGaveUp ends the stop when a sidecar survived SIGKILL: already noted
// and logged, not an error of the run.
var errGaveUp = errors.New("sidecar survived SIGKILL")

// findSidecars takes the sidecars' main processes, waiting up to
// SidecarStartTimeout for one to appear if none runs yet.
func (r *run) findSidecars(ctx context.Context) ([]*sidecar, state, error) {
	// The sidecars found by discovery, if still up, spare a scan of the
	// whole of /proc on the way to the stop (28 ms with 1,000 processes in
	// the pod); any started since are found by the scan after the stop.
	if alive := r.aliveFound(); len(alive) > 0 {
		return alive, nil, nil
	}
	if r.resumed.sidecars {
		// The supervisor before saw the sidecars, so they have started:
		// one not running now has exited (stopped by it, or on its own),
		// and none is to be waited for.
		pod, err := r.scan.Scan()
		if err != nil {
			return nil, nil, fmt.Errorf("read /proc: %w", err)
		}
		if out := r.trackSidecars(pod, nil); len(out) > 0 {
			return out, nil, nil
		}
		r.log.Info().Msg("the sidecars seen before the supervisor's restart have exited: nothing left to stop")
		r.note("sidecars exited before the supervisor's restart")
		return nil, nil, nil
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
		// What is new is adopted as discovery does: a sidecar found is
		// kept in found, an app started again withdraws the decision. A
		// settled run (salvage's) adopts no app: it only takes the
		// sidecars.
		var out []*sidecar
		if r.settled {
			out = r.trackSidecars(pod, nil)
		} else if next := r.appsAgain(pod); next != nil {
			return nil, next, nil
		} else {
			out = r.aliveFound()
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

// aliveFound takes the sidecars found (found) that still run.
func (r *run) aliveFound() []*sidecar {
	var alive []*sidecar
	for _, s := range r.takeFound() {
		select {
		case <-s.proc.Done():
			s.proc.Close()
		default:
			alive = append(alive, s)
		}
	}
	return alive
}

// An app container started again after the decision, before any sidecar
// was touched, withdraws it: the sidecar must stay up while an app runs.
// The kubelet starts a container again whatever the restart policy when
// it finds it created and not started (ShouldContainerBeRestarted:
// "Always restart container in the unknown, or in the created state"):
// after its own restart, or the runtime's, under a start in flight. The
// first attempt's process may have run its program and been killed by the
// runtime's cleanup ("failed to start containerd task: context canceled"),
// so its end looked like the app's own, and the decision came at once
// under Never (the soak, seed 20261209, Job 62: istio-proxy, which started
// late, was stopped under the app's second attempt). Nothing in the pod
// tells such an end from a real one; the second attempt, seen, does. So
// the waits between the decision and the first action (for a sidecar to
// appear, findSidecars; for it to handle its signal, awaitHandler) adopt
// what a scan shows, as discovery does; a new app instance sends the run
// back to the wait, and the decision is made again on the apps' new ends.
// Once a sidecar has been drained, asked or signalled, the stop goes on.
//
// appsAgain adopts what pod shows (adopt: a sidecar found is kept in
// found), and returns the wait if that added an app instance. Its callers
// do not ask it in a settled run (Guard's stops, salvage's), whose
// decision stands.
func (r *run) appsAgain(pod procscan.Pod) state {
	n := r.apps.count()
	r.adopt(pod)
	if r.apps.count() == n {
		return nil
	}
	r.log.Warn().Stringer("outcome", r.decision.outcome).Str("reason", r.decision.reason).
		Msg("an app container started again after the decision, before any sidecar was stopped (the kubelet retries a start the runtime did not finish, whatever the restart policy): decision withdrawn, the sidecars stay up until it ends")
	r.note("decision withdrawn (" + r.decision.outcome.String() + ": " + r.decision.reason + "): an app container started again")
	r.decision = decision{}
	return r.wait
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

// reportExits says which sidecars exited non-zero (or, where the kernel
// cannot tell, will) after the apps succeeded: under restartPolicy Never
// the pod is then Failed, under OnFailure the kubelet restarts them
// (restarting: Guard stops them again).
func (r *run) reportExits(sidecars []*sidecar) {
	if r.decision.outcome != Success {
		return
	}
	for _, s := range sidecars {
		code, read, fix := exitOf(s)
		if code == 0 {
			continue
		}
		then := "the pod will be Failed"
		if r.cfg.RestartPolicy == OnFailure {
			then = "the kubelet will restart it"
			r.restarting = append(r.restarting, s.container)
		}
		msg := fmt.Sprintf("%s exited %d: %s", s.container, code, then)
		if !read {
			msg = fmt.Sprintf("%s will exit %d: %s", s.container, code, then)
		}
		if fix != "" {
			msg += "; " + fix
		}
		r.log.Warn().Str("container", s.container).Int("exit_code", code).Str("fix", fix).Msg("sidecar exited non-zero after the apps succeeded")
		r.note(msg)
	}
}

// exitOf is the container exit code s gave the kubelet (read: the kernel
// told), or will give for the signal it was sent (its table's, where the
// kernel cannot tell), and fix, how to make it 0 where known.
func exitOf(s *sidecar) (code int, read bool, fix string) {
	st := s.proc.Status()
	switch {
	case st.Known:
		code = st.ContainerCode()
		if _, f := s.expectExit(exitwatch.SIGTERM); code != 0 {
			fix = f
		}
		return code, true, fix
	case s.sent != 0:
		code, fix = s.expectExit(s.sent)
	}
	return code, false, fix
}
