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
// state machine, one method per state, each returning the next:
//
//		discover -> wait -> decide -> stop -> done
//
//	  - discover scans /proc (package procscan) until the expected application
//	    containers have been seen, within AppStartTimeout, opening a pidfd for each
//	    application main process the moment it is seen. This is the only phase that
//	    polls /proc (every ScanInterval).
//	  - wait blocks on the pidfds, without polling, until every application main
//	    process has been reaped by its real parent, and reads each exit status from
//	    the kernel (see Watcher). A kernel that cannot tell yields "unknown", which
//	    is never reported as success.
//	  - decide maps the outcomes to an action through one table (Decide): all
//	    exited 0 -> OnSuccess; any failure -> OnFailure; else any unknown ->
//	    OnUnknown. An application killed by SIGTERM is first given DeletionGrace to
//	    see whether the pod is being deleted (the kubelet signals every container
//	    at once), in which case the supervisor does nothing.
//	  - stop finds the sidecar containers (waiting up to SidecarStartTimeout for
//	    one), applies the action to each sidecar main process through its pidfd
//	    (pidfd_send_signal: no PID-reuse race) or by an HTTP POST, watches each
//	    exit, and sends SIGKILL to any still alive after StopTimeout.
//
// SIGTERM to the supervisor (pod deletion) cancels every state: it leaves the
// sidecar to the kubelet and exits 0 at once.
//
// Everything the loop touches in the kernel is behind three small interfaces
// (Scanner, Watcher, Stopper) so the loop is tested with fakes, and the real
// implementations are tested against real processes.
package supervisor
