package supervisor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// While it runs, the supervisor keeps what it is doing in its
// termination-message file: `sidecar-supervisor status` (run in its
// container with kubectl exec) prints it beside a fresh look at the pod,
// and should the supervisor die, the kubelet shows the last of it as its
// termination message. The summary replaces it at the end. The kubelet
// reads the file only once the container has terminated.

// Progress marks the file's content as a run's progress, not its summary.
const Progress = "running: "

// publish writes the progress, if the file exists (as in WriteTerminationMessage).
func (r *run) publish(doing string) {
	if r.cfg.TerminationMessagePath == "" {
		return
	}
	if p := r.progress(doing); p != r.published {
		r.published = p
		WriteTerminationMessage(r.cfg.TerminationMessagePath, p)
	}
}

// progress is what the run is doing, then a line per app instance and
// sidecar found ("held", in the text `status` shows).
func (r *run) progress(doing string) string {
	var b strings.Builder
	b.WriteString(Progress + doing)
	for _, a := range r.apps.instances() {
		state := "running"
		switch {
		case a.abandoned:
			state = "a start given up (its runtime's init, its container created again)"
		case a.superseded:
			state = a.status.String() + "; restarted"
		case a.done && a.awaited:
			state = a.status.String() + "; awaiting its restart"
		case a.done:
			state = a.status.String()
		}
		fmt.Fprintf(&b, "\napp %s (pid %d): %s", a.container, a.pid, state)
	}
	for _, s := range r.found {
		fmt.Fprintf(&b, "\nsidecar %s (pid %d): held", s.container, s.main.PID)
	}
	return b.String()
}

// waitingFor says what discovery or the wait still waits for.
func (r *run) waitingFor() string {
	var running []string
	for _, a := range r.apps.instances() {
		if !a.done && !a.abandoned {
			running = append(running, fmt.Sprintf("%s (pid %d)", a.container, a.pid))
		}
	}
	var parts []string
	if len(running) > 0 {
		parts = append(parts, "app "+strings.Join(running, ", "))
	}
	if n := r.apps.awaited(); n > 0 {
		parts = append(parts, fmt.Sprintf("the restart of %d app(s)", n))
	}
	if short := r.apps.short(); short > 0 {
		parts = append(parts, fmt.Sprintf("%d more app container(s) to start", short))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "; ")
}

// appView is an instance as the progress shows it.
type appView struct {
	container string
	pid       int
	status    exitwatch.Status
	// done: it has ended; awaited: it awaits its restart; superseded: a
	// restart replaced it; abandoned: a start given up (app.abandoned).
	done, awaited, superseded, abandoned bool
}

// instances are every instance, in the order they started.
func (l *ledger) instances() []appView {
	var out []appView
	for _, a := range l.apps {
		out = append(out, appView{container: a.container, pid: a.pid, status: a.status,
			done: a.done, awaited: slices.Contains(l.awaiting, a), superseded: a.superseded, abandoned: a.abandoned()})
	}
	return out
}
