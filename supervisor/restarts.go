package supervisor

import (
	"fmt"
	"slices"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// app is the ledger's record of one application container instance.
// Under restartPolicy OnFailure the kubelet restarts a failed app
// container in place, as a new container (a new cgroup, a new main
// process): that new instance takes the failed one's slot. Records never
// leave the ledger: the loop names an instance by its main process
// (instance), and asks.
type app struct {
	container string
	// name is its Kubernetes name, where known: a restart comes back under
	// the same name.
	name string
	// pid is its main process's PID, for the progress: for an instance
	// first seen once its main process had exited, the process left in its
	// container; 0 for one never seen.
	pid    int
	status exitwatch.Status
	done   bool
	// superseded marks a failed instance that a restart replaced: it no
	// longer counts in the decision.
	superseded bool
	// restartBy is, for an instance that ended with an unknown status under
	// OnFailure, when to stop expecting a restart for it.
	restartBy time.Time
	// exitAt is when its end was seen.
	exitAt time.Time
	// restarts counts the instances of its slot before it: its restart,
	// if it fails, is the kubelet's restarts+1-th of the container.
	restarts int
	// init: adopted as its runtime's init (procscan.Container.Init), its
	// program not yet seen running (execd).
	init bool
	// initEnd says how it ended as its runtime's init (startFailure), if
	// it did.
	initEnd string
	// replaced is the instance this one replaced, if any.
	replaced *app
}

// The kubelet's restart back-off for a container that failed (its
// CrashLoopBackOff, pkg/kubelet/kuberuntime: initial 10 s, doubled at
// each restart, at most 5 minutes): the first restart comes at once, the
// n-th after 10 s * 2^(n-2). Newer kubelets can only shorten it
// (KubeletCrashLoopBackOffMax), and it starts over after 10 minutes of
// running (then a restart comes sooner than this says: still in time).
const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
)

