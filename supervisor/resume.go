package supervisor

import (
	"errors"
	"strconv"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// resumed is what the run took over from the journal of a supervisor
// before it (journal.go): set once, by resume.
type resumed struct {
	// sidecars: the journal saw sidecars; so they have started, and the
	// stop waits for none to appear: one not running then has exited.
	sidecars bool
}

// podUID is the pod's UID where the scanner knows it (the kubelet's
// names), else "".
func (r *run) podUID() string {
	if u, ok := r.scan.(interface{ PodUID() string }); ok {
		return u.PodUID()
	}
	return ""
}

// resume opens the journal in SUPERVISOR_STATE_DIR, if set, after pod (the
// first scan) has shown that the pod shares its process namespace: it
// takes over what a journal of this run holds, where /proc agrees, and
// starts the journal again with it. A journal it cannot keep is logged and
// left off: the run goes on as a first one.
func (r *run) resume(pod procscan.Pod) {
	dir := r.cfg.StateDir
	if dir == "" {
		return
	}
	if err := ready(dir, false); err != nil {
		r.log.Warn().Err(err).Str("dir", dir).Msg("cannot remove the ready file")
	}
	head := journalHead(r.podUID(), r.cfg)
	entries, ignored := readJournal(dir, head)
	if ignored == "" && len(entries) > 0 {
		ignored = r.contradicted(entries, pod)
	}
	if ignored != "" {
		r.log.Warn().Str("dir", dir).Str("reason", ignored).
			Msg("the journal of an earlier supervisor is ignored: starting over")
		entries = nil
	}
	j, err := createJournal(dir, head, entries)
	if err != nil {
		r.log.Warn().Err(err).Str("dir", dir).Msg("cannot keep a journal: a restarted supervisor would start over")
		return
	}
	r.journal = j
	if entries != nil {
		// Said even when the supervisor before saw nothing: a restart
		// shows as one in the log.
		r.replay(entries, pod)
	}
}

// contradicted says why the journal's facts cannot be taken, or "": an app
// instance it says ended whose main process runs now, or a sidecar it says
// exited that runs now. (A process exists only once: a PID and its start
// time name it for good.) One that has begun to exit, or is a zombie its
// runtime has not reaped yet, runs no more: a standby leads within
// milliseconds of the leader's death, and finds so the app whose end the
// leader had just read (the soak, seed 20261206 with -standby, Job 14).
func (r *run) contradicted(entries []entry, pod procscan.Pod) string {
	alive := map[instance]bool{}
	for _, c := range pod.Containers {
		if c.HasMain && !c.Main.Exiting {
			alive[instanceOf(c.Main)] = true
		}
	}
	for _, e := range entries {
		if (e.Kind == "end" || e.Kind == "gone") && alive[e.ID.instance()] {
			return "it says process " + strconv.Itoa(e.ID.PID) + " ended, and it runs"
		}
	}
	return ""
}

// replay takes the journal's facts into the run: the ledger, as when they
// happened (with their times), the containers adopted, the app instances
// still running watched again, and those that ended while no supervisor
// watched them taken as ended: with the status the kernel's accounting
// recorded, where it was on when the instance ended (an end the killed
// supervisor had not read, or one while no supervisor ran, where
// accounting went through istio-proxy's mount: exitwatch's anchor_linux.go),
// else unknown (no one in the pod can read it now).
func (r *run) replay(entries []entry, pod procscan.Pod) {
	mains := map[instance]procscan.Container{}
	for _, c := range pod.Containers {
		if c.HasMain {
			mains[instanceOf(c.Main)] = c
		}
	}
	sidecars, gone := map[instance]bool{}, map[instance]bool{}
	apps, ended := 0, 0
	for _, e := range entries {
		switch e.Kind {
		case "app":
			r.apps.started(e.ID.instance(), e.Container, e.Name)
			apps++
		case "seen":
			r.apps.startedExited(e.PID, e.Container, e.Name, e.Status.status(), time.Unix(0, e.At))
			apps++
			ended++
		case "moved":
			r.apps.rename(e.ID.instance(), e.Container)
		case "end":
			if r.apps.running(e.ID.instance()) {
				r.apps.exited(e.ID.instance(), e.Status.status(), time.Unix(0, e.At))
				ended++
			}
		case "sidecar":
			sidecars[e.ID.instance()] = true
		case "gone":
			sidecars[e.ID.instance()] = true
			gone[e.ID.instance()] = true
		}
	}
	// Every container the journal knows keeps its kind: a restart is
	// adopted as such, nothing is adopted twice.
	for _, c := range pod.Containers {
		if c.HasMain && r.apps.running(instanceOf(c.Main)) {
			r.kinds[pinKey(c)] = procscan.App
		}
	}
	lost, recorded := 0, 0
	for _, id := range r.apps.runningInstances() {
		c, ok := mains[id]
		if !ok {
			s, at, found := r.recorded(id)
			if found {
				recorded++
			} else {
				s, at = exitwatch.Status{Reason: "it ended while no supervisor watched it (the supervisor was restarted)"}, time.Now()
				lost++
			}
			r.exitedAt(id, nil, s, at)
			continue
		}
		if c.Init {
			// Still its runtime's init, as /proc shows now (not as the
			// journal said: an exec happens once, and may have happened
			// while no supervisor watched): a kill before its exec is a
			// failed start here too (ledger.end).
			r.adoptedInit(id)
		}
		proc, err := r.watch.Watch(process(c.Main))
		switch {
		case errors.Is(err, exitwatch.ErrGone):
			r.exited(id, nil, exitwatch.Status{Reason: "it exited before the restarted supervisor could watch it"})
			lost++
		case err != nil:
			r.log.Error().Err(err).Int("pid", c.Main.PID).Str("container", c.Name).Msg("cannot watch app; its status is unknown")
			r.exited(id, nil, exitwatch.Status{Reason: err.Error()})
		default:
			r.watched = append(r.watched, watchedApp{main: c.Main, proc: proc})
		}
	}
	// A sidecar the journal saw that runs no more has exited, journaled
	// or not (the supervisor before may have died before seeing it).
	left := 0
	for id := range sidecars {
		if _, runs := mains[id]; runs && !gone[id] {
			left++
		}
	}
	r.resumed.sidecars = len(sidecars) > 0
	r.log.Info().Str("dir", r.cfg.StateDir).Int("apps", apps).Int("ended", ended).Int("ended_unwatched", lost).Int("ended_recorded", recorded).
		Int("watched", len(r.watched)).Int("sidecars", len(sidecars)).Int("sidecars_running", left).
		Msg("carrying on from the journal of the supervisor before")
}

// recorded is the status of app instance id, which no supervisor read,
// and when it ended, from the kernel's accounting record of its exit,
// where one was written. The end, not this supervisor's start, is what a
// wait for its restart counts from (OnFailure): the dead time between
// them is the kubelet's restart of the supervisor, seconds on a loaded
// node.
func (r *run) recorded(id instance) (exitwatch.Status, time.Time, bool) {
	rec, ok := r.watch.(interface {
		Recorded(exitwatch.Process) (exitwatch.Status, time.Time, bool)
	})
	if !ok {
		return exitwatch.Status{}, time.Time{}, false
	}
	return rec.Recorded(exitwatch.Process{PID: id.pid, StartTime: id.start})
}

// journalApp, journalEnd ... record the run's facts (journal.go).
func (r *run) journalApp(id instance, c procscan.Container) {
	r.journal.add(entry{Kind: "app", ID: toEntryInstance(id), Container: c.Name, Name: c.Kube.Name})
	r.journalFailed()
}

func (r *run) journalSeen(pid int, c procscan.Container, s exitwatch.Status, at time.Time) {
	r.journal.add(entry{Kind: "seen", PID: pid, Container: c.Name, Name: c.Kube.Name, Status: toEntryStatus(s), At: at.UnixNano()})
	r.journalFailed()
}

func (r *run) journalMoved(id instance, container string) {
	r.journal.add(entry{Kind: "moved", ID: toEntryInstance(id), Container: container})
	r.journalFailed()
}

func (r *run) journalEnd(id instance, s exitwatch.Status, at time.Time) {
	r.journal.add(entry{Kind: "end", ID: toEntryInstance(id), Status: toEntryStatus(s), At: at.UnixNano()})
	r.journalFailed()
}

func (r *run) journalSidecar(main procscan.Process, container string) {
	r.journal.add(entry{Kind: "sidecar", ID: toEntryInstance(instanceOf(main)), Container: container})
	r.journalFailed()
}

func (r *run) journalGone(main procscan.Process, container string) {
	r.journal.add(entry{Kind: "gone", ID: toEntryInstance(instanceOf(main)), Container: container})
	r.journalFailed()
}

// journalFailed logs, once, that the journal could not be written.
func (r *run) journalFailed() {
	if err := r.journal.failed(); err != nil {
		r.log.Warn().Err(err).Str("dir", r.cfg.StateDir).Msg("the journal is off: a restarted supervisor would start over")
	}
}
