package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// discover looks for application containers until enough are seen. The
// look is bounded by AppStartTimeout from the supervisor's start; with
// AfterApps, from the first sighting of one of those containers, which the
// kubelet starts only once it has started (or failed to start) every app,
// and at the latest AfterAppsTimeout from the start. Where the ready file
// could not be written, the kubelet's hooks on it (the native startup
// probe, the wait hook) hold the apps back up to WaitLimit from the start:
// the look from the start is that much longer, so that an app so held is
// not counted missing as it starts. With the waits for restarts under
// OnFailure, the only polling of the run.
func (r *run) discover(ctx context.Context) (state, error) {
	bound, clock := r.cfg.AppStartTimeout, "APP_START_TIMEOUT"
	if r.readyFailed {
		bound, clock = bound+WaitLimit, "APP_START_TIMEOUT, plus the "+WaitLimit.String()+" the kubelet's hooks wait for the ready file"
	}
	after := len(r.cfg.AfterApps) > 0
	if after && !r.scan.Named() {
		after = false
		r.log.Warn().Strs("after_apps", r.cfg.AfterApps).
			Msg(EnvPrefix + "AFTER_APPS ignored: the kubelet's container names cannot be read here; " + EnvPrefix + "APP_START_TIMEOUT counts from the supervisor's start")
	}
	if after {
		bound, clock = r.cfg.AfterAppsTimeout, "AFTER_APPS_TIMEOUT"
	}
	began := time.Now()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	lk := r.newLook()
	defer lk.stop()
	onAfter := func(c procscan.Container, now time.Time) {
		if after && c.Kube.Known() && slices.Contains(r.cfg.AfterApps, c.Kube.Name) {
			after = false
			left := bound - now.Sub(began)
			bound, clock = now.Sub(began)+min(left, r.cfg.AppStartTimeout), "APP_START_TIMEOUT"
			deadline.Reset(min(left, r.cfg.AppStartTimeout))
			r.log.Info().Str("container", c.Name).Str("timeout", r.cfg.AppStartTimeout.String()).
				Msg("a container started after the apps is seen: each app has been started or has failed to start; the missing ones are looked for until APP_START_TIMEOUT")
		}
	}
	for r.apps.short() > 0 {
		r.publish("looking for the apps: waiting for " + r.waitingFor())
		select {
		case <-ctx.Done():
			return r.deleted, nil
		case <-deadline.C:
			var apps []string
			if r.scan.Named() {
				apps = r.cfg.Apps
			}
			seen, want := r.apps.slotCount()
			why := "never seen within " + EnvPrefix + clock
			if after {
				why += " (none of " + EnvPrefix + "AFTER_APPS was seen either)"
			}
			missing := r.apps.missing(apps, func(i int) string { return fmt.Sprintf("missing-%d", i+1) }, why)
			r.log.Warn().Int("expected", want).Int("seen", seen).Strs("missing", missing).Str("timeout", bound.Round(time.Millisecond).String()).
				Msg("app containers missing: they finished before the supervisor started, or never started")
			return r.wait, nil
		case now := <-lk.tick.C:
			if _, err := lk.scan(now, onAfter); err != nil {
				return nil, err
			}
		case now := <-lk.fast:
			if !lk.moved(now) {
				continue
			}
			if _, err := lk.scan(now, onAfter); err != nil {
				return nil, err
			}
		}
	}
	return r.wait, nil
}

