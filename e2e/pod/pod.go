// Package pod simulates a Kubernetes pod with shareProcessNamespace on this
// machine, from real processes in real namespaces, and plays the kubelet's
// part: it starts the containers in pod-spec order (running each postStart
// hook before the next container starts), applies the restartPolicy,
// records each container's exit code, runs preStop hooks and sends SIGTERM
// then SIGKILL on deletion, and computes the pod phase as the kubelet does.
//
// A Backend makes the containers. Namespaces (ns_linux.go) enters them by
// hand: a pause process owns the pod's PID, network, IPC and UTS namespaces,
// and each container is started from outside in those namespaces with its
// own mount namespace, /proc, cgroup v2 leaf and cgroup namespace, and uid.
// Runc (runc_linux.go) makes each one a real runc container joining the
// pause container's namespaces by path, as containerd's CRI does.
//
// Like containerd's shim with a shared PID namespace, when a container's
// main process exits the rest of its cgroup is killed.
package pod

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RestartPolicy is the pod's restartPolicy.
type RestartPolicy string

const (
	Never     RestartPolicy = "Never"
	OnFailure RestartPolicy = "OnFailure"
	Always    RestartPolicy = "Always"
)

// Phase is the pod phase the kubelet would report.
type Phase string

const (
	Pending   Phase = "Pending"
	Running   Phase = "Running"
	Succeeded Phase = "Succeeded"
	Failed    Phase = "Failed"
)

// Spec is the part of a pod spec the simulation honours.
type Spec struct {
	Name          string
	RestartPolicy RestartPolicy // default Never
	// InitContainers run one at a time, each to completion, before any
	// container starts. One that fails fails the pod (as under Never; the
	// kubelet would retry it under OnFailure and Always).
	InitContainers []Container
	Containers     []Container
	// TerminationGracePeriod bounds a deletion (default 30s, as Kubernetes).
	TerminationGracePeriod time.Duration
	// RestartBackoff is the delay before a restart (the kubelet starts at
	// 10s; default here 200ms).
	RestartBackoff time.Duration
	// Log receives every container's output as it comes, each line prefixed
	// with the container's name (the demo shows it). May be nil.
	Log io.Writer
	// Dir is the directory for the pod's files (see Pod.Dir); empty makes
	// a temporary one. It is removed by Close either way.
	Dir string
	// NoNames leaves out the kubelet's termination-message mounts (see
	// Pod.instanceFile): the containers cannot be told by their names, as
	// under a runtime the kubelet does not drive.
	NoNames bool
}

