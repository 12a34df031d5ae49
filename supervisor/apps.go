package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// app is one application container instance being waited for. Under
// restartPolicy OnFailure the kubelet restarts a failed app container in
// place, as a new container (a new cgroup, a new main process): that new
// instance takes the failed one's slot.
type app struct {
	container string
	main      procscan.Process
	proc      exitwatch.Proc // nil when it was never held
	status    exitwatch.Status
	done      bool
	// superseded marks a failed instance that a restart replaced: it no
	// longer counts in the decision.
	superseded bool
	// restartBy is, for an instance that ended with an unknown status under
	// OnFailure, when to stop expecting a restart for it.
	restartBy time.Time
}

// discover looks for application containers until enough are seen, within
// AppStartTimeout. With the waits for restarts under OnFailure, the only
// polling of the run.
func (r *run) discover(ctx context.Context) (state, error) {
	want := max(r.cfg.AppContainers, 1)
	r.want = want
	deadline := time.NewTimer(r.cfg.AppStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(r.cfg.ScanInterval)
	defer tick.Stop()
	for r.slots < want {
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case <-deadline.C:
			missing := want - r.slots
			r.log.Warn().Int("expected", want).Int("seen", r.slots).Str("timeout", r.cfg.AppStartTimeout.String()).
				Msg("app containers missing: they finished before the supervisor started, or never started")
			for i := 0; i < missing; i++ {
				r.slots++
				r.apps = append(r.apps, &app{
					container: fmt.Sprintf("missing-%d", i+1), done: true,
					status: exitwatch.Status{Reason: "never seen within " + EnvPrefix + "APP_START_TIMEOUT"},
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

// adopt starts watching the app containers not seen before, and returns
// those it could hold. Under OnFailure a new container first fills the slot
// of an instance awaiting its restart.
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
		if r.kindOf(c) == procscan.Sidecar && !r.stopping {
			r.holdSidecar(c)
		}
		if r.kindOf(c) != procscan.App || r.seen[c.ID] {
			continue
		}
		r.seen[c.ID] = true
		if c.HasMain {
			// One process is one app instance, whatever its cgroup read
			// when it was adopted: a process the runtime moved into its
			// container since is the same instance, not a new container.
			if a := r.instances[procKey(c.Main)]; a != nil {
				r.log.Info().Int("pid", c.Main.PID).Str("container", c.Name).Str("was", a.container).
					Msg("app seen in another cgroup: the same instance, moved by the runtime")
				a.container = c.Name
				continue
			}
		}
		a := &app{container: c.Name, main: c.Main}
		r.apps = append(r.apps, a)
		if c.HasMain {
			r.instances[procKey(c.Main)] = a
		}
		if len(r.awaiting) > 0 {
			old := r.awaiting[0]
			r.awaiting = r.awaiting[1:]
			old.superseded = true
			r.log.Info().Str("container", c.Name).Str("replaces", old.container).Int("pid", c.Main.PID).
				Msg("app restarted by the kubelet: watching the new container")
		} else {
			r.slots++
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

// instance names one process for good: a PID with its start time.
type instance struct {
	pid   int
	start uint64
}

func procKey(p procscan.Process) instance { return instance{p.PID, p.StartTime} }

// holdSidecar keeps a pidfd on a sidecar's main process from the moment it
// is seen, so the stop can go straight to it.
func (r *run) holdSidecar(c procscan.Container) {
	for _, s := range r.held {
		if s.main.PID == c.Main.PID {
			s.handlerSeen = s.handlerSeen || newSidecar(c, nil).handlerSeen
			return
		}
	}
	proc, err := r.watch.Hold(process(c.Main))
	if err != nil {
		return // gone, or not holdable: the stop's scan will tell
	}
	r.held = append(r.held, newSidecar(c, proc))
	r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).Msg("sidecar found")
}

// kindOf is what a container was when first seen with its main process:
// a container keeps that kind for the whole run. Once its main process has
// exited, a process exec'd into it (kubectl exec: PPID 0) may look like
// its main one; an ignored or an app container must never turn into a
// sidecar to stop, nor an ignored one into an app.
func (r *run) kindOf(c procscan.Container) procscan.Kind {
	if k, ok := r.kinds[c.ID]; ok {
		return k
	}
	if c.HasMain && c.Kind != procscan.Starting {
		r.kinds[c.ID] = c.Kind
	}
	return c.Kind
}

// collectExits records the exits the kernel has already reported but the
// run has not handled yet (during discovery none is, and in the wait the
// scan may win the race against the exit). They must come before the new
// containers of a scan: a container the kubelet started after an app
// failed is that app's restart, not another app, and taking it for another
// would leave the failed one awaiting a restart that already came.
func (r *run) collectExits() {
	for _, a := range r.apps {
		if a.done || a.proc == nil {
			continue
		}
		select {
		case <-a.proc.Done():
			r.exited(a, a.proc.Status())
		default:
		}
	}
}

// exited records an app instance's end. Under OnFailure a failed instance
// will be restarted by the kubelet, and one with an unknown status may be:
// both wait for a restart.
func (r *run) exited(a *app, s exitwatch.Status) {
	a.done, a.status = true, s
	ev := r.log.Info()
	if !s.Known {
		ev = r.log.Warn()
	}
	ev = ev.Str("container", a.container)
	if a.proc != nil {
		ev = ev.Int("pid", a.main.PID).Str("comm", a.main.Comm).Str("method", string(r.watch.Method()))
	}
	logStatus(ev, s).Msg("app exited")
	if r.cfg.RestartPolicy != OnFailure {
		return
	}
	switch {
	case s.Failure():
		r.awaiting = append(r.awaiting, a)
		r.log.Info().Str("container", a.container).
			Msg("app failed under restartPolicy OnFailure: the kubelet restarts it, the sidecar stays up")
	case !s.Known:
		a.restartBy = time.Now().Add(r.cfg.RestartTimeout)
		r.awaiting = append(r.awaiting, a)
		r.log.Warn().Str("container", a.container).Str("timeout", r.cfg.RestartTimeout.String()).
			Msg("app status unknown under restartPolicy OnFailure: waiting for a restart before taking it as finished")
	}
}

func logStatus(ev *zerolog.Event, s exitwatch.Status) *zerolog.Event {
	switch {
	case !s.Known:
		return ev.Str("status", "unknown").Str("reason", s.Reason)
	case s.Signal != 0:
		return ev.Stringer("signal", s.Signal).Int("exit_code", s.ContainerCode())
	}
	return ev.Int("exit_code", s.Code)
}

// wait blocks until the apps are done as the restart policy means it:
// under Never, every app container has exited once; under OnFailure, every
// app container has exited 0, its failed attempts having been restarted.
// It blocks on the apps' exits without polling, except while a restart is
// awaited (the new container has to be found in /proc).
func (r *run) wait(ctx context.Context) (state, error) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	exits := make(chan *app)
	watch := func(a *app) {
		go func() {
			select {
			case <-a.proc.Done():
				select {
				case exits <- a:
				case <-waitCtx.Done():
				}
			case <-waitCtx.Done():
			}
		}()
	}
	for _, a := range r.apps {
		if !a.done {
			watch(a)
		}
	}
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		running, expiry := r.pending(time.Now())
		// Under OnFailure a container that appeared while another awaited
		// its restart took that one's slot; if it was in fact a first start,
		// the slots fall short and the real restart is still to come.
		short := r.cfg.RestartPolicy == OnFailure && r.slots < r.want
		if running == 0 && len(r.awaiting) == 0 && !short {
			return r.decide, nil
		}
		// Scan only while a restart is awaited.
		var tickC <-chan time.Time
		if len(r.awaiting) > 0 || short {
			if tick == nil {
				tick = time.NewTicker(r.cfg.ScanInterval)
			}
			tickC = tick.C
		} else if tick != nil {
			tick.Stop()
			tick = nil
		}
		var expire *time.Timer
		var expireC <-chan time.Time
		if !expiry.IsZero() {
			expire = time.NewTimer(time.Until(expiry))
			expireC = expire.C
		}
		var err error
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case a := <-exits:
			if !a.done { // else collectExits had it first
				r.exited(a, a.proc.Status())
			}
		case <-tickC:
			var pod procscan.Pod
			if pod, err = r.scan.Scan(); err == nil {
				for _, a := range r.adopt(pod) {
					watch(a)
				}
			}
		case <-expireC:
		}
		if expire != nil {
			expire.Stop()
		}
		if err != nil {
			return nil, fmt.Errorf("read /proc: %w", err)
		}
	}
}

// pending counts the running instances, drops the unknown-status instances
// whose restart window has passed, and returns the next such window's end.
func (r *run) pending(now time.Time) (running int, next time.Time) {
	for _, a := range r.apps {
		if !a.done {
			running++
		}
	}
	kept := r.awaiting[:0]
	for _, a := range r.awaiting {
		if !a.status.Known && !now.Before(a.restartBy) {
			r.log.Warn().Str("container", a.container).Msg("no restart came: taking the app as finished, status unknown")
			continue
		}
		kept = append(kept, a)
		if !a.status.Known && (next.IsZero() || a.restartBy.Before(next)) {
			next = a.restartBy
		}
	}
	r.awaiting = kept
	return running, next
}

// idle waits for the pod's deletion: under restartPolicy Always (or with a
// native sidecar) the sidecar is never the supervisor's to stop.
func (r *run) idle(ctx context.Context) (state, error) {
	<-ctx.Done()
	return r.deleted, nil
}