// adopt starts watching the app containers not seen before (watched),
// and returns those it could watch; it keeps a pidfd on each sidecar it
// sees (found). Under OnFailure a new container first fills the slot of an
// instance awaiting its restart.
func (r *run) adopt(pod procscan.Pod) []watchedApp {
	// What the scan saw comes before the exits since: an instance adopted
	// from its runtime's init that the scan saw running its program, and
	// that has exited since, ended a run, not a start (ledger.end).
	for _, c := range pod.Containers {
		if c.HasMain && !c.Init && c.Kind != procscan.Starting {
			r.apps.execd(instanceOf(c.Main))
		}
	}
	r.collectExits()
	var watched []watchedApp
	for _, c := range pod.Containers {
		for _, p := range c.Stray {
			if !r.warned[p.PID] {
				r.warned[p.PID] = true
				r.log.Warn().Int("pid", p.PID).Str("comm", p.Comm).Str("container", c.Name).
					Msg("process has a sidecar name but is not the main process of its container: not a sidecar, never stopped")
			}
		}
		kind, before := r.kindOf(c)
		// Said once: when the kind is pinned (a container seen being set up,
		// or with its main process gone, is not pinned, and would be said
		// again).
		if pinned, ok := r.kinds[pinKey(c)]; kind == procscan.Other && !before && ok && pinned == procscan.Other {
			r.log.Info().Str("container", c.Name).Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("reason", c.Why).
				Msg("container neither waited for nor stopped")
		}
		if kind == procscan.Sidecar {
			r.trackSidecar(c)
		}
		if kind != procscan.App || before || r.execdBefore(c) {
			continue
		}
		r.kinds[pinKey(c)] = procscan.App // adopted, with or without its main process
		if !c.HasMain {
			s := exitwatch.Status{Reason: "its main process had exited before the supervisor saw it"}
			now := time.Now()
			old, replaces, end := r.apps.startedExited(c.Main.PID, c.Name, c.Kube.Name, s, now)
			r.journalSeen(c.Main.PID, c, s, now)
			if replaces {
				r.logRestart(c, old)
			}
			r.logEnd(end, nil, s)
			continue
		}
		id := instanceOf(c.Main)
		if was, ok := r.apps.rename(id, c.Name); ok {
			r.journalMoved(id, c.Name)
			// A process the runtime moved into its container since it was
			// adopted is the same instance, not a new container.
			r.log.Info().Int("pid", c.Main.PID).Str("container", c.Name).Str("was", was).
				Msg("app seen in another cgroup: the same instance, moved by the runtime")
			continue
		}
		old, replaces := r.apps.started(id, c.Name, c.Kube.Name)
		if c.Init {
			r.adoptedInit(id)
		}
		r.journalApp(id, c)
		if replaces {
			r.logRestart(c, old)
		}
		if pid, ok := r.apps.abandonedBy(id); ok {
			r.log.Warn().Str("container", c.Name).Int("pid", pid).Int("replaced_by", c.Main.PID).
				Msg("app instance replaced while still its runtime's init, its program never run: a start given up (the kubelet created its container again), not waited for")
		}
		proc, err := r.watch.Watch(process(c.Main))
		switch {
		case errors.Is(err, exitwatch.ErrGone):
			r.exited(id, nil, exitwatch.Status{Reason: "it exited before the supervisor could watch it"})
		case err != nil:
			r.log.Error().Err(err).Int("pid", c.Main.PID).Str("container", c.Name).Msg("cannot watch app; its status is unknown")
			r.exited(id, nil, exitwatch.Status{Reason: err.Error()})
		default:
			w := watchedApp{main: c.Main, proc: proc}
			r.watched = append(r.watched, w)
			watched = append(watched, w)
			r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).
				Int("uid", c.Main.UID).Str("method", string(r.watch.Method())).Msg("app found")
		}
	}
	return watched
}

// logRestart says container c replaces old, as a restart.
func (r *run) logRestart(c procscan.Container, old string) {
	r.log.Info().Str("container", c.Name).Str("replaces", old).Int("pid", c.Main.PID).
		Msg("app restarted by the kubelet: watching the new container")
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
	if k, ok := r.kinds[pinKey(c)]; ok {
		return k, true
	}
	if c.HasMain && c.Main.Exiting {
		if k, found, _ := r.unifiedKind(c); found {
			return k, true
		}
	}
	if c.HasMain && c.Kind != procscan.Starting {
		r.kinds[pinKey(c)] = c.Kind
	}
	return c.Kind, false
}

// pinKey is what pins container c's kind (run.kinds): its cgroup content,
// unless that names no container: the content of an exiting main process
// with no unified line (a host of cgroup v1 alone) reads "/" on every
// line, the same for every exiting process. Such a container is pinned by
// its main process: pinned by its content, it would hide every container
// first seen at its end after it, an app's restart of milliseconds too.
func pinKey(c procscan.Container) string {
	if c.HasMain && c.Main.Exiting && procscan.Unified(c.ID) == "" {
		return fmt.Sprintf("%s\x00%d@%d", c.ID, c.Main.PID, c.Main.StartTime)
	}
	return c.ID
}

