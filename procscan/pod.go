package procscan

import (
	"path"
	"regexp"
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
	// Starting is a container the runtime has not finished setting up: its
	// main process is still the runtime's init, which will exec the
	// entrypoint in place (same PID), or is not yet in its container's
	// cgroup (see Settled). What it is cannot be told yet; a later scan
	// will.
	Starting
	// Other is a container of the pod known by its Kubernetes name that is
	// neither an app nor a sidecar (a native sidecar, an ephemeral debug
	// container), or of another pod: neither waited for nor stopped (see
	// Pod.Name).
	Other
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
	case Starting:
		return "starting"
	case Other:
		return "other"
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
	// Name is the container's name: its Kubernetes name where the kubelet's
	// mount tells it (Kube, set by Pod.Name), else a short one derived from
	// the cgroup path (the container ID, 12 characters, under Kubernetes;
	// the leaf name elsewhere).
	Name string
	Kind Kind
	// Kube is its identity as the kubelet gave it, when known.
	Kube Kube
	// Why says why an Other container is one.
	Why string
	// Main is the container's main process: its oldest process, whose
	// parent is outside the pod's PID namespace (PPID 0). Processes a
	// runtime execs into the container later (kubectl exec) also have PPID
	// 0, but started later. Once it has exited, the oldest process left is
	// an orphan (HasMain false) or an exec'd one, which then looks like a
	// main process (see Classify).
	Main    Process
	HasMain bool
	// Init is true for a Starting container whose main process is the
	// runtime's init in the container's settled cgroup: it will exec the
	// container's entrypoint in place, same PID and start time. Pod.Name
	// takes such a container for an app when the kubelet's mount names it
	// one: watched from then on, before its entrypoint runs.
	Init bool
	// Processes holds the one process of the container that a scan keeps:
	// its oldest (Main, when HasMain), with ID as its Cgroup. The others
	// are counted (Count), not kept, so that a scan's memory does not grow
	// with the pod's processes; Stray holds those named like a sidecar.
	Processes []Process
	// Count is how many processes the container has, Main and Stray
	// included.
	Count int
	// Stray lists, by PID, the processes that carry a sidecar name but are
	// not the main process of a sidecar container: never stopped, but worth
	// a warning. They are few, unless a pod names thousands of processes
	// like its sidecar: then they cost it its memory.
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
//
// A container's main process is its oldest process, when that one's parent
// is outside the pod's PID namespace (PPID 0). Every other process of the
// container descends from it or was exec'd in later (kubectl exec, exec
// probes), so while it runs it is the oldest. Once it has exited, the
// oldest left is an orphan (PPID 1: no main process) or an exec'd process
// (PPID 0), which a scan cannot tell from a main process: the caller
// keeps each container's kind from its first sight (the supervisor's
// kindOf), so that an exec'd process named pilot-agent in an app
// container whose main process just exited never makes it a sidecar.
//
// A process that has begun to exit (Exiting) shows "/" for its cgroup v1
// lines, so on a v1 or hybrid host its content is no container's. It is
// placed in the container whose content it shares, or else the only one
// whose unified ("0::") line it shares; failing both, an exiting main
// process (PPID 0) keeps a container of its own, so that an app that exited
// before the supervisor looked is still seen, with the exiting processes
// of the same content; any other exiting process is left out: it is no
// container's main process, nothing waits for it or signals it, and alone
// it would make a phantom container.
//
// The order of procs does not matter: Classify and Scanner.Scan share one
// builder, which takes processes in the order /proc lists them.
func Classify(procs []Process, selfPID int, rules Rules) Pod {
	b := newBuilder(selfPID, rules)
	for _, p := range procs {
		b.add(p)
	}
	return b.pod()
}

// Settled reports whether a cgroup content is that of a container of the
// pod, placed as the pause container's (pause) is. Kubernetes puts every
// container of a pod, the pause included, in a cgroup of its own under the
// pod's cgroup (the kubelet gives the runtime the pod's cgroup as every
// container's parent), so on each hierarchy a container's path lies under
// the same parent as the pause container's. A process caught between its
// creation and its move into its container's cgroup (a runtime that moves
// it after the fork, the e2e harness's podsim enter) is still in its
// creator's cgroup: outside that parent (from the supervisor's cgroup
// namespace, a path such as "/../../.."). Taking it for a container then
// would give it an identity it loses at the next scan (issue 15).
//
// A hierarchy where the pause container's path is "/" (the runtime does
// not place containers apart there, or it is the reader's own root) says
// nothing; with no pause container (pause = ""), every content is settled.
// An exiting process shows "/" for its v1 lines, so only its unified line
// ("0::") is compared.
func Settled(cgroup, pause string, exiting bool) bool {
	if pause == "" {
		return true
	}
	paths := map[string]string{} // "hierarchy-id:controllers" -> path
	for _, line := range strings.Split(cgroup, "\n") {
		h, path, ok := splitCgroupLine(line)
		if ok {
			paths[h] = path
		}
	}
	for _, line := range strings.Split(pause, "\n") {
		h, ref, ok := splitCgroupLine(line)
		if !ok || ref == "/" || (exiting && h != "0:") {
			continue
		}
		path, ok := paths[h]
		if !ok || !under(path, cgroupDir(ref)) {
			return false
		}
	}
	return true
}

// splitCgroupLine splits "12:memory:/path" into "12:memory" and "/path".
func splitCgroupLine(line string) (hierarchy, path string, ok bool) {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
		return "", "", false
	}
	return parts[0] + ":" + parts[1], parts[2], true
}

