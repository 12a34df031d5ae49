package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"golang.org/x/sys/unix"
)

// signalRate is the signal ping-pong's outcome for one method.
type signalRate struct {
	rate sample // signals per second, one value per round
	// cpuPerSignal and switchesPerSignal are the supervisor's CPU time and
	// context switches during the window, per signal.
	cpuPerSignal      sample
	switchesPerSignal sample
	lastErr           error
}

// signalRates measures how many signals per second reach an app that
// acknowledges each one (SIGUSR1 sent with kill(2) to its main process,
// one byte back through a FIFO, then the next), with the supervisor
// watching it through a pidfd (untouched) or tracing it (every signal to
// the traced thread is a signal-delivery-stop the tracer must resume).
// Each round starts a fresh pod per method.
func signalRates(ctx context.Context, e env, rounds int, window time.Duration) map[method]*signalRate {
	out := map[method]*signalRate{pidfd: {}, ptrace: {}}
	for i := 0; i < rounds; i++ {
		order := []method{pidfd, ptrace}
		if i%2 == 1 { // alternate which goes first
			order = []method{ptrace, pidfd}
		}
		for _, m := range order {
			rate, cpu, sw, err := pingPong(ctx, e, m, window)
			if err != nil {
				log.Printf("signals %s round %d: %v", m, i, err)
				out[m].lastErr = err
				continue
			}
			out[m].rate = append(out[m].rate, rate)
			out[m].cpuPerSignal = append(out[m].cpuPerSignal, cpu)
			out[m].switchesPerSignal = append(out[m].switchesPerSignal, sw)
		}
	}
	return out
}

func pingPong(ctx context.Context, e env, m method, window time.Duration) (rate, cpuPerSignal, switchesPerSignal float64, err error) {
	bp, err := startPod(ctx, e, podOpts{method: m, ack: true})
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() {
		bp.end(ctx)
		bp.Close()
	}()
	if err := bp.waitReady(ctx); err != nil {
		return 0, 0, 0, err
	}
	app, err := bp.pid(appName(0))
	if err != nil {
		return 0, 0, 0, err
	}
	sup, err := bp.pid("supervisor")
	if err != nil {
		return 0, 0, 0, err
	}
	fd, err := unix.Open(bp.ack, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, 0, err
	}
	defer unix.Close(fd)
	one := func() error {
		if err := unix.Kill(app, unix.SIGUSR1); err != nil {
			return err
		}
		for {
			// A bound, in case an acknowledgement is ever lost.
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("no acknowledgement within 5s")
			}
			break
		}
		var b [1]byte
		_, err := unix.Read(fd, b[:])
		return err
	}
	// Warm up: the app's signal goroutine, the tracer's path.
	for i := 0; i < 200; i++ {
		if err := one(); err != nil {
			return 0, 0, 0, err
		}
	}
	u0, err := readUsage(sup)
	if err != nil {
		return 0, 0, 0, err
	}
	n := 0
	start := time.Now()
	for time.Since(start) < window {
		if err := one(); err != nil {
			return 0, 0, 0, err
		}
		n++
	}
	elapsed := time.Since(start)
	u1, err := readUsage(sup)
	if err != nil {
		return 0, 0, 0, err
	}
	d := u1.sub(u0)
	return float64(n) / elapsed.Seconds(), float64(d.cpuNS) / float64(n), float64(d.switches) / float64(n), nil
}
