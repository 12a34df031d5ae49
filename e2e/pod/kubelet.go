package pod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// run is the kubelet's part: containers in order, postStart hooks between.
func (p *Pod) run(ctx context.Context) {
	defer close(p.done)
	if err := p.runInits(ctx); err != nil {
		p.mu.Lock()
		p.initErr = err
		p.notifyLocked()
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
		if len(c.StartupProbe) > 0 && p.running(i) {
			p.probeStartup(ctx, i, c.StartupProbe)
		}
		if len(c.PostStart) > 0 && p.running(i) {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := p.hook(hctx, i, "postStart", c.PostStart)
			cancel()
			if err != nil {
				// The kubelet kills a container whose postStart fails.
				if proc := p.proc(i); proc != nil {
					proc.Signal(syscall.SIGKILL)
				}
			}
		}
	}
	p.wg.Wait()
}

// probeStartup runs container i's startup probe until it passes, the
// container stops, or 2 minutes have passed; its last output (and its
// failure, if it never passed) goes to the container's log.
func (p *Pod) probeStartup(ctx context.Context, i int, argv []string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := p.Backend.Exec(ctx, p, &p.Spec.Containers[i], p.attempt(i), argv)
		if err == nil || ctx.Err() != nil || !p.running(i) {
			p.logHook(i, "startupProbe", out, err)
			return
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// runInits runs the init containers in order, each to completion; their
// output goes to Logs under their names.
func (p *Pod) runInits(ctx context.Context) error {
	for i := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[i]
		log := &logBuffer{name: c.Name, stream: p.Spec.Log, written: p.notify}
		p.mu.Lock()
		p.initLogs = append(p.initLogs, log)
		p.mu.Unlock()
		proc, r, err := p.startAttempt(ctx, c, 0)
		if err != nil {
			return fmt.Errorf("init container %s: %w", c.Name, err)
		}
		code, _ := end(proc, copyLog(r, log), log)
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
	if !p.awaitStart(ctx, i) {
		return
	}
	for attempt := 0; ; attempt++ {
		proc, r, err := p.startAttempt(ctx, c, attempt)
		if err != nil {
			p.failStart(i, "start failed", err)
			return
		}
		p.mu.Lock()
		p.procs[i], p.attempts[i] = proc, attempt
		p.mu.Unlock()
		now := time.Now()
		deleting := false
		p.update(i, func(s *ContainerStatus) {
			s.Started, s.Running, s.PID, s.Restarts, s.StartedAt = true, true, proc.PID(), attempt, now
			deleting = p.deleting // under p.mu, as Delete reads the running set
		})
		// Its output is read only now (the pipe holds it meanwhile): a
		// container's log line is seen only once its status says it runs,
		// with its PID, as kubectl logs has nothing of a container not
		// started (TestLogMeansRunning).
		copied := copyLog(r, p.logs[i])
		if deleting {
			// Delete began while this container was starting and did not
			// count it as running: it gets its SIGTERM now, as the kubelet
			// stops a container that comes up during a deletion.
			proc.Signal(syscall.SIGTERM)
		}
		once()
		code, sig := end(proc, copied, p.logs[i])
		p.update(i, func(s *ContainerStatus) { s.Running, s.ExitCode, s.Signal, s.PID = false, code, sig, 0 })
		restart := false
		switch {
		case c.Ephemeral:
		case c.Native:
			restart = !locked(p, func() bool { return p.stoppingNative })
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

// awaitStart holds container i's first start back until its StartAfter
// returns, and reports whether it is to start: not once the pod is being
// deleted, nor when StartAfter failed (a failed start, then).
func (p *Pod) awaitStart(ctx context.Context, i int) bool {
	c := &p.Spec.Containers[i]
	if c.StartAfter == nil {
		return true
	}
	// The deletion's start ends the wait, as it ends an image pull.
	gctx, cancel := p.untilDeleted(ctx)
	defer cancel()
	err := c.StartAfter(gctx, p)
	if p.isDeleting() || ctx.Err() != nil {
		return false
	}
	if err != nil {
		p.failStart(i, "start held back", err)
		return false
	}
	return true
}

// failStart records a start that failed: exit code 128, and why in the
// container's log.
func (p *Pod) failStart(i int, what string, err error) {
	p.logs[i].Write(fmt.Appendf(nil, "[%s: %v]\n", what, err))
	p.update(i, func(s *ContainerStatus) { s.Started, s.Running, s.ExitCode = true, false, 128 })
}

// startAttempt starts an attempt of c; its output waits in the returned
// pipe until copyLog.
func (p *Pod) startAttempt(ctx context.Context, c *Container, attempt int) (Process, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	proc, err := p.Backend.Start(ctx, p, c, attempt, w)
	w.Close()
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return proc, r, nil
}

// copyLog copies r into log in the background, until r's end (copied).
func copyLog(r *os.File, log *logBuffer) (copied <-chan struct{}) {
	done := make(chan struct{})
	go func() { io.Copy(log, r); r.Close(); close(done) }()
	return done
}

// logCopyBound bounds the wait for the rest of a container's output once
// its main process has exited and the rest of its cgroup is killed. Nothing
// of the container holds the pipe then: the copy ends as soon as the killed
// processes are gone, however long that takes on a loaded machine. The
// bound is for a process that escaped the container; the log says so then,
// rather than lose its end quietly.
const logCopyBound = time.Minute

// end waits for a container's main process to exit, then kills what it
// left behind in its container, as a shim with a shared PID namespace
// does, and waits until everything the container wrote is in its log:
// it reads as terminated only then (kubectl logs has it all then).
func end(proc Process, copied <-chan struct{}, log *logBuffer) (int, syscall.Signal) {
	code, sig := proc.Wait()
	proc.KillAll()
	t := time.NewTimer(logCopyBound)
	defer t.Stop()
	select {
	case <-copied:
	case <-t.C:
		log.Write(fmt.Appendf(nil, "[log truncated: its pipe is still held %s after the container ended]\n", logCopyBound))
	}
	return code, sig
}

// untilDeleted is ctx, ended also by the start of the pod's deletion.
func (p *Pod) untilDeleted(ctx context.Context) (context.Context, context.CancelFunc) {
	dctx, cancel := context.WithCancel(ctx)
	go func() {
		p.Await(dctx, p.isDeleting)
		cancel()
	}()
	return dctx, cancel
}

func (p *Pod) update(i int, f func(*ContainerStatus)) {
	p.mu.Lock()
	f(&p.status[i])
	p.notifyLocked()
	p.mu.Unlock()
}

// notifyLocked wakes every waiter (WaitFor, Await); p.mu is held.
func (p *Pod) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// notify is notifyLocked for a log's writer.
func (p *Pod) notify() {
	p.mu.Lock()
	p.notifyLocked()
	p.mu.Unlock()
}

// locked is f's result, read under p.mu.
func locked[T any](p *Pod, f func() T) T {
	p.mu.Lock()
	defer p.mu.Unlock()
	return f()
}

func (p *Pod) isDeleting() bool   { return locked(p, func() bool { return p.deleting }) }
func (p *Pod) running(i int) bool { return locked(p, func() bool { return p.status[i].Running }) }
func (p *Pod) proc(i int) Process { return locked(p, func() Process { return p.procs[i] }) }
func (p *Pod) attempt(i int) int  { return locked(p, func() int { return p.attempts[i] }) }

// Process is container name's process, the last one started; nil if none.
func (p *Pod) Process(name string) Process {
	if i := p.index(name); i >= 0 {
		return p.proc(i)
	}
	return nil
}

func (p *Pod) index(name string) int {
	for i, c := range p.Spec.Containers {
		if c.Name == name {
			return i
		}
	}
	return -1
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
	proc := p.Process(name)
	if proc == nil {
		return fmt.Errorf("no container %q started", name)
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
	p.notifyLocked() // a container held back by StartAfter starts no more
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
				p.hook(hctx, i, "preStop", c.PreStop)
				cancel()
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

// Close kills whatever still runs and removes the pod. Safe to call twice.
func (p *Pod) Close() error {
	p.mu.Lock()
	p.deleting = true
	p.notifyLocked()
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