// cgroupDir is the parent of a cgroup path as /proc shows it: "/a/b" ->
// "/a"; "/../x" -> "/.." (a path outside the reader's cgroup namespace).
func cgroupDir(p string) string {
	p = strings.TrimRight(p, "/")
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

// under reports whether p lies in a cgroup directly below dir, or deeper
// (a container may make cgroups of its own inside its cgroup): its next
// element after dir is a real name, not "..".
func under(p, dir string) bool {
	if dir != "/" {
		if !strings.HasPrefix(p, dir+"/") {
			return false
		}
		p = p[len(dir):]
	}
	next, _, _ := strings.Cut(p[1:], "/")
	return next != "" && next != "." && next != ".."
}

// runtimeInit reports whether p is a container runtime's init process that
// has not yet exec'd the container's entrypoint. Each OCI runtime's enters
// the pod's PID namespace, the container's cgroup and uid when the
// container is created, then waits until it is started: under the kubelet,
// the time between CreateContainer and StartContainer, during which a
// supervisor started just before istio-proxy (the injector puts istio-proxy
// last) sees istio-proxy's container with this process as its main one. It
// then execs the entrypoint in place, keeping its PID. Known by name, as
// each runtime leaves it:
//
//   - runc (containerd's default, CRI-O's before crun): comm "runc:[2:INIT]",
//     set by its nsexec; argv "runc init".
//   - youki: comm "youki:[2:INIT]", set the same way.
//   - crun (CRI-O's default from 1.31, and in its packages from 1.28, as
//     /usr/libexec/crio/crun; OpenShift's from 4.18): a fork of crun
//     itself, argv[0] crun's (seen here: crun 1.8.1 `create` left
//     comm "crun", argv[0] "crun", uid already the container's). A crun
//     whose binary is on a writable file system first re-executes a copy
//     of itself from a memfd, and the comm is then the memfd's name,
//     "memfd:crun_cloned:/proc/self/exe" cut to 15 bytes, on Linux 6.14+,
//     or the number of its file descriptor before. argv[0] stays crun's, so
//     argv[0] decides: an app whose entrypoint is crun itself would be
//     taken for a container being set up. An init that ends before its
//     exec (a start that failed) has no argv left to read: its comm, crun's
//     or the memfd's, decides then, as runc's name does for runc's.
//   - Kata Containers: the agent in the pod's VM runs itself as
//     "kata-agent init" (rustjail's Container::start: current_exe with the
//     one argument init, 3.x), which joins the pod's PID namespace and
//     forks the container's process: comm "kata-agent", argv[0] the
//     agent's path, waiting on the exec fifo, then execvp in place. Where
//     the agent is the VM's init (osbuilder's AGENT_INIT=yes, as in the
//     vanilla Alpine initrd), its binary is /sbin/init: comm "init", argv
//     "/sbin/init init". An app whose entrypoint is the agent is not a case
//     (the agent runs outside the pod); one run as "/sbin/init init" would
//     be taken for a container being set up.
//
// gVisor makes a container's process only when it is started, the
// entrypoint loaded already (runsc's createContainerProcess): nothing to
// know. A runtime not named here (others unchecked) leaves its init looking
// like the container's process: an app found under its name, or a sidecar
// by the kubelet's mount, a little early.
func runtimeInit(p Process) bool {
	switch {
	case strings.HasPrefix(p.Comm, "runc:[") || strings.HasPrefix(p.Comm, "youki:["):
		return true
	case p.Comm == "kata-agent":
		return p.Argv0 == "" || path.Base(p.Argv0) == "kata-agent"
	case p.Comm == "init":
		return p.Argv0 == "/sbin/init" && p.InitArg
	case p.Argv0 == "":
		return p.Comm == "crun" || strings.HasPrefix(p.Comm, "memfd:crun")
	case path.Base(p.Argv0) != "crun":
		return false
	}
	return p.Comm == "crun" || strings.HasPrefix(p.Comm, "memfd:crun") || allDigits(p.Comm)
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// older orders processes by start time. Start times count clock ticks
// (10ms), so a main process and its first child can tie: then a PPID-0
// process is the older (a child never starts before its parent), then the
// lower PID (an exec'd process comes later, unless PIDs wrapped).
func older(a, b Process) bool {
	if a.StartTime != b.StartTime {
		return a.StartTime < b.StartTime
	}
	if (a.PPID == 0) != (b.PPID == 0) {
		return a.PPID == 0
	}
	return a.PID < b.PID
}

// unifiedLine returns the cgroup v2 ("0::") line of a cgroup content,
// without the " (deleted)" the kernel appends to it once the cgroup has
// been removed while a zombie of it waits to be reaped (proc_cgroup_show):
// the zombie's container still.
func unifiedLine(cgroup string) (string, bool) {
	for _, line := range strings.Split(cgroup, "\n") {
		if strings.HasPrefix(line, "0::") {
			return strings.TrimSuffix(line, " (deleted)"), true
		}
	}
	return "", false
}

// Unified is what names a container in a cgroup content read from an
// exiting process: its unified ("0::") line (see unifiedLine), which the
// kernel keeps showing once the process has begun to exit, where its v1
// lines turn to "/". It is "" when there is no such line or it is the
// root ("0::/"), which names no container. On a host where the runtime
// does not give each container a unified cgroup of its own, several
// containers share it: the caller must tell.
func Unified(cgroup string) string {
	u, ok := unifiedLine(cgroup)
	if !ok || u == "0::/" {
		return ""
	}
	return u
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