// Container is one container of the pod.
type Container struct {
	Name string
	// Argv is the command. The namespaces backend resolves it on the host;
	// the runc backend inside Rootfs.
	Argv []string
	Env  []string
	Dir  string // working directory (default "/")
	UID  int
	GID  int
	// Rootfs is the container's root filesystem (runc backend only; the
	// namespaces backend runs over the host filesystem).
	Rootfs string
	// ReadOnlyRootfs mounts Rootfs read-only (readOnlyRootFilesystem; runc
	// backend).
	ReadOnlyRootfs bool
	// Mounts are bind mounts host path -> container path (runc backend).
	Mounts []Mount
	// Caps keeps only these capabilities (numbers) in a root container's
	// bounding set; nil keeps the backend's default.
	Caps []int
	// NoNewPrivs is allowPrivilegeEscalation: false.
	NoNewPrivs bool
	// OwnPIDNamespace leaves the container out of the pod's PID namespace,
	// as shareProcessNamespace: false does.
	OwnPIDNamespace bool
	// StartAfter, when set, holds the container's first start back until
	// it returns, as a slow image pull does, but ended by an event the
	// test names instead of a clock (Pod.Await waits for one in the pod);
	// the containers after it wait too. ctx ends when the pod is deleted
	// or closed. An error fails the start (exit code 128, as a failed
	// start).
	StartAfter func(ctx context.Context, p *Pod) error
	// Native makes it a native sidecar (an init container with
	// restartPolicy Always, Kubernetes 1.29+): it starts before the
	// containers after it in Spec.Containers without holding them back, is
	// restarted whenever it exits, is left out of the pod's phase, and gets
	// SIGTERM once every other container is done for good.
	Native bool
	// Ephemeral makes it an ephemeral container: declared here but started
	// only by StartEphemeral, as `kubectl debug` adds one to a running pod;
	// it runs once, and is left out of the pod's phase.
	Ephemeral bool
	// CgroupDelay keeps each attempt's main process this long in the
	// cgroup of its creator, in the pod's PID namespace already, before it
	// joins its own (namespaces backend only): the window in which a
	// runtime that moves a process after creating it shows it in no
	// container of the pod (issue 15). runc places its init in the
	// container's cgroup before it enters the pod's PID namespace, so the
	// runc backend has no such window.
	CgroupDelay time.Duration
	// CgroupHold, when set, holds each attempt's main process out of its
	// cgroup, as CgroupDelay does (after it), until it returns: the window
	// ends on what the test waits for, not on a clock (namespaces backend
	// only). ctx ends with the pod's deletion; an error fails the start.
	CgroupHold func(ctx context.Context, p *Pod, attempt int) error
	// PostStart runs in the container after it starts; the next container
	// starts only once it returns (how Istio holds the application until
	// the proxy is ready).
	PostStart []string
	// StartupProbe runs in the container after it starts, every 20 ms
	// until it exits 0 (2 minutes at most); the next container starts
	// only then (a native sidecar's startup probe). Its last output goes
	// to the container's log.
	StartupProbe []string
	// PreStop runs in the container before it gets SIGTERM on deletion.
	PreStop []string
	// TerminationMessage is where the container writes its termination
	// message, as the container sees it ("" for none). The pod creates the
	// file, as the kubelet does, at Pod.TerminationMessagePath; the runc
	// backend mounts it there. The namespaces backend runs over the host
	// filesystem: there the container must be told the host path.
	TerminationMessage string
}

// Mount is a bind mount into a runc container.
type Mount struct {
	Host, Container string
	ReadOnly        bool
}

// Backend makes sandboxes and containers.
type Backend interface {
	Name() string
	// Sandbox starts the pause container and returns its host PID.
	Sandbox(ctx context.Context, p *Pod) error
	// Start starts one attempt of a container.
	Start(ctx context.Context, p *Pod, c *Container, attempt int, stdout *os.File) (Process, error)
	// Exec runs argv in a running container (a hook), bounded by ctx.
	Exec(ctx context.Context, p *Pod, c *Container, attempt int, argv []string) (output []byte, err error)
	// Teardown kills everything left and removes what Sandbox made.
	Teardown(p *Pod) error
}

// Process is a container's main process.
type Process interface {
	PID() int
	// Wait returns the exit code (128+signal when killed) once it exits.
	Wait() (code int, sig syscall.Signal)
	Signal(sig syscall.Signal) error
	// KillAll kills every process left in the container.
	KillAll()
}

// Pod is a running simulated pod.
type Pod struct {
	Spec    Spec
	Backend Backend
	// Dir holds the pod's files (logs, termination messages, bundles).
	Dir string
	// PausePID is the host PID of the pause process.
	PausePID int

	// UID is the pod's UID, as the kubelet's paths carry it.
	UID string

	// Backend-private state.
	BackendState any

	mu sync.Mutex
	// changed is closed, and made anew, at each change of the status, each
	// write to a container's log and the deletion's start (Await).
	changed  chan struct{}
	status   []ContainerStatus
	procs    []Process
	attempts []int
	logs     []*logBuffer
	deleting bool
	// stoppingNative: the other containers are done; the native sidecars
	// get SIGTERM and are not restarted.
	stoppingNative bool
	initLogs       []*logBuffer
	initErr        error // an init container failed: the pod failed
	// instance is each container's current termination-message file, by
	// name (instanceFile).
	instance map[string]string
	done     chan struct{} // closed when every container goroutine ended
	cancel   context.CancelFunc
	runCtx   context.Context
	wg       sync.WaitGroup
}