// backoff is how long after the n-th failure of a container (n from 1)
// the kubelet restarts it.
func backoff(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	d := backoffInitial
	for i := 2; i < n && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

// instance names one process for good: a PID with its start time. An app
// instance is named by its main process's.
type instance struct {
	pid   int
	start uint64
}

// instanceOf names p for good.
func instanceOf(p procscan.Process) instance { return instance{p.PID, p.StartTime} }

// ledger keeps the app instances: which run, which await the kubelet's
// restart (restartPolicy OnFailure), which count in the decision. It does
// no I/O and reads no clock (times are given), so it is tested by tables;
// the run loop logs what its answers mean. Its state is its own: the loop
// names an instance by its main process (instance), changes it through
// started, rename and exited, and asks the rest; it keeps the apps'
// pidfds itself (run.watched).
//
// A slot is an app container of the pod: want of them are expected. Under
// OnFailure a failed instance awaits its restart, and its restart takes its
// slot: the failed one no longer counts. Where the kubelet's names are
// known, the restart is the next instance of the same name; elsewhere it
// can only be the next new instance, which takes the oldest awaiting slot.
// An instance whose status is unknown may have failed: it awaits a restart
// too, for as long as the kubelet's back-off for that restart, plus
// restartMargin for the kubelet to notice the exit and start the new
// instance, and never longer than restartTimeout after its end.
type ledger struct {
	policy         RestartPolicy
	restartTimeout time.Duration
	restartMargin  time.Duration
	want           int
	slots          int
	apps           []*app // every instance, in the order they started
	awaiting       []*app // oldest first
	byMain         map[instance]*app
	byName         map[string]*app // the last instance of each name
}

// newLedger expects want app containers.
func newLedger(policy RestartPolicy, want int, restartTimeout, restartMargin time.Duration) *ledger {
	return &ledger{policy: policy, want: want, restartTimeout: restartTimeout, restartMargin: restartMargin,
		byMain: map[instance]*app{}, byName: map[string]*app{}}
}

// started records a new instance, whose main process is id, in container
// (name: its Kubernetes name, or ""). It returns the container of the
// instance it replaces, if any (ok): the last of its name, or without
// names the oldest awaiting a restart.
func (l *ledger) started(id instance, container, name string) (replaces string, ok bool) {
	a := &app{container: container, name: name, pid: id.pid}
	l.byMain[id] = a
	a.replaced = l.add(a)
	return containerOf(a.replaced)
}

// startedExited records a new instance first seen once its main process
// had exited (pid: the process left in its container), and its end, s, at
// now: started and exited at once.
func (l *ledger) startedExited(pid int, container, name string, s exitwatch.Status, now time.Time) (replaces string, ok bool, e ending) {
	a := &app{container: container, name: name, pid: pid}
	replaces, ok = containerOf(l.add(a))
	return replaces, ok, l.end(a, s, now)
}

func containerOf(a *app) (string, bool) {
	if a == nil {
		return "", false
	}
	return a.container, true
}

// rename moves the instance id to container, if it is one: one process is
// never two instances, whatever its cgroup read when it was first seen
// (the runtime moves a new container's main process into its cgroup).
func (l *ledger) rename(id instance, container string) (was string, ok bool) {
	a := l.byMain[id]
	if a == nil {
		return "", false
	}
	was, a.container = a.container, container
	return was, true
}

// add records a, and returns the instance it replaces, or nil when it
// fills a slot of its own.
func (l *ledger) add(a *app) (replaces *app) {
	l.apps = append(l.apps, a)
	if a.name != "" {
		replaces = l.byName[a.name]
		l.byName[a.name] = a
		if replaces == nil {
			// Its first instance, unless one was seen at its exit, its
			// name already gone (procscan.Pod.Name): then this is its
			// restart, as without names.
			if i := slices.IndexFunc(l.awaiting, func(b *app) bool { return b.name == "" }); i >= 0 {
				replaces = l.awaiting[i]
				l.awaiting = slices.Delete(l.awaiting, i, i+1)
				replaces.superseded = true
				a.restarts = replaces.restarts + 1
				return replaces
			}
			l.slots++
			return nil
		}
		replaces.superseded = true
		a.restarts = replaces.restarts + 1
		l.awaiting = slices.DeleteFunc(l.awaiting, func(b *app) bool { return b == replaces })
		return replaces
	}
	if len(l.awaiting) > 0 {
		replaces = l.awaiting[0]
		l.awaiting = l.awaiting[1:]
		replaces.superseded = true
		a.restarts = replaces.restarts + 1
		return replaces
	}
	l.slots++
	return nil
}

// nextAwaiting is the instance a new one with no name would replace (add):
// the oldest awaiting its restart, or nil.
func (l *ledger) nextAwaiting() *app {
	if len(l.awaiting) == 0 {
		return nil
	}
	return l.awaiting[0]
}

// missing fills the slots never seen with instances of unknown status:
// one per name in apps never seen, then as many as are still short,
// named by names. It returns the names of those it added.
func (l *ledger) missing(apps []string, names func(i int) string, reason string) []string {
	var out []string
	add := func(name string) {
		l.slots++
		l.apps = append(l.apps, &app{container: name, name: name, done: true, status: exitwatch.Status{Reason: reason}})
		l.byName[name] = l.apps[len(l.apps)-1]
		out = append(out, name)
	}
	for _, name := range apps {
		if l.byName[name] == nil && l.slots < l.want {
			add(name)
		}
	}
	for i := 0; l.slots < l.want; i++ {
		add(names(i))
	}
	return out
}

// ending is what an instance's end means under the restart policy.
type ending struct {
	container string
	// restart is the kubelet's restart of the container that a failure
	// brings (the first is 1).
	restart int
	// failed: it awaits its restart; unknown: it awaits the restart its
	// unknown status may bring; startFailed: it ended before its program
	// was seen running, killed (SIGKILL) or of unknown status, and awaits
	// its start again (whatever the policy, startFailure); for
	// wait.
	failed, unknown, startFailed bool
	// superseded: its container had been started again while it ran.
	superseded bool
	wait       time.Duration
}

// running reports whether id is an instance still running.
func (l *ledger) running(id instance) bool {
	a := l.byMain[id]
	return a != nil && !a.done
}

// runningInstances are the instances that have not ended, by main process.
func (l *ledger) runningInstances() []instance {
	var out []instance
	for id, a := range l.byMain {
		if !a.done {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(a, b instance) int { return a.pid - b.pid })
	return out
}

// exited records the end of the running instance id at now, with s. Under
// OnFailure a failed instance awaits its restart (failed), as does one
// whose status is unknown (unknown), for wait:
//   - unknown: the kubelet's back-off for its restart plus the margin,
//     within restartTimeout. It may have succeeded, and then no restart
//     comes: the margin is the documented guess (docs/install.md,
//     Requirements).
//   - failed: restartTimeout. Its restart is certain, but it can come and
//     go between two scans (the soak saw runs of 27, 17 and 11 ms), leave
//     nothing behind to see, and fail again: the next restart then comes
//     after a longer back-off, from an end nobody saw. Waiting for the
//     back-off plus the margin stopped istio-proxy under such a pod's next
//     run (the soak, seed 20261203, Job 131). restartTimeout is past the
//     kubelet's longest back-off; a restart seen earlier ends the wait.
//
// Past its wait, the instance is taken as finished (settle), its status
// unknown.
func (l *ledger) exited(id instance, s exitwatch.Status, now time.Time) ending {
	return l.end(l.byMain[id], s, now)
}

func (l *ledger) end(a *app, s exitwatch.Status, now time.Time) ending {
	e := ending{container: a.container, restart: a.restarts + 1}
	s, e.startFailed = startFailure(a, s)
	a.done, a.status, a.exitAt = true, s, now
	if a.superseded {
		// Its container was started again while it ran: the kubelet had
		// lost it (containerd's restart: the soak, seed 20261216, Job 130,
		// where this end, 143, awaited a restart for RESTART_TIMEOUT and
		// the newer instance's exit 0 was lost to "unknown"). The newer
		// instance's end is the container's; this one brings no restart.
		e.superseded = true
		return e
	}
	if !e.startFailed && (l.policy != OnFailure || s.Success()) {
		return e
	}
	e.wait = l.restartTimeout
	if !s.Known {
		e.wait = min(backoff(a.restarts+1)+l.restartMargin, l.restartTimeout)
	}
	a.restartBy = now.Add(e.wait)
	l.awaiting = append(l.awaiting, a)
	e.failed, e.unknown = s.Failure(), !s.Known && !e.startFailed
	return e
}

// settle stops awaiting, at now, the instances whose restart did not come
// in time, and returns their containers (a failed one's status becomes
// unknown: its restart may have run unseen), and when the next such wait
// ends.
func (l *ledger) settle(now time.Time) (expired []string, next time.Time) {
	kept := l.awaiting[:0]
	for _, a := range l.awaiting {
		if !now.Before(a.restartBy) {
			switch {
			case a.status.Known:
				a.status = exitwatch.Status{Reason: fmt.Sprintf("%s, and no restart was seen within %s: it ran between two scans, or is late",
					a.status, a.restartBy.Sub(a.exitAt))}
			case a.initEnd != "":
				a.status = exitwatch.Status{Reason: fmt.Sprintf("%s, and no new start was seen within %s: it ran between two scans, or its program had run after all",
					a.initEnd, a.restartBy.Sub(a.exitAt))}
			}
			expired = append(expired, a.container)
			continue
		}
		kept = append(kept, a)
		if next.IsZero() || a.restartBy.Before(next) {
			next = a.restartBy
		}
	}
	l.awaiting = kept
	return expired, next
}

// slotCount says how many slots are filled (by an instance seen, or
// missing), and how many are expected.
func (l *ledger) slotCount() (filled, want int) { return l.slots, l.want }

// short is how many more app containers are expected to start.
func (l *ledger) short() int { return l.want - l.slots }

// awaited is how many instances await their restart.
func (l *ledger) awaited() int { return len(l.awaiting) }

// runningCount counts the instances still running.
func (l *ledger) runningCount() int {
	n := 0
	for _, a := range l.apps {
		if !a.done && !a.abandoned() {
			n++
		}
	}
	return n
}

// seeking reports whether the pod must still be scanned for instances: a
// restart is awaited, or, under OnFailure, a slot is still empty (a
// container that appeared while another awaited its restart took that
// one's slot; if it was in fact a first start, the real restart is still
// to come).
func (l *ledger) seeking() bool {
	return len(l.awaiting) > 0 || (l.policy == OnFailure && l.slots < l.want)
}

// finished reports whether the apps are done as the restart policy means
// it: under Never every instance has exited; under OnFailure every slot's
// last instance has exited 0, or ended unknown with no restart in time.
func (l *ledger) finished() bool { return l.runningCount() == 0 && !l.seeking() }

// count is how many instances were recorded, ended or not.
func (l *ledger) count() int { return len(l.apps) }

// final is what the decision is made on: every instance a restart did not
// replace.
func (l *ledger) final() []AppStatus {
	var out []AppStatus
	for _, a := range l.apps {
		if !a.superseded {
			out = append(out, AppStatus{Container: a.container, Status: a.status})
		}
	}
	return out
}
