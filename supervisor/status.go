package supervisor

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// WriteStatus prints the pod as the supervisor sees it, for
// `kubectl exec POD -c sidecar-supervisor -- /sidecar-supervisor status`:
// every container with its name, kind, main process and state, then what
// the running supervisor is doing (its progress, or its summary once done,
// from its termination-message file: message).
func WriteStatus(w io.Writer, pod procscan.Pod, named bool, message string) error {
	if named {
		fmt.Fprintln(w, "containers, by their Kubernetes names:")
	} else {
		fmt.Fprintln(w, "containers (no Kubernetes names here: told apart by cgroup, sidecars by their main process's name):")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tKIND\tPID\tPROCESS\tSTATE")
	for _, c := range pod.Containers {
		pid, comm, state := "-", "-", "running"
		if c.HasMain {
			pid, comm = fmt.Sprint(c.Main.PID), c.Main.Comm
			if c.Main.Exiting {
				state = "exiting"
			}
		} else {
			state = "main process gone (" + fmt.Sprint(c.Count) + " left)"
		}
		kind := c.Kind.String()
		switch c.Kind {
		case procscan.App:
			kind = "app: waited for"
		case procscan.Sidecar:
			kind = "sidecar: stopped after the apps"
		case procscan.Other:
			kind = "other: left alone, " + c.Why
		case procscan.Ignored:
			kind = "ignored (SUPERVISOR_IGNORE_PROCESSES)"
		case procscan.Starting:
			kind = "starting (not yet set up)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Name, kind, pid, comm, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	message = strings.TrimSpace(message)
	switch {
	case message == "":
		fmt.Fprintln(w, "\nsupervisor: no word yet (its termination-message file is empty)")
	case strings.HasPrefix(message, Progress):
		fmt.Fprintln(w, "\nsupervisor, "+message)
	default:
		fmt.Fprintln(w, "\nsupervisor, done: "+message)
	}
	return nil
}