// unifiedKind is the kind pinned for the containers whose unified line is
// c's (found), and whether that line tells containers apart here (tells).
// kindOf asks it for a container seen only through an exiting main
// process, whose content then differs from its container's: its v1 lines
// read "/" (procscan.Process.Exiting), and its unified line may end in
// " (deleted)". Such a process in a container pinned before is no new
// container: a process exec'd into an app container (kubectl exec, PPID 0
// like a main process), still a zombie once the app's main process has
// exited, would otherwise be taken for the app's restart, and its exit
// status for the app's (the k8sjobs cluster's OnFailure case did so: the
// app's real next run was then never waited for). Its unified line still
// names its container when every container pinned with that line has one
// kind. With no unified line (a host of cgroup v1 alone) nothing names it:
// see execdBefore. The line does not tell containers apart when c has
// none, or when containers of different kinds share it (a runtime that
// does not place containers apart in the unified hierarchy).
func (r *run) unifiedKind(c procscan.Container) (kind procscan.Kind, found, tells bool) {
	u := procscan.Unified(c.ID)
	if u == "" {
		return 0, false, false
	}
	for id, k := range r.kinds {
		if procscan.Unified(id) != u {
			continue
		}
		if found && k != kind {
			return 0, false, false
		}
		kind, found = k, true
	}
	return kind, found, true
}

// execdBefore reports whether c, a new container seen only through an
// exiting main process that nothing names (no unified line that tells
// containers apart: a host of cgroup v1 alone; no Kubernetes name: its
// mounts are gone), is a process exec'd into a container before the end
// of the failed app instance it would replace, rather than that instance's
// restart. It is said once per process. The kubelet starts a restart only
// once the runtime has reported the failed container's exit, so a
// restart's main process starts after that exit, and a process exec'd into
// that container started before it (the runtime refuses an exec into a
// stopped container). A process that started before the supervisor saw
// the exit, by more than its start time's tick, is taken for the latter.
// It can be a restart only if the supervisor saw the exit later than the
// kubelet took to notice it and create a container (its relist, the
// runtime's create: hundreds of milliseconds): that restart is then
// missed, and awaited until RESTART_TIMEOUT, its status unknown; late,
// never a wrong status.
func (r *run) execdBefore(c procscan.Container) bool {
	if !c.HasMain || !c.Main.Exiting || c.Kube.Known() {
		return false
	}
	if _, _, tells := r.unifiedKind(c); tells {
		return false
	}
	old := r.apps.nextAwaiting()
	if old == nil || old.exitAt.IsZero() {
		return false
	}
	age, err := r.scan.Age(c.Main)
	if err != nil {
		return false
	}
	if started := time.Now().Add(-age); !started.Add(procscan.Tick).Before(old.exitAt) {
		return false
	}
	if id := instanceOf(c.Main); !r.execd[id] {
		r.execd[id] = true
		r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("awaiting", old.container).
			Msg("exiting process with no container named is no restart: it started before the failed app's exit (a process exec'd into a container)")
	}
	return true
}

// trackSidecar keeps a pidfd on a sidecar's main process from the moment
// it is seen, so the stop can go straight to it.
func (r *run) trackSidecar(c procscan.Container) {
	for _, s := range r.found {
		if s.main.PID == c.Main.PID {
			return
		}
	}
	proc, err := r.watch.Track(process(c.Main))
	if err != nil {
		return // gone, or not trackable: the stop's scan will tell
	}
	r.found = append(r.found, newSidecar(c, proc, r.scan))
	r.journalSidecar(c.Main, c.Name)
	r.log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).Msg("sidecar found")
	r.anchor(c)
}

// anchorer is exitwatch.Watcher's anchoring of accounting.
type anchorer interface {
	Anchor(exitwatch.Process) (bool, error)
	CanAnchor() bool
}

// anchor keeps the kernel's process accounting on through the sidecar's
// mount of the state directory, which outlives this supervisor's own
// (exitwatch's anchor_linux.go): an app that ends while no supervisor runs
// (one killed, being restarted) is then recorded, and the next supervisor
// reads its status.
func (r *run) anchor(c procscan.Container) {
	a, ok := r.watch.(anchorer)
	if !ok {
		return
	}
	r.offered = true
	switch done, err := a.Anchor(process(c.Main)); {
	case err != nil:
		r.log.Info().Str("container", c.Name).Str("why", err.Error()).
			Msg("accounting ends with this supervisor's container: an app that ends while none runs will have no recorded status")
	case done:
		r.log.Info().Int("pid", c.Main.PID).Str("container", c.Name).
			Msg("accounting goes through the sidecar's mount of the state directory: it records the apps' ends even while no supervisor runs")
	}
}

// takeFound hands the sidecars found so far over to the stop, which owns
// them from then on; discovery is over by then.
func (r *run) takeFound() []*sidecar {
	found := r.found
	r.found = nil
	return found
}
