package supervisor

import (
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// A start that failed. An app adopted as its runtime's init (runc's
// "runc:[2:INIT]", crun's, Kata's agent: procscan.Container.Init) has not
// run its program yet. Until a scan shows it running its program, the pod
// is scanned (unexeced; every fastInterval for startingHot, look), and
// a signal before that ends no run of the app: it is the runtime's
// cleanup of a start that failed (containerd or the kubelet restarted
// under it: "failed to create shim task: context canceled"), SIGKILL as
// runc deletes it, or the container's stop signal, SIGTERM, as the kubelet
// stops the created container before starting it again (the soak, seed
// 20261215, Job 63: an init left by a kubelet restart, SIGTERMed seven
// minutes later, then started again under Never). CRI leaves
// such a container created, and the kubelet starts a created container
// again whatever the restart policy (pkg/kubelet/container
// ShouldContainerBeRestarted: "Always restart container in the unknown, or
// in the created state"). So its status is unknown, and it awaits that
// start as an unknown status does under OnFailure (ledger.end). A
// restarted supervisor reads whether an instance is still its init from
// /proc, not from the journal (resume.replay): the exec may have happened
// while no supervisor watched.
//
// An end of unknown status before the exec was seen (statuses not read,
// SUPERVISOR_EXIT_STATUS=none; or gone before its pidfd was opened) may be
// either: it awaits the new start too (a slower Job, never a wrong stop).
//
// Some cases cost that wait for nothing, their status unknown rather than
// a failure or a success: a start that failed once the task existed
// ("failed to start containerd task": the container is left exited, and
// under Never not started again; seen in the soak, seed 123, Job 1), an
// app killed by a signal within one scan of its exec, and, statuses unknown,
// a program that ran and ended within one scan of its exec.

// adoptedInit marks the instance id as adopted from its runtime's init,
// before its program runs.
func (l *ledger) adoptedInit(id instance) {
	if a := l.byMain[id]; a != nil {
		a.init = true
	}
}

// execd records that the instance id, if one, runs its program: its
// runtime's init has exec'd it.
func (l *ledger) execd(id instance) {
	if a := l.byMain[id]; a != nil {
		a.init = false
	}
}

// unexeced reports whether a running instance is still its runtime's init,
// as last seen: until it runs its program, the pod is looked at, to see
// the exec (end).
func (l *ledger) unexeced() bool {
	for _, a := range l.byMain {
		if a.init && !a.done {
			return true
		}
	}
	return false
}

// startFailure is s's meaning for a. An instance still its runtime's init
// when it ended, and either killed by a signal (the runtime's cleanup, or
// the kubelet's stop of the created container) or of unknown status (none
// read, or gone before it could be watched), may be a start that failed
// (ok): its status is unknown, said so, and it awaits its new start. One
// whose exec came within a scan of its end may as well have run its
// program: that costs the wait, never a wrong stop. A pod being deleted
// stops the supervisor too, which then acts as for a deletion.
func startFailure(a *app, s exitwatch.Status) (_ exitwatch.Status, ok bool) {
	switch {
	case !a.init:
		return s, false
	case s.Known && s.Signal != 0:
		a.initEnd = "killed (" + s.Signal.String() + ") as its runtime's init"
		return exitwatch.Status{Reason: a.initEnd + ", before its program ran: its start failed, and the kubelet starts it again"}, true
	case !s.Known:
		a.initEnd = "ended as its runtime's init, its program never seen running (" + s.Reason + ")"
		return exitwatch.Status{Reason: a.initEnd + ": a start that failed, which the kubelet starts again, or a run too brief to see"}, true
	}
	return s, false
}

// abandoned reports whether a is a start given up: its container was
// created again (superseded) while a was still its runtime's init, its
// program never seen running. Nothing starts it any more: the kubelet
// has moved on to the new container, which it created because it found
// this one created and not started (after a restart of its own or of
// containerd under the start; the runtime may even have lost it, and its
// init then waits on its exec fifo until the pod goes: the soak, seed
// 20261209, Job 131, where the wait for it hung the Job). So it is not
// waited for, and, superseded, not in the decision. An instance
// superseded once running its program is still waited for: that program
// runs, and ends as programs do.
func (a *app) abandoned() bool { return !a.done && a.superseded && a.init }

// abandonedBy is the PID of the instance that id replaced, if that one is
// abandoned (abandoned).
func (l *ledger) abandonedBy(id instance) (pid int, ok bool) {
	if a := l.byMain[id]; a != nil && a.replaced != nil && a.replaced.abandoned() {
		return a.replaced.pid, true
	}
	return 0, false
}
