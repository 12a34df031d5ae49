package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

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
	for _, a := range r.apps.apps {
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
		expired, expiry := r.apps.settle(time.Now())
		for _, a := range expired {
			r.log.Warn().Str("container", a.container).Msg("no restart came: taking the app as finished, status unknown")
		}
		if r.apps.finished() {
			return r.decide, nil
		}
		r.publish("waiting for " + r.waitingFor())
		// Scan only while a restart is awaited.
		var tickC <-chan time.Time
		if r.apps.seeking() {
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

// collectExits records the exits the kernel has already reported but the
// run has not handled yet (during discovery none is, and in the wait the
// scan may win the race against the exit). They must come before the new
// containers of a scan: a container the kubelet started after an app
// failed is that app's restart, not another app, and taking it for another
// would leave the failed one awaiting a restart that already came.
func (r *run) collectExits() {
	for _, a := range r.apps.apps {
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

// exited records an app instance's end, and says what it means under
// OnFailure: a failed instance will be restarted by the kubelet, and one
// with an unknown status may be; both wait for a restart.
func (r *run) exited(a *app, s exitwatch.Status) {
	failed, unknown, wait := r.apps.exited(a, s, time.Now())
	ev := r.log.Info()
	if !s.Known {
		ev = r.log.Warn()
	}
	ev = ev.Str("container", a.container)
	if a.proc != nil {
		ev = ev.Int("pid", a.main.PID).Str("comm", a.main.Comm).Str("method", string(r.watch.Method()))
	}
	logStatus(ev, s).Msg("app exited")
	switch {
	case failed:
		r.log.Info().Str("container", a.container).Int("restart", a.restarts+1).
			Dur("backoff", backoff(a.restarts+1)).Dur("wait", wait).
			Msg("app failed under restartPolicy OnFailure: the kubelet restarts it, the sidecar stays up")
	case unknown:
		// What the kubelet would do if it failed: restart it after its
		// back-off; and the time it takes to notice and start it.
		r.log.Warn().Str("container", a.container).Int("restart", a.restarts+1).
			Dur("backoff", backoff(a.restarts+1)).Dur("margin", r.cfg.RestartMargin).Dur("wait", wait).
			Str("timeout", r.cfg.RestartTimeout.String()).
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
