package supervisor

import (
	"context"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Guard is a native supervisor's wait, once its run is done, for the
// kubelet's SIGTERM (ctx). Under restartPolicy OnFailure the kubelet
// starts a regular container again when its exit is not 0: a sidecar that
// exits non-zero when stopped, or whose exit the runtime lost
// (containerd, restarted as istio-proxy exited, reported it as 255,
// "Unknown": seen in the soak, seed 20261210, Job 126). The kubelet stops
// a native sidecar only once every regular container has ended, which the
// restarted sidecar never does: the Job would hang. So while it waits the
// supervisor looks at the pod (the kernel's last PID every ScanInterval, a
// scan when it has moved) and stops such a sidecar as the run did (res:
// its outcome), at most maxStopRounds times. Under another policy, or
// with no stop done, it only waits.
//
// A supervisor that is a regular container has exited by then: the
// kubelet's restart of a sidecar after it is not seen (docs/troubleshooting.md).
func (s *Supervisor) Guard(ctx context.Context, res Result) {
	if s.cfg.RestartPolicy != OnFailure || res.Deleted || len(res.Apps) == 0 {
		<-ctx.Done()
		return
	}
	r := &run{Supervisor: s, kinds: map[string]procscan.Kind{}, warned: map[int]bool{},
		decision: decision{outcome: res.Outcome, reason: res.Reason, action: res.Action}}
	tick := time.NewTicker(s.cfg.ScanInterval)
	defer tick.Stop()
	last, rounds := -1, 0
	left := map[int]bool{} // sidecars whose action is none: not the run's to stop
	for {
		select {
		case <-ctx.Done():
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
		var again []*sidecar
		for _, sp := range planStop(res.Outcome, &s.cfg, found).sidecars {
			if sp.kill {
				again = append(again, sp.sidecar)
			} else {
				left[sp.sidecar.main.PID] = true
			}
		}
		if len(again) > 0 {
			rounds++
			for _, sc := range again {
				s.log.Warn().Int("pid", sc.main.PID).Str("comm", sc.main.Comm).Str("container", sc.container).Int("round", rounds).
					Msg("a sidecar runs again after the stop (the kubelet restarted it: its exit was not 0, or the runtime lost it): stopping it again")
			}
			plan := planStop(res.Outcome, &s.cfg, again)
			begun := time.Now()
			if next := r.act(ctx, plan); next == nil {
				r.watchExits(ctx, plan, begun)
			}
		}
		closeAll(found)
		if rounds == maxStopRounds {
			s.log.Error().Int("rounds", rounds).Msg("the sidecars keep coming back after the stop: no longer stopping them; the pod ends when they do")
			<-ctx.Done()
			return
		}
	}
}
