package supervisor

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// watchedApp is an app instance's main process, watched by its pidfd.
type watchedApp struct {
	main procscan.Process
	proc exitwatch.Proc
}

func (w watchedApp) id() instance { return instanceOf(w.main) }

// wait blocks until the apps are done as the restart policy means it:
// under Never, every app container has exited once; under OnFailure, every
// app container has exited 0, its failed attempts having been restarted.
// It blocks on the apps' exits without polling, except while a restart is
// awaited (the new container has to be found in /proc), or an app adopted
// from its runtime's init has not been seen running its program (a kill
// before the exec is a failed start, which the kubelet retries), or
// accounting can be anchored and no sidecar has been seen yet
// (seekingAnchor).
func (r *run) wait(ctx context.Context) (state, error) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	exits := make(chan watchedApp)
	watch := func(w watchedApp) {
		go func() {
			select {
			case <-w.proc.Done():
				select {
				case exits <- w:
				case <-waitCtx.Done():
				}
			case <-waitCtx.Done():
			}
		}()
	}
	for _, w := range r.watched {
		if r.apps.running(w.id()) {
			watch(w)
		}
	}
	// While a restart is awaited, the pod is looked at as discovery does
	// (look): a restart that runs for a millisecond and fails is seen, from
	// the runtime's init on, like a first start; a run missed would make
	// the next restart come a back-off step later than counted, and the
	// sidecar be stopped under it when statuses are unknown.
	var lk *look
	defer func() {
		if lk != nil {
			lk.stop()
		}
	}()
	for {
		expired, expiry := r.apps.settle(time.Now())
		for _, container := range expired {
			r.log.Warn().Str("container", container).Msg("no restart came: taking the app as finished, status unknown")
		}
		if r.apps.finished() {
			return r.decide, nil
		}
		r.publish("waiting for " + r.waitingFor())
		// Look only while a restart is awaited, or an app adopted from its
		// runtime's init has not been seen running its program (the exec
		// tells a start that failed from a run: ledger.end).
		var tickC, fastC <-chan time.Time
		restart, sidecar := r.apps.seeking() || r.apps.unexeced(), r.seekingAnchor(time.Now())
		if restart || sidecar {
			if lk == nil {
				lk = r.newLook()
			}
			tickC = lk.tick.C
			if restart {
				fastC = lk.fast
			}
		} else if lk != nil {
			lk.stop()
			lk = nil
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
		case w := <-exits:
			if r.apps.running(w.id()) { // else collectExits had it first
				r.exited(w.id(), &w.main, w.proc.Status())
			}
		case now := <-tickC:
			var adopted []watchedApp
			if adopted, err = lk.scan(now, nil); err == nil {
				for _, w := range adopted {
					watch(w)
				}
			}
		case now := <-fastC:
			if lk.moved(now) {
				var adopted []watchedApp
				if adopted, err = lk.scan(now, nil); err == nil {
					for _, w := range adopted {
						watch(w)
					}
				}
			}
		case <-expireC:
		}
		if expire != nil {
			expire.Stop()
		}
		if err != nil {
			return nil, err
		}
	}
}

// seekingAnchor reports whether the wait, at now, still looks for a
// sidecar to anchor accounting through (run.anchor). istio-proxy starts
// after the apps, unless held: on a loaded node, seconds after every app
// was found, when discovery looks no more. Found only by the stop, it
// would anchor nothing, and an app that ended while no supervisor ran
// (one killed, being restarted) would have no recorded status. So where
// the anchor can work (exitwatch's CanAnchor), the wait scans every
// SCAN_INTERVAL (no fast look: a sidecar runs for the pod's life) until a
// sidecar is offered, for APP_START_TIMEOUT at most, and says so if none
// came.
func (r *run) seekingAnchor(now time.Time) bool {
	if a, ok := r.watch.(anchorer); r.offered || !ok || !a.CanAnchor() {
		return false
	}
	if r.anchorBy.IsZero() {
		r.anchorBy = now.Add(r.cfg.AppStartTimeout)
	}
	if now.Before(r.anchorBy) {
		return true
	}
	r.offered = true // said once
	r.log.Warn().Str("timeout", r.cfg.AppStartTimeout.String()).
		Msg("no sidecar seen within " + EnvPrefix + "APP_START_TIMEOUT of the apps: accounting ends with this supervisor's container, and an app that ends while none runs will have no recorded status")
	return false
}

// collectExits records the exits the kernel has already reported but the
// run has not handled yet (during discovery none is, and in the wait the
// scan may win the race against the exit). They must come before the new
// containers of a scan: a container the kubelet started after an app
// failed is that app's restart, not another app, and taking it for another
// would leave the failed one awaiting a restart that already came.
func (r *run) collectExits() {
	for _, w := range r.watched {
		if !r.apps.running(w.id()) {
			continue
		}
		select {
		case <-w.proc.Done():
			r.exited(w.id(), &w.main, w.proc.Status())
		default:
		}
	}
}

// exited records the end of the app instance id, whose main process was
// main if it was watched (else nil), and logs it (logEnd).
func (r *run) exited(id instance, main *procscan.Process, s exitwatch.Status) {
	r.exitedAt(id, main, s, time.Now())
}

// exitedAt is exited for an end at a known time (an accounting record's).
func (r *run) exitedAt(id instance, main *procscan.Process, s exitwatch.Status, at time.Time) {
	r.logEnd(r.apps.exited(id, s, at), main, s)
	r.journalEnd(id, s, at)
}

// logEnd says an app instance ended, and what it means under OnFailure: a
// failed instance will be restarted by the kubelet, and one with an
// unknown status may be; both wait for a restart.
func (r *run) logEnd(e ending, main *procscan.Process, s exitwatch.Status) {
	ev := r.log.Info()
	if !s.Known {
		ev = r.log.Warn()
	}
	ev = ev.Str("container", e.container)
	if main != nil {
		ev = ev.Int("pid", main.PID).Str("comm", main.Comm).Str("method", string(r.watch.Method()))
	}
	logStatus(ev, s).Msg("app exited")
	switch {
	case e.superseded:
		r.log.Warn().Str("container", e.container).
			Msg("app instance ended after its container was started again (the kubelet had lost it, as when the runtime restarts): the newer instance's end is the container's")
	case e.startFailed:
		msg := "app ended before its program was seen running, its status unknown: its start may have failed, and the kubelet would start it again whatever the restart policy; the sidecar stays up until then"
		if s.Known { // killed by a signal: startFailure
			msg = "app killed before its program ran: its start failed, and the kubelet starts it again whatever the restart policy; the sidecar stays up"
		}
		r.log.Warn().Str("container", e.container).Int("restart", e.restart).
			Dur("backoff", backoff(e.restart)).Dur("wait", e.wait).Msg(msg)
	case e.failed:
		r.log.Info().Str("container", e.container).Int("restart", e.restart).
			Dur("backoff", backoff(e.restart)).Dur("wait", e.wait).
			Msg("app failed under restartPolicy OnFailure: the kubelet restarts it, the sidecar stays up")
	case e.unknown:
		// What the kubelet would do if it failed: restart it after its
		// back-off; and the time it takes to notice and start it.
		r.log.Warn().Str("container", e.container).Int("restart", e.restart).
			Dur("backoff", backoff(e.restart)).Dur("margin", r.cfg.RestartMargin).Dur("wait", e.wait).
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