// Start creates the pod and starts its containers in order, in the
// background. Close it when done.
func Start(ctx context.Context, b Backend, spec Spec) (*Pod, error) {
	spec.RestartPolicy = cmp.Or(spec.RestartPolicy, Never)
	spec.TerminationGracePeriod = cmp.Or(spec.TerminationGracePeriod, 30*time.Second)
	spec.RestartBackoff = cmp.Or(spec.RestartBackoff, 200*time.Millisecond)
	spec.Name = cmp.Or(spec.Name, "pod")
	dir := spec.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "podsim-"+spec.Name+"-")
		if err != nil {
			return nil, err
		}
		// Containers run as other users and must reach their files.
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
		dir = d
	}
	p := &Pod{Spec: spec, Backend: b, Dir: dir, changed: make(chan struct{}), done: make(chan struct{}),
		UID: newUID(), instance: map[string]string{}}
	n := len(spec.Containers)
	p.status = make([]ContainerStatus, n)
	p.procs = make([]Process, n)
	p.attempts = make([]int, n)
	p.logs = make([]*logBuffer, n)
	for i, c := range spec.Containers {
		p.status[i].Name, p.status[i].Native, p.status[i].Ephemeral = c.Name, c.Native, c.Ephemeral
		p.logs[i] = &logBuffer{name: c.Name, stream: spec.Log, written: p.notify}
	}
	for _, c := range append(append([]Container{}, spec.InitContainers...), spec.Containers...) {
		// The file a container writes its termination message to, or the
		// bind mount's target for its termination-message file.
		if c.TerminationMessage != "" || !spec.NoNames {
			if err := os.WriteFile(p.messageFile(c.Name), nil, 0o666); err != nil {
				return nil, err
			}
			os.Chmod(p.messageFile(c.Name), 0o666)
		}
	}
	if err := b.Sandbox(ctx, p); err != nil {
		b.Teardown(p)
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%s sandbox: %w", b.Name(), err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.cancel, p.runCtx = cancel, runCtx
	go p.run(runCtx)
	return p, nil
}

// messageFile is, on the host, a container's termination-message file
// without names, and the target of its bind mount with them.
func (p *Pod) messageFile(name string) string {
	return filepath.Join(p.Dir, name+".termination-log")
}

// TerminationMessagePath is the host file behind a container's termination
// message: its current instance's (instanceFile), or without names
// messageFile.
func (p *Pod) TerminationMessagePath(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.instance[name]; ok {
		return f
	}
	return p.messageFile(name)
}

// instanceFile makes, for one instance (attempt) of container c, the file
// the kubelet would: <root>/pods/<pod UID>/containers/<name>/<8 hex>, new
// for each instance, which the backends bind-mount onto the container's
// termination-message path, as the kubelet asks the runtime to (see
// procscan.Kube). "" with Spec.NoNames.
func (p *Pod) instanceFile(c *Container) (string, error) {
	if p.Spec.NoNames {
		return "", nil
	}
	var b [4]byte
	rand.Read(b[:])
	f := filepath.Join(p.Dir, "kubelet", "pods", p.UID, "containers", c.Name, hex.EncodeToString(b[:]))
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(f, nil, 0o666); err != nil {
		return "", err
	}
	if err := os.Chmod(f, 0o666); err != nil {
		return "", err
	}
	p.mu.Lock()
	p.instance[c.Name] = f
	p.mu.Unlock()
	return f, nil
}

// newUID is a random UUID (version 4), as the API server gives a pod.
func newUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// TerminationMessage reads what the container wrote there.
func (p *Pod) TerminationMessage(name string) string {
	b, _ := os.ReadFile(p.TerminationMessagePath(name))
	return strings.TrimSpace(string(b))
}
