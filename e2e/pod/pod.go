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
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RestartPolicy is the pod's restartPolicy.
type RestartPolicy string

// The restart policies.
const (
	Never     RestartPolicy = "Never"
	OnFailure RestartPolicy = "OnFailure"
	Always    RestartPolicy = "Always"
)

// Phase is the pod phase the kubelet would report.
type Phase string

// The phases.
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
	// StartDelay holds the container's start back, as a slow image pull
	// does; the containers after it wait too.
	StartDelay time.Duration
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
	// PostStart runs in the container after it starts; the next container
	// starts only once it returns (how Istio holds the application until
	// the proxy is ready).
	PostStart []string
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

// ContainerStatus is one container's state, as in the pod's status.
type ContainerStatus struct {
	Name     string
	Running  bool
	Started  bool // started at least once
	ExitCode int  // of the last termination; 128+signal when killed
	Signal   syscall.Signal
	Restarts int
	// PID is the main process's PID on the host while it runs.
	PID int
	// Native and Ephemeral (AddEphemeral) containers are left out of the
	// pod's phase.
	Native, Ephemeral bool
	// StartedAt is when the last attempt's main process was running (the
	// backend's Start returned), on this host's clock.
	StartedAt time.Time
}

// Status is the pod's status.
type Status struct {
	Phase      Phase
	Containers []ContainerStatus
}

// Container returns the named container's status.
func (s Status) Container(name string) ContainerStatus {
	for _, c := range s.Containers {
		if c.Name == name {
			return c
		}
	}
	return ContainerStatus{Name: name}
}

func (s Status) String() string {
	var b strings.Builder
	b.WriteString(string(s.Phase))
	for _, c := range s.Containers {
		state := "waiting"
		switch {
		case c.Running:
			state = fmt.Sprintf("running pid %d", c.PID)
		case c.Started:
			state = fmt.Sprintf("exit %d", c.ExitCode)
		}
		fmt.Fprintf(&b, " %s=%s", c.Name, state)
		if c.Restarts > 0 {
			fmt.Fprintf(&b, "(restarts %d)", c.Restarts)
		}
	}
	return b.String()
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

	mu       sync.Mutex
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
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = Never
	}
	if spec.TerminationGracePeriod == 0 {
		spec.TerminationGracePeriod = 30 * time.Second
	}
	if spec.RestartBackoff == 0 {
		spec.RestartBackoff = 200 * time.Millisecond
	}
	if spec.Name == "" {
		spec.Name = "pod"
	}
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
		p.logs[i] = &logBuffer{name: c.Name, stream: spec.Log}
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

// run is the kubelet's part: containers in order, postStart hooks between.
func (p *Pod) run(ctx context.Context) {
	defer close(p.done)
	if err := p.runInits(ctx); err != nil {
		p.mu.Lock()
		p.initErr = err
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
		return
	}
	if slices.ContainsFunc(p.Spec.Containers, func(c Container) bool { return c.Native }) {
		go p.stopNatives(ctx)
	}
	for i := range p.Spec.Containers {
		if ctx.Err() != nil || p.isDeleting() {
			break
		}
		if p.Spec.Containers[i].Ephemeral {
			continue
		}
		started := make(chan struct{})
		p.wg.Add(1)
		go p.supervise(ctx, i, started)
		<-started
		c := &p.Spec.Containers[i]
		if len(c.PostStart) > 0 && p.running(i) {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			out, err := p.Backend.Exec(hctx, p, c, p.attempt(i), c.PostStart)
			cancel()
			p.logs[i].Write(hookLog("postStart", out))
			if err != nil {
				// The kubelet kills a container whose postStart fails.
				p.logs[i].Write([]byte(fmt.Sprintf("[postStart failed: %v]\n", err)))
				if proc := p.proc(i); proc != nil {
					proc.Signal(syscall.SIGKILL)
				}
			}
		}
	}
	p.wg.Wait()
}

// runInits runs the init containers in order, each to completion; their
// output goes to Logs under their names.
func (p *Pod) runInits(ctx context.Context) error {
	for i := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[i]
		log := &logBuffer{name: c.Name, stream: p.Spec.Log}
		p.mu.Lock()
		p.initLogs = append(p.initLogs, log)
		p.mu.Unlock()
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		proc, err := p.Backend.Start(ctx, p, c, 0, w)
		w.Close()
		if err != nil {
			r.Close()
			return fmt.Errorf("init container %s: %w", c.Name, err)
		}
		copied := make(chan struct{})
		go func() { io.Copy(log, r); r.Close(); close(copied) }()
		code, _ := proc.Wait()
		proc.KillAll()
		select {
		case <-copied:
		case <-time.After(5 * time.Second):
		}
		if code != 0 {
			return fmt.Errorf("init container %s exited %d", c.Name, code)
		}
	}
	return nil
}

