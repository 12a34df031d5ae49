package procscan

import (
	"regexp"
	"sort"
	"strings"
)

// Kind is what a container is to the supervisor.
type Kind int

// The kinds of container in a pod.
const (
	// App is an application container: the supervisor waits for it.
	App Kind = iota
	// Pause holds PID 1, the pod's pause (infra) process.
	Pause
	// Self is the supervisor's own container.
	Self
	// Sidecar is a container to stop once the apps are done.
	Sidecar
	// Ignored is neither waited for nor stopped.
	Ignored
)

func (k Kind) String() string {
	switch k {
	case App:
		return "app"
	case Pause:
		return "pause"
	case Self:
		return "self"
	case Sidecar:
		return "sidecar"
	case Ignored:
		return "ignored"
	}
	return "unknown"
}

// Rules say which containers are sidecars and which are ignored, by the name
// of their main process (comm, or the base name of argv[0]).
type Rules struct {
	Sidecar []string
	Ignore  []string
}

// Container is the set of processes that share one /proc/PID/cgroup content.
type Container struct {
	// ID is the cgroup content shared by the container's processes.
	ID string
	// Name is a short readable name derived from the cgroup path: the
	// container ID (12 characters) under Kubernetes, the leaf name elsewhere.
	Name string
	Kind Kind
	// Main is the container's main process: the oldest one whose parent is
	// outside the pod's PID namespace (PPID 0). Processes a runtime execs
	// into the container later (kubectl exec) also have PPID 0, but started
	// later. HasMain is false when it has exited and only orphans remain.
	Main    Process
	HasMain bool
	// Processes holds every process of the container, Main included, by PID.
	Processes []Process
	// Stray lists processes that carry a sidecar name but are not the main
	// process of a sidecar container: never stopped, but worth a warning.
	Stray []Process
}

// Pod is a snapshot of the pod's processes grouped into containers, in
// order of their main process's PID (roughly, their start order).
type Pod struct {
	Containers []Container
}

// Classify groups processes into containers and says what each is. selfPID
// is the supervisor's own PID: its container is Self, even if it also holds
// PID 1 (shareProcessNamespace off). The pause container is the one holding
// PID 1. A container is a Sidecar or Ignored when its main process matches
// rules; a process of that name elsewhere does not count, so an app cannot
// be mistaken for the sidecar by naming a child "pilot-agent".
func Classify(procs []Process, selfPID int, rules Rules) Pod {
	byID := map[string]*Container{}
	var order []*Container
	selfID, pauseID := "", ""
	for _, p := range procs {
		c := byID[p.Cgroup]
		if c == nil {
			c = &Container{ID: p.Cgroup, Name: containerName(p.Cgroup)}
			byID[p.Cgroup] = c
			order = append(order, c)
		}
		c.Processes = append(c.Processes, p)
		if p.PID == selfPID {
			selfID = p.Cgroup
		}
		if p.PID == 1 {
			pauseID = p.Cgroup
		}
		if p.PPID == 0 && (!c.HasMain || p.StartTime < c.Main.StartTime ||
			(p.StartTime == c.Main.StartTime && p.PID < c.Main.PID)) {
			c.Main, c.HasMain = p, true
		}
	}
	pod := Pod{Containers: make([]Container, 0, len(order))}
	for _, c := range order {
		switch {
		case c.ID == selfID:
			c.Kind = Self
		case c.ID == pauseID:
			c.Kind = Pause
		case c.HasMain && c.Main.Matches(rules.Sidecar):
			c.Kind = Sidecar
		case c.HasMain && c.Main.Matches(rules.Ignore):
			c.Kind = Ignored
		default:
			c.Kind = App
		}
		for _, p := range c.Processes {
			if c.Kind != Sidecar && c.Kind != Self && p.Matches(rules.Sidecar) {
				c.Stray = append(c.Stray, p)
			}
		}
		pod.Containers = append(pod.Containers, *c)
	}
	sort.SliceStable(pod.Containers, func(i, j int) bool {
		return firstPID(pod.Containers[i]) < firstPID(pod.Containers[j])
	})
	return pod
}

func firstPID(c Container) int {
	if c.HasMain {
		return c.Main.PID
	}
	return c.Processes[0].PID
}

// Of returns the containers of kind k.
func (p Pod) Of(k Kind) []Container {
	var out []Container
	for _, c := range p.Containers {
		if c.Kind == k {
			out = append(out, c)
		}
	}
	return out
}

// Outside reports whether any process is outside the supervisor's own
// container. With shareProcessNamespace off, none is.
func (p Pod) Outside() bool {
	for _, c := range p.Containers {
		if c.Kind != Self {
			return true
		}
	}
	return false
}

var hexID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// containerName derives a short name from a cgroup content: the last element
// of the most specific path (the unified hierarchy's when it says anything),
// stripped of the runtime's decoration ("cri-containerd-<id>.scope"), with a
// 64-hex container ID cut to 12 characters as crictl shows it.
func containerName(cgroup string) string {
	best := ""
	for _, line := range strings.Split(cgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := parts[2]
		if parts[0] == "0" && parts[1] == "" && p != "/" && p != "" {
			best = p
			break
		}
		if len(p) > len(best) {
			best = p
		}
	}
	best = strings.TrimRight(best, "/")
	if i := strings.LastIndexByte(best, '/'); i >= 0 {
		best = best[i+1:]
	}
	best = strings.TrimSuffix(best, ".scope")
	for _, pre := range []string{"cri-containerd-", "crio-", "docker-", "libpod-"} {
		best = strings.TrimPrefix(best, pre)
	}
	if hexID.MatchString(best) {
		best = best[:12]
	}
	if best == "" || best == ".." {
		return "/"
	}
	return best
}
