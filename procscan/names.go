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
// keep their kinds. One exception: a Starting container whose main
// process is the runtime's init (Init), already named an app, is an App.
//
// A process that has begun to exit has no mounts left to show (the kernel
// drops its mount namespace before it becomes a zombie): kube reports it as
// ending, and such a container keeps its kind by process name, unnamed, as
// without names. (The k8sjobs cluster caught an app at its last
// millisecond this way: taken for an unnamed container, it was never
// waited for.)
func (p *Pod) Name(kube func(pid int) (k Kube, ending bool), r NameRules) {
	if r.PodUID == "" {
		return
	}
	for i := range p.Containers {
		c := &p.Containers[i]
		if !c.HasMain || c.Kind == Pause {
			continue
		}
		k, ending := kube(c.Main.PID)
		if k.Known() {
			c.Kube, c.Name = k, k.Name
		}
		switch {
		case !k.Known() && (ending || c.Main.Exiting):
			// Its name is gone with its mounts: the kinds by process name.
		case c.Kind == Starting && c.Init && k.Known() && k.PodUID == r.PodUID && slices.Contains(r.Apps, k.Name):
			// The runtime's init, named an app by the kubelet's mount: the
			// app's own process from here on (it execs in place), adopted
			// before it runs, however briefly it will.
			c.Kind = App
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
