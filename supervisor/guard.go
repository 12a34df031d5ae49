package supervisor

import (
	"context"
	"maps"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Guard is what the supervisor does once its run is done (res). The
// kubelet may start a sidecar again after the stop, and the restarted
// sidecar then runs on, and the Job never ends:
//   - under restartPolicy OnFailure, when its exit is not 0: its own, or
//     the runtime's loss of it (containerd, restarted as istio-proxy
//     exited, reported 255, "Unknown": seen in the soak, seed 20261210,
//     Job 126);
//   - under any policy, when its start failed (StartError), as it starts
//     any container whose start failed (seed 20261217, Job 64: the
//     kubelet, restarted while it started istio-proxy, recorded "context
//     canceled" and started istio-proxy again under Never, after the
//     stop).
//
// So the supervisor looks at the pod (the kernel's last PID every
// ScanInterval, a scan when it has moved) and stops such a sidecar as the
// run did, maxStopRounds times at most:
//
//   - native (SUPERVISOR_SHAPE=native): under any policy, until the
//     kubelet's SIGTERM (ctx), which it waits for anyway, whatever it has
//     seen;
//   - a container: under OnFailure, only where a sidecar's exit after the
//     stop was not 0 (res.Restarting, as read or as its signal gives), for
//     as long as the kubelet's restart takes (its back-off, counted from
//     the sidecar's first restart, plus RestartMargin); it ends once every
//     sidecar stopped again has exited 0. A lost exit, or a failed start,
//     leaves no trace here: a container supervisor has exited when the
//     kubelet starts the sidecar again (the native shape covers both).
//
// With no stop done (the pod deleted, no app seen), a native supervisor
// only waits, a container one returns.
func (s *Supervisor) Guard(ctx context.Context, res Result) {
	native := s.cfg.Shape == ShapeNative
	if res.Deleted || len(res.Apps) == 0 || !native && (s.cfg.RestartPolicy != OnFailure || len(res.Restarting) == 0) {
		if native {
			<-ctx.Done()
		}
		return
	}
	r := &run{Supervisor: s, kinds: map[string]procscan.Kind{}, warned: map[int]bool{}, settled: true,
		decision: decision{outcome: res.Outcome, reason: res.Reason, action: res.Action}}
	tick := time.NewTicker(s.cfg.ScanInterval)
	defer tick.Stop()
	// A container waits for the n-th restart of the sidecars as long as
	// the kubelet takes to make it (restarts.go: backoff).
	var until <-chan time.Time
	expect := func(n int) {
		if native {
			return
		}
		wait := backoff(n) + s.cfg.RestartMargin
		until = time.After(wait)
		s.log.Info().Strs("containers", res.Restarting).Int("restart", n).Dur("wait", wait).
			Msg("waiting for the kubelet to start the sidecars again, to stop them again")
	}
	expect(1)
	last, rounds := -1, 0
	// Skipped: sidecars whose action is none (not the run's to stop), and
	// the processes the run's stop acted on (one it could not signal runs
	// on; one started again is another process).
	left := maps.Clone(res.acted)
	if left == nil {
		left = map[int]bool{}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-until:
			s.log.Warn().Strs("containers", res.Restarting).Msg("no restart of the sidecars came: done")
			return
		case <-tick.C:
		}
		if n, err := s.scan.LastPID(); err == nil {
			if n == last {
				continue
			}
			last = n
		}
		pod, err := s.scan.Scan()
		if err != nil {
			s.log.Warn().Err(err).Msg("cannot read /proc: a sidecar started again would not be seen")
			continue
		}
		found := r.trackSidecars(pod, left)
		r.awaitArgs(ctx, found)
		plan := planStop(res.Outcome, &s.cfg, found)
		again := plan.sidecars[:0] // those to stop: the others are left for good
		for _, sp := range plan.sidecars {
			if sp.kill {
				again = append(again, sp)
			} else {
				left[sp.sidecar.main.PID] = true
			}
		}
		if plan.sidecars = again; len(again) == 0 {
			closeAll(found)
			continue
		}
		rounds++
		for _, sp := range again {
			s.log.Warn().Int("pid", sp.sidecar.main.PID).Str("comm", sp.sidecar.main.Comm).Str("container", sp.sidecar.container).Int("round", rounds).
				Msg("a sidecar runs again after the stop (the kubelet restarted it: its exit was not 0, the runtime lost it, or its start had failed): stopping it again")
		}
		begun := time.Now()
		if next := r.act(ctx, plan); next == nil {
			r.watchExits(ctx, plan, begun)
		}
		nonZero := false
		for _, sp := range again {
			if code, _, _ := exitOf(sp.sidecar); code != 0 {
				nonZero = true
			}
		}
		closeAll(found)
		switch {
		case rounds == maxStopRounds:
			s.log.Error().Int("rounds", rounds).Msg("the sidecars keep coming back after the stop: no longer stopping them; the pod ends when they do")
			if native {
				<-ctx.Done()
			}
			return
		case !native && !nonZero:
			s.log.Info().Msg("the sidecars stopped again exited 0: done")
			return
		case !native:
			expect(rounds + 1)
		}
	}
}
