// Package supervisor is the policy and the run loop of sidecar-supervisor: it
// waits for a pod's application containers to finish, decides what their exit
// statuses mean for the Job, and stops the pod's sidecars (Istio's
// pilot-agent by default) accordingly.
//
// # Design
//
// The supervisor is a third container in a pod with shareProcessNamespace, so
// the application's main process is never its child: its parent is the
// runtime's shim, outside the pod's PID namespace. The run loop is a small
// state machine, one method per state, each returning the next, each in the
// file of its name:
//
//		[lead ->] start -> discover -> wait -> decide -> stop -> done
//		                \-> idle (restartPolicy Always, native sidecar) -> deleted
//
//	  - lead (lead.go), with a state directory, takes the leader's lock in
//	    it, or waits for it while another supervisor of the pod (a standby's
//	    twin) holds it: one leads at a time, and the next the moment the
//	    last dies.
//	  - start (run.go) checks the pod shares its PID namespace and picks the
//	    path by restart policy.
//	  - discover (discover.go) scans /proc (package procscan) until the
//	    expected application containers have been seen, within
//	    AppStartTimeout, watching each app's main process the moment it is seen
//	    (from the runtime's init on, once the kubelet's mount names it an app)
//	    and keeping a pidfd on each sidecar's. This phase polls /proc
//	    (every ScanInterval, and at once when the kernel's last PID moves),
//	    with the wait for a restart under OnFailure.
//	    A supervisor placed before the apps (AfterApps) counts
//	    AppStartTimeout only from the sighting of a container the kubelet
//	    starts after them: until then an app's image may be being pulled.
//	  - wait (wait.go) blocks on the apps' exits, without polling, until every
//	    app is done as the restart policy means it; under OnFailure, while a
//	    restart is awaited, it looks at the pod as discovery does (look.go),
//	    so a restart is seen from the runtime's init on. Which instances
//	    run, await a restart or count is kept by a pure type, the ledger
//	    (restarts.go), which the loop asks by instance (a main process's PID
//	    and start time).
//	  - decide (decide.go) maps the statuses to an action through one table
//	    (Decide): all exited 0 -> OnSuccess; any failure -> OnFailure; else any
//	    unknown -> OnUnknown. An app killed by SIGTERM is first given
//	    DeletionGrace to see whether the pod is being deleted.
//	  - stop (stop.go) takes the sidecars (sidecar.go: the sidecar and what
//	    the table of known ones, sidecars.go, says of it), plans their stop
//	    (plan.go: a pure function of the outcome, the settings and the
//	    sidecars, table-tested), and does it (act.go): the action through
//	    each main process's pidfd, or by an HTTP POST (http.go), a graceful
//	    signal only once the sidecar handles it (handler.go); then it
//	    watches each exit, and sends SIGKILL to any still alive after
//	    StopTimeout. Until it first acts, an app container started again
//	    sends the run back to wait (appsAgain).
//
// After the run, under OnFailure, Guard (guard.go) stops again a sidecar the
// kubelet starts again because its exit was not 0: a native supervisor until
// the kubelet stops it, a container one only where it saw such an exit.
//
// SIGTERM to the supervisor (pod deletion) cancels every state: it leaves the
// sidecar to the kubelet and exits 0 at once (deleted, run.go).
//
// What the loop touches in the kernel is behind two small interfaces,
// Scanner (scan.go: the pod as /proc shows it) and Watcher (package
// exitwatch: keeping processes by pidfd, their exits and statuses,
// signals), so the loop is tested with fakes, and the real implementations
// against real processes. Settings are in config.go; hold.go is the preStop hook's mode.
package supervisor
