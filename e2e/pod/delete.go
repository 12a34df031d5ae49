package pod

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"
)

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
