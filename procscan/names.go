package procscan

import "slices"

// NameRules say, by Kubernetes container name, which containers of the pod
// are apps and which are sidecars. The injection template and the
// manifests fill them from the pod spec, so nothing is guessed: a
// container named neither (a native sidecar, an ephemeral debug container)
// is Other, neither waited for nor stopped.
type NameRules struct {
	// PodUID is the supervisor's own pod's: a container of another pod
	// (seen only with hostPID) is Other. Empty: names are not known.
	PodUID string
	// Apps names every app container; empty: the kinds by process name
	// stand (Classify), and names only name.
	Apps []string
	// Sidecars names the sidecar containers to stop.
	Sidecars []string
}

// Name reads each container's Kubernetes identity with kube (its main
// process's, Scanner.Kube), names the container after it, and decides its
// kind by name where the rules say: a sidecar by Sidecars, an app by Apps,
// a sidecar still if its main process is named as one (Rules.Sidecar), Other
// otherwise (or when it is another pod's). A container not yet set up
// (Starting) stays Starting; the pause container and the supervisor's own
// keep their kinds.
func (p *Pod) Name(kube func(pid int) Kube, r NameRules) {
	if r.PodUID == "" {
		return
	}
	for i := range p.Containers {
		c := &p.Containers[i]
		if !c.HasMain || c.Kind == Pause {
			continue
		}
		k := kube(c.Main.PID)
		if k.Known() {
			c.Kube, c.Name = k, k.Name
		}
		switch {
		case c.Kind == Self || c.Kind == Starting:
		case k.Known() && k.PodUID != r.PodUID:
			c.Kind, c.Why = Other, "a container of another pod ("+k.PodUID+")"
		case k.Known() && slices.Contains(r.Sidecars, k.Name):
			c.Kind = Sidecar
		case k.Known() && slices.Contains(r.Apps, k.Name):
			c.Kind = App
		case c.Kind == Sidecar:
			// Named by neither list, but its main process is named as a
			// sidecar's (SUPERVISOR_SIDECAR_PROCESSES): a sidecar still.
		case len(r.Apps) == 0:
			// The kinds by process name stand.
		case k.Known():
			c.Kind, c.Why = Other, "named neither among the apps nor the sidecars (a native sidecar, an ephemeral container?)"
		default:
			c.Kind, c.Why = Other, "its main process has no termination-message mount: no Kubernetes name"
		}
		if c.Kind == Sidecar {
			c.Stray = nil
		}
	}
}
