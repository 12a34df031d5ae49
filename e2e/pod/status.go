package pod

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

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
	// Native and Ephemeral (StartEphemeral) containers are left out of the
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

// Status returns the pod's status now.
func (p *Pod) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
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

// WaitFor waits until cond holds for the pod's status, or ctx ends; the
// error then carries the last status.
func (p *Pod) WaitFor(ctx context.Context, cond func(Status) bool) (Status, error) {
	var st Status
	err := p.Await(ctx, func() bool { st = p.Status(); return cond(st) })
	return st, err
}

// Await waits until cond holds, or ctx ends. It checks cond at once, then
// at each change of the pod's status, each write to a container's log (a
// condition on Logs holds as soon as the line is there) and the start of
// the pod's deletion: an event, never a poll.
func (p *Pod) Await(ctx context.Context, cond func() bool) error {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("pod %s: %w; status: %s", p.Spec.Name, ctx.Err(), p.Status())
		}
	}
}

// WaitPhase waits for a terminal phase (Succeeded or Failed).
func (p *Pod) WaitPhase(ctx context.Context) (Status, error) {
	return p.WaitFor(ctx, func(s Status) bool { return s.Phase == Succeeded || s.Phase == Failed })
}

// MustWaitPhase is WaitPhase for a test, bounded by within (a hang guard):
// it fails the test if the pod has not ended by then.
func (p *Pod) MustWaitPhase(t testing.TB, within time.Duration) Status {
	t.Helper()
	return p.MustWaitFor(t, within, func(s Status) bool { return s.Phase == Succeeded || s.Phase == Failed })
}

// MustWaitFor is WaitFor for a test, bounded by within (a hang guard): the
// status once cond holds; it fails the test if cond has not held by then.
func (p *Pod) MustWaitFor(t testing.TB, within time.Duration, cond func(Status) bool) Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	st, err := p.WaitFor(ctx, cond)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// WaitRunning waits until the named container runs (attempt >= restarts).
func (p *Pod) WaitRunning(ctx context.Context, name string, restarts int) (ContainerStatus, error) {
	st, err := p.WaitFor(ctx, func(s Status) bool {
		c := s.Container(name)
		return c.Running && c.Restarts >= restarts
	})
	return st.Container(name), err
}

// Ended is the condition, for WaitFor, that every named container has
// started and is no longer running.
func Ended(names ...string) func(Status) bool {
	return func(s Status) bool {
		for _, n := range names {
			if c := s.Container(n); !c.Started || c.Running {
				return false
			}
		}
		return true
	}
}

// When is a Container.StartAfter that returns once cond holds for the
// pod's status.
func When(cond func(Status) bool) func(context.Context, *Pod) error {
	return func(ctx context.Context, p *Pod) error {
		_, err := p.WaitFor(ctx, cond)
		return err
	}
}

func noneRunning(s Status) bool {
	return !slices.ContainsFunc(s.Containers, func(c ContainerStatus) bool { return c.Running })
}
