package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// discover looks for application containers until enough are seen, within
// AppStartTimeout. With the waits for restarts under OnFailure, the only
// polling of the run.
func (r *run) discover(ctx context.Context) (state, error) {
	deadline := time.NewTimer(r.cfg.AppStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(r.cfg.ScanInterval)
	defer tick.Stop()
	for r.apps.slots < r.apps.want {
		r.publish("looking for the apps: waiting for " + r.waitingFor())
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case <-deadline.C:
			var apps []string
			if r.scan.Named() {
				apps = r.cfg.Apps
			}
			seen := r.apps.slots
			missing := r.apps.missing(apps, func(i int) string { return fmt.Sprintf("missing-%d", i+1) },
				"never seen within "+EnvPrefix+"APP_START_TIMEOUT")
			r.log.Warn().Int("expected", r.apps.want).Int("seen", seen).Strs("missing", missing).Str("timeout", r.cfg.AppStartTimeout.String()).
				Msg("app containers missing: they finished before the supervisor started, or never started")
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

// adopt starts watching the app containers not seen before, and returns
// those it could hold; it holds the sidecars it sees. Under OnFailure a new
// container first fills the slot of an instance awaiting its restart.
func (r *run) adopt(pod procscan.Pod) []*app {
	r.collectExits()
	var held []*app
	for _, c := range pod.Containers {
		for _, p := range c.Stray {
			if !r.warned[p.PID] {
				r.warned[p.PID] = true
				r.log.Warn().Int("pid", p.PID).Str("comm", p.Comm).Str("container", c.Name).
					Msg("process has a sidecar name but is not the main process of its container: not a sidecar, never stopped")
			}
		}
		kind, before := r.kindOf(c)
		if kind == procscan.Other && !before {
			r.log.Info().Str("container", c.Name).Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("reason", c.Why).
				Msg("container neither waited for nor stopped")
		}
		if kind == procscan.Sidecar && !r.stopping {
			r.holdSidecar(c)
		}
		if kind != procscan.App || before {
			continue
		}
		r.kinds[c.ID] = procscan.App // adopted, with or without its main process
		if a := r.apps.of(c.Main); c.HasMain && a != nil {
			// A process the runtime moved into its container since it was
			// adopted is the same instance, not a new container.
			r.log.Info().Int("pid", c.Main.PID).Str("container", c.Name).Str("was", a.container).
				Msg("app seen in another cgroup: the same instance, moved by the runtime")
			a.container = c.Name
			continue
		}
		a := &app{container: c.Name, name: c.Kube.Name, main: c.Main}
		if old := r.apps.started(a, c.HasMain); old != nil {
			r.log.Info().Str("container", c.Name).Str("replaces", old.container).Int("pid", c.Main.PID).
				Msg("app restarted by the kubelet: watching the new container")
		}
		if !c.HasMain {
			r.exited(a, exitwatch.Status{Reason: "its main process had exited before the supervisor saw it"})
			continue
		}
		proc, err := r.watch.Watch(process(c.Main))
		switch {
		case errors.Is(err, exitwatch.ErrGone):
			r.exited(a, exitwatch.Status{Reason: "it exited before the supervisor could watch it"})
		case err != nil:
			r.log.Error().Err(err).Int("pid", c.Main.PID).Str("container", c.Name).Msg("cannot watch app; its status is unknown")
			r.exited(a, exitwatch.Status{Reason: err.Error()})
		default:
			a.proc = proc
			held = append(held, a)
			r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).
				Int("uid", c.Main.UID).Str("method", string(r.watch.Method())).Msg("app found")
		}
	}
	return held
}

// kindOf is what the run takes container c for, and whether it had taken
// it for something before this scan. A container keeps, for the whole
// run, the kind it had when first seen with its main process (or App, once
// adopted without one): once its main process has exited, a process
// exec'd into it (kubectl exec: PPID 0) may look like its main one, and an
// ignored or an app container must never turn into a sidecar to stop, nor
// an ignored one into an app. A container not yet set up (Starting) is
// not pinned: a later scan tells.
func (r *run) kindOf(c procscan.Container) (kind procscan.Kind, before bool) {
	if k, ok := r.kinds[c.ID]; ok {
		return k, true
	}
	if c.HasMain && c.Kind != procscan.Starting {
		r.kinds[c.ID] = c.Kind
	}
	return c.Kind, false
}

// holdSidecar keeps a pidfd on a sidecar's main process from the moment it
// is seen, so the stop can go straight to it.
func (r *run) holdSidecar(c procscan.Container) {
	for _, s := range r.held {
		if s.main.PID == c.Main.PID {
			return
		}
	}
	proc, err := r.watch.Hold(process(c.Main))
	if err != nil {
		return // gone, or not holdable: the stop's scan will tell
	}
	r.held = append(r.held, r.newSidecar(c, proc))
	r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).Msg("sidecar found")
}