// supervise runs container i, and restarts it as the policy says.
func (p *Pod) supervise(ctx context.Context, i int, started chan struct{}) {
	defer p.wg.Done()
	c := &p.Spec.Containers[i]
	once := sync.OnceFunc(func() { close(started) })
	defer once()
	if c.StartDelay > 0 {
		select {
		case <-time.After(c.StartDelay):
		case <-ctx.Done():
			return
		}
	}
	for attempt := 0; ; attempt++ {
		r, w, err := os.Pipe()
		if err != nil {
			p.logs[i].Write([]byte(fmt.Sprintf("[pipe: %v]\n", err)))
			return
		}
		proc, err := p.Backend.Start(ctx, p, c, attempt, w)
		w.Close()
		if err != nil {
			r.Close()
			p.logs[i].Write([]byte(fmt.Sprintf("[start failed: %v]\n", err)))
			p.update(i, func(s *ContainerStatus) { s.Started, s.Running, s.ExitCode = true, false, 128 })
			once()
			return
		}
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			defer r.Close()
			io.Copy(p.logs[i], r)
		}()
		p.mu.Lock()
		p.procs[i], p.attempts[i] = proc, attempt
		p.mu.Unlock()
		now := time.Now()
		deleting := false
		p.update(i, func(s *ContainerStatus) {
			s.Started, s.Running, s.PID, s.Restarts, s.StartedAt = true, true, proc.PID(), attempt, now
			deleting = p.deleting // under p.mu, as Delete reads the running set
		})
		if deleting {
			// Delete began while this container was starting and did not
			// count it as running: it gets its SIGTERM now, as the kubelet
			// stops a container that comes up during a deletion. (A test
			// can see a runc container's first output before Start returns.)
			proc.Signal(syscall.SIGTERM)
		}
		once()
		code, sig := proc.Wait()
		// A shim with a shared PID namespace kills what the main process
		// leaves behind in its container.
		proc.KillAll()
		// Everything the container wrote is in its log before it reads as
		// terminated (as kubectl logs has it all then). Nothing of the
		// container holds the pipe any more; the bound is for a process
		// that escaped it.
		select {
		case <-copied:
		case <-time.After(time.Second):
		}
		p.update(i, func(s *ContainerStatus) { s.Running, s.ExitCode, s.Signal, s.PID = false, code, sig, 0 })
		restart := false
		switch {
		case c.Ephemeral:
		case c.Native:
			restart = !p.isStoppingNative()
		case p.Spec.RestartPolicy == Always:
			restart = true
		case p.Spec.RestartPolicy == OnFailure:
			restart = code != 0
		}
		if !restart || p.isDeleting() || ctx.Err() != nil {
			return
		}
		select {
		case <-time.After(p.Spec.RestartBackoff):
		case <-ctx.Done():
			return
		}
		if p.isDeleting() {
			return
		}
	}
}

func (p *Pod) update(i int, f func(*ContainerStatus)) {
	p.mu.Lock()
	f(&p.status[i])
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *Pod) isStoppingNative() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stoppingNative
}

func (p *Pod) isDeleting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleting
}

func (p *Pod) running(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status[i].Running
}

func (p *Pod) proc(i int) Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.procs[i]
}

func (p *Pod) attempt(i int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts[i]
}

