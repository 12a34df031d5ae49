package main

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// stopLatency is one method's exit-to-stop measurements.
type stopLatency struct {
	// fromReap: pilot-agent's receipt of SIGTERM minus the moment the pod
	// harness's wait for the (last) app returned. Not for the seed, whose
	// app is reaped by its shell.
	fromReap sample
	// fromExit: the same, minus the app's own last clock reading before
	// exit_group.
	fromExit sample
	// watcherCPU is the supervisor's CPU time from its start until it
	// watched every app (pod-level scale runs only).
	watcherCPU sample
	// watching is its wall time from the "starting" log line to the last
	// "app found" one (millisecond log timestamps; scale runs only).
	watching sample
	failed   int
	lastErr  error
}

func (s *stopLatency) add(r latencyRun, err error) {
	if err != nil {
		s.failed++
		s.lastErr = err
		return
	}
	if !r.reap.IsZero() {
		s.fromReap = append(s.fromReap, float64(r.signal.Sub(r.reap)))
	}
	s.fromExit = append(s.fromExit, float64(r.signal.Sub(r.exit)))
	if r.cpu > 0 {
		s.watcherCPU = append(s.watcherCPU, float64(r.cpu))
	}
	if r.watching > 0 {
		s.watching = append(s.watching, float64(r.watching))
	}
}

// latencyRun is one pod's clock readings (CLOCK_REALTIME, all on this
// host).
type latencyRun struct {
	exit   time.Time // the last app's stamp right before exit_group
	reap   time.Time // the harness's wait for the last app returned (zero for the seed)
	signal time.Time // pilot-agent received SIGTERM
	// cpu and watching: see stopLatency (supervisor only).
	cpu      time.Duration
	watching time.Duration
}

// runOnce starts a pod, waits until its watcher watches, ends the apps
// and reads the clocks.
func runOnce(ctx context.Context, e env, o podOpts) (latencyRun, error) {
	var r latencyRun
	bp, err := startPod(ctx, e, o)
	if err != nil {
		return r, err
	}
	defer bp.Close()
	if err := bp.waitReady(ctx); err != nil {
		return r, fmt.Errorf("%w\n%s", err, bp.Describe())
	}
	if o.method.supervisor() {
		// Discovery is over: what it cost until now.
		pid, err := bp.pid("supervisor")
		if err != nil {
			return r, err
		}
		u, err := readUsage(pid)
		if err != nil {
			return r, err
		}
		r.cpu = time.Duration(u.cpuNS)
		r.watching, _ = watchingTime(bp.Logs("supervisor"))
	}
	if o.method == poll1s || o.method == poll50ms {
		iv := o.method.pollInterval()
		// An app ends at any moment of a poller's cycle, not just after
		// the poller's first look (when the pod is ready): without this
		// every run would wait a whole interval.
		time.Sleep(time.Duration(rand.Int64N(int64(iv))))
	}
	_, st, err := bp.end(ctx)
	if err != nil {
		return r, fmt.Errorf("%w\n%s", err, bp.Describe())
	}
	for i := 0; i < o.nApps(); i++ {
		if c := st.Container(appName(i)); c.ExitCode != 0 {
			return r, fmt.Errorf("%s exited %d\n%s", appName(i), c.ExitCode, bp.Describe())
		}
		t, err := stamp(bp.appStamps(i), "exit")
		if err != nil {
			return r, err
		}
		if t.After(r.exit) {
			r.exit = t
		}
		if o.method == seed {
			continue
		}
		t, err = bp.reaped(appName(i))
		if err != nil {
			return r, err
		}
		if t.After(r.reap) {
			r.reap = t
		}
	}
	if c := st.Container(o.method.watcher()); c.ExitCode != 0 {
		return r, fmt.Errorf("%s exited %d\n%s", o.method.watcher(), c.ExitCode, bp.Describe())
	}
	r.signal, err = stamp(bp.pilotStamps(), "signal SIGTERM")
	if err != nil {
		return r, fmt.Errorf("%w\n%s", err, bp.Describe())
	}
	return r, nil
}

// watchingTime is the time from the supervisor's "starting" log line to
// its last "app found" one.
func watchingTime(logs string) (time.Duration, error) {
	var start, found time.Time
	lines, _ := measure.ParseLog(logs)
	for _, l := range lines {
		switch l.Message {
		case "starting":
			start = l.At
		case "app found":
			found = l.At
		}
	}
	if start.IsZero() || found.IsZero() {
		return 0, fmt.Errorf("no starting or app found line")
	}
	return found.Sub(start), nil
}

// latencies runs every method runs times (the 1 s poller slowRuns times),
// round-robin, the order rotating each round so that no method always
// follows the same one.
func latencies(ctx context.Context, e env, runs, slowRuns int) map[method]*stopLatency {
	out := map[method]*stopLatency{}
	for _, m := range methods {
		out[m] = &stopLatency{}
	}
	start := time.Now()
	for i := 0; i < max(runs, slowRuns); i++ {
		for j := range methods {
			m := methods[(i+j)%len(methods)]
			if (m == poll1s && i >= slowRuns) || (m != poll1s && i >= runs) {
				continue
			}
			r, err := runOnce(ctx, e, podOpts{method: m})
			out[m].add(r, err)
			if err != nil {
				log.Printf("latency %s run %d: %v", m, i, err)
			}
		}
		if (i+1)%10 == 0 {
			log.Printf("latency: %d rounds in %s", i+1, time.Since(start).Round(time.Second))
		}
	}
	return out
}
