package main

import (
	"context"
	"fmt"
	"log"
	"time"
)

// idleCost is what a watcher costs while it waits for a running app.
type idleCost struct {
	mem     memory // at the end of the window
	use     usage  // over the window
	window  time.Duration
	threads int
	sleeps  string // where its threads sleep, at the end
	err     error
}

func (c idleCost) perMinute(x uint64) float64 {
	return float64(x) * float64(time.Minute) / float64(c.window)
}

// settle is how long a watcher is left alone after it is ready before the
// window opens: start-up work (the Go runtime's first GC cycles, log
// flushing) is not idling.
const settle = 3 * time.Second

// footprints runs one pod per method at once, each with an app that runs
// until the end, and measures each watcher process over the same window:
// the supervisor, the poller, and for the seed the wrapping shell.
func footprints(ctx context.Context, e env, window time.Duration) map[method]idleCost {
	out := map[method]idleCost{}
	pods := map[method]*benchPod{}
	defer func() {
		for _, bp := range pods {
			bp.end(ctx)
			bp.Close()
		}
	}()
	for _, m := range methods {
		bp, err := startPod(ctx, e, podOpts{method: m})
		if err != nil {
			out[m] = idleCost{err: err}
			continue
		}
		pods[m] = bp
	}
	pids := map[method]int{}
	before := map[method]usage{}
	for m, bp := range pods {
		err := bp.waitReady(ctx)
		if err == nil {
			pids[m], err = bp.pid(m.watcher())
		}
		if err != nil {
			out[m] = idleCost{err: err}
			delete(pids, m)
		}
	}
	time.Sleep(settle)
	for m, pid := range pids {
		u, err := readUsage(pid)
		if err != nil {
			out[m] = idleCost{err: err}
			delete(pids, m)
			continue
		}
		before[m] = u
	}
	log.Printf("footprint: idle window of %s", window)
	start := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return out
	}
	elapsed := time.Since(start)
	for m, pid := range pids {
		u, err := readUsage(pid)
		if err != nil {
			out[m] = idleCost{err: err}
			continue
		}
		mem, err := readMemory(pid)
		if err != nil {
			out[m] = idleCost{err: err}
			continue
		}
		d := u.sub(before[m])
		out[m] = idleCost{mem: mem, use: d, window: elapsed, threads: u.threads, sleeps: sleepingIn(pid)}
		if st := pods[m].Status(); st.Phase != "Running" {
			out[m] = idleCost{err: fmt.Errorf("pod no longer running: %s", st)}
		}
	}
	return out
}