func (p *Pod) index(name string) int {
	for i, c := range p.Spec.Containers {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// Status returns the pod's status now.
func (p *Pod) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusLocked()
}

func (p *Pod) statusLocked() Status {
	st := Status{Containers: append([]ContainerStatus(nil), p.status...)}
	st.Phase = phase(p.Spec.RestartPolicy, st.Containers)
	if p.initErr != nil {
		st.Phase = Failed
	}
	return st
}

// phase is the kubelet's rule. Never: once every container has terminated,
// Succeeded if all exited 0, else Failed. OnFailure: Succeeded once all
// exited 0; a failed one will be restarted, so Running. Always: Running.
// Native sidecars and ephemeral containers do not count, but a pod whose
// native sidecars still run is Running.
func phase(policy RestartPolicy, cs []ContainerStatus) Phase {
	started, running, failed, total, natives := 0, 0, 0, 0, 0
	for _, c := range cs {
		if c.Native && c.Running {
			natives++
		}
		if c.Native || c.Ephemeral {
			continue
		}
		total++
		if c.Started {
			started++
		}
		if c.Running {
			running++
		} else if c.Started && c.ExitCode != 0 {
			failed++
		}
	}
	switch {
	case started == 0:
		return Pending
	case running > 0 || started < total:
		return Running
	case policy == Always:
		return Running
	case policy == OnFailure && failed > 0: // restarting
		return Running
	case natives > 0: // being stopped
		return Running
	case failed > 0:
		return Failed
	}
	return Succeeded
}

// StartEphemeral starts the ephemeral container name (Container.Ephemeral)
// in the running pod, as `kubectl debug` does, and returns once it runs.
func (p *Pod) StartEphemeral(ctx context.Context, name string) error {
	i := p.index(name)
	if i < 0 || !p.Spec.Containers[i].Ephemeral {
		return fmt.Errorf("no ephemeral container %q in pod %s", name, p.Spec.Name)
	}
	p.mu.Lock()
	if p.deleting || p.status[i].Started {
		p.mu.Unlock()
		return fmt.Errorf("pod %s: ephemeral container %s cannot start now", p.Spec.Name, name)
	}
	p.wg.Add(1) // the pod's run is still waiting for its other containers
	p.mu.Unlock()
	started := make(chan struct{})
	go p.supervise(p.runCtx, i, started)
	select {
	case <-started:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopNatives sends SIGTERM to the native sidecars once every other
// container is done for good (the pod would be Succeeded or Failed but for
// them), as the kubelet does.
func (p *Pod) stopNatives(ctx context.Context) {
	done := func(st Status) bool {
		var rest []ContainerStatus
		for _, c := range st.Containers {
			if !c.Native {
				rest = append(rest, c)
			}
		}
		ph := phase(p.Spec.RestartPolicy, rest)
		return ph == Succeeded || ph == Failed
	}
	if _, err := p.WaitFor(ctx, done); err != nil {
		return
	}
	p.mu.Lock()
	p.stoppingNative = true
	var natives []Process
	for i, c := range p.Spec.Containers {
		if c.Native && p.status[i].Running {
			natives = append(natives, p.procs[i])
		}
	}
	p.mu.Unlock()
	for _, proc := range natives {
		proc.Signal(syscall.SIGTERM)
	}
}

// WaitFor waits until cond holds for the pod's status, or ctx ends; the
// error then carries the last status.
func (p *Pod) WaitFor(ctx context.Context, cond func(Status) bool) (Status, error) {
	for {
		p.mu.Lock()
		st, ch := p.statusLocked(), p.changed
		p.mu.Unlock()
		if cond(st) {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return st, fmt.Errorf("pod %s: %w; status: %s", p.Spec.Name, ctx.Err(), st)
		}
	}
}

// WaitPhase waits for a terminal phase (Succeeded or Failed).
func (p *Pod) WaitPhase(ctx context.Context) (Status, error) {
	return p.WaitFor(ctx, func(s Status) bool { return s.Phase == Succeeded || s.Phase == Failed })
}

// WaitRunning waits until the named container runs (attempt >= restarts).
func (p *Pod) WaitRunning(ctx context.Context, name string, restarts int) (ContainerStatus, error) {
	st, err := p.WaitFor(ctx, func(s Status) bool {
		c := s.Container(name)
		return c.Running && c.Restarts >= restarts
	})
	return st.Container(name), err
}

// Exec runs argv in a running container, like kubectl exec.
func (p *Pod) Exec(ctx context.Context, name string, argv ...string) ([]byte, error) {
	i := p.index(name)
	if i < 0 {
		return nil, fmt.Errorf("no container %q", name)
	}
	return p.Backend.Exec(ctx, p, &p.Spec.Containers[i], p.attempt(i), argv)
}

// Signal sends sig to a container's main process.
func (p *Pod) Signal(name string, sig syscall.Signal) error {
	i := p.index(name)
	if i < 0 {
		return fmt.Errorf("no container %q", name)
	}
	proc := p.proc(i)
	if proc == nil {
		return fmt.Errorf("container %q not started", name)
	}
	return proc.Signal(sig)
}

// Delete deletes the pod as the kubelet does: for every running container
// at once, its preStop hook, then SIGTERM, then SIGKILL at the end of the
// grace period. It returns when every container has stopped.
func (p *Pod) Delete(ctx context.Context) Status {
	// The running set is read with the flag set, under one lock: a
	// container that starts after this sees the flag (supervise).
	p.mu.Lock()
	p.deleting = true
	var running []int
	for i := range p.status {
		if p.status[i].Running {
			running = append(running, i)
		}
	}
	p.mu.Unlock()
	grace := p.Spec.TerminationGracePeriod
	deadline := time.Now().Add(grace)
	var wg sync.WaitGroup
	for _, i := range running {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := &p.Spec.Containers[i]
			if len(c.PreStop) > 0 {
				hctx, cancel := context.WithDeadline(ctx, deadline)
				out, err := p.Backend.Exec(hctx, p, c, p.attempt(i), c.PreStop)
				cancel()
				p.logs[i].Write(hookLog("preStop", out))
				if err != nil {
					p.logs[i].Write([]byte(fmt.Sprintf("[preStop failed: %v]\n", err)))
				}
			}
			if proc := p.proc(i); proc != nil {
				proc.Signal(syscall.SIGTERM)
			}
		}(i)
	}
	wg.Wait()
	kill := time.NewTimer(time.Until(deadline))
	defer kill.Stop()
	stopped := make(chan struct{})
	go func() { p.WaitFor(context.Background(), noneRunning); close(stopped) }()
	select {
	case <-stopped:
	case <-kill.C:
		for i := range p.Spec.Containers {
			if proc := p.proc(i); proc != nil && p.running(i) {
				proc.Signal(syscall.SIGKILL)
				proc.KillAll()
			}
		}
		<-stopped
	case <-ctx.Done():
	}
	return p.Status()
}

func noneRunning(s Status) bool {
	for _, c := range s.Containers {
		if c.Running {
			return false
		}
	}
	return true
}

// Logs returns everything the container has written so far, across
// restarts.
func (p *Pod) Logs(name string) string {
	i := p.index(name)
	if i < 0 {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.initLogs {
			if l.name == name {
				return l.String()
			}
		}
		return ""
	}
	return p.logs[i].String()
}

// Describe is the pod's status and every container's logs, for a failing
// test to print.
func (p *Pod) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s (%s backend): %s\n", p.Spec.Name, p.Backend.Name(), p.Status())
	p.mu.Lock()
	initErr := p.initErr
	p.mu.Unlock()
	if initErr != nil {
		fmt.Fprintf(&b, "--- %v\n", initErr)
	}
	for _, c := range p.Spec.InitContainers {
		fmt.Fprintf(&b, "--- init container %s logs:\n%s", c.Name, p.Logs(c.Name))
	}
	for _, c := range p.Spec.Containers {
		fmt.Fprintf(&b, "--- %s logs:\n%s", c.Name, p.Logs(c.Name))
		if m := p.TerminationMessage(c.Name); m != "" {
			fmt.Fprintf(&b, "--- %s termination message: %s\n", c.Name, m)
		}
	}
	if d, ok := p.Backend.(Describer); ok {
		fmt.Fprintf(&b, "--- %s backend:\n%s", p.Backend.Name(), d.Describe(p))
	}
	return b.String()
}

// Describer is a Backend that can tell more about a pod's containers (its
// runtime's view, the processes' states) for Describe.
type Describer interface {
	Describe(p *Pod) string
}

// Close kills whatever still runs and removes the pod. Safe to call twice.
func (p *Pod) Close() error {
	p.mu.Lock()
	p.deleting = true
	p.mu.Unlock()
	for i := range p.Spec.Containers {
		if proc := p.proc(i); proc != nil {
			proc.KillAll()
		}
	}
	err := p.Backend.Teardown(p)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		err = errors.Join(err, errors.New("containers still running 30s after teardown"))
	}
	p.cancel()
	os.RemoveAll(p.Dir)
	return err
}

// hookLog is a hook's output as it goes into the container's log: prefixed,
// and ended with a newline so that the container's next line stays apart.
func hookLog(hook string, out []byte) []byte {
	b := append([]byte("["+hook+"] "), out...)
	if !bytes.HasSuffix(b, []byte("\n")) {
		b = append(b, '\n')
	}
	return b
}

// logBuffer keeps a container's output and streams it, line-prefixed.
type logBuffer struct {
	name   string
	stream io.Writer
	mu     sync.Mutex
	buf    bytes.Buffer
	line   []byte
}

func (l *logBuffer) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(b)
	if l.stream != nil {
		l.line = append(l.line, b...)
		for {
			i := bytes.IndexByte(l.line, '\n')
			if i < 0 {
				break
			}
			fmt.Fprintf(l.stream, "%-18s| %s\n", l.name, l.line[:i])
			l.line = l.line[i+1:]
		}
	}
	return len(b), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
