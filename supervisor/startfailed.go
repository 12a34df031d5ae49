package supervisor

import "github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

// A start that failed. An app adopted as its runtime's init (runc's
// "runc:[2:INIT]", crun's, Kata's agent: procscan.Container.Init) has not
// run its program yet. Until a scan shows it running its program, the pod
// is scanned every interval (unexeced), and a SIGKILL before that ends no
// run of the app: it is the runtime's cleanup of a start that failed
// (containerd or the kubelet restarted under it: "failed to create shim
// task: context canceled"). CRI leaves such a container created, and the
// kubelet starts a created container again whatever the restart policy
// (pkg/kubelet/container ShouldContainerBeRestarted: "Always restart
// container in the unknown, or in the created state"). So its status is
// unknown, and it awaits that start as an unknown status does under
// OnFailure (ledger.end). A restarted supervisor reads whether an instance
// is still its init from /proc, not from the journal (resume.replay): the
// exec may have happened while no supervisor watched.
//
// Two cases cost that wait for nothing, their status unknown rather than
// a failure: a start that failed once the task existed ("failed to start
// containerd task": the container is left exited, and under Never not
// started again; seen in the soak, seed 123, Job 1), and an app killed by
// SIGKILL within one scan of its exec.

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

// startFailure is s's meaning for a: a SIGKILL of an instance still its
// runtime's init is a start that failed (ok), with its status unknown.
func startFailure(a *app, s exitwatch.Status) (exitwatch.Status, bool) {
	if a.init && s.Known && s.Signal == exitwatch.SIGKILL {
		return exitwatch.Status{Reason: "killed (SIGKILL) as its runtime's init, before its program ran: its start failed, and the kubelet starts it again"}, true
	}
	return s, false
}
