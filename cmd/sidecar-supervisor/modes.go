// The modes other than the supervisor's run: the hooks the kubelet runs
// in the supervisor's and the sidecar's containers (wait, hold), and the
// status a person asks for with kubectl exec.

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// wait is the container shape's postStart hook: it holds the kubelet's
// start of the apps until the supervisor's first scan is done, for
// supervisor.WaitLimit at most, and exits 0 whatever happens (a hook that
// fails has the kubelet kill the supervisor). What it prints goes to the
// kubelet, which shows a hook's output only in the event of one that
// failed.
//
// It marks its start and its return in the state directory, the latter
// naming the supervisor it served, which does not exit before it
// (supervisor.AwaitHook): the kubelet takes a hook ended by its
// container's end for a failed start.
func wait(dir string, stderr io.Writer) int {
	start := time.Now()
	if err := supervisor.HookStarted(dir); err != nil {
		fmt.Fprintf(stderr, "sidecar-supervisor wait: cannot mark the hook's start: %v\n", err)
	}
	defer func() {
		main, err := supervisor.OwnMain()
		if err == nil {
			err = supervisor.HookReturned(dir, main)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sidecar-supervisor wait: cannot mark the hook's return: %v\n", err)
		}
	}()
	if err := supervisor.WaitReady(context.Background(), dir, supervisor.WaitLimit); err != nil {
		fmt.Fprintf(stderr, "sidecar-supervisor wait: %v; the kubelet starts the apps after %s without it\n",
			err, time.Since(start).Round(time.Millisecond))
		return exitOK
	}
	fmt.Fprintf(stderr, "sidecar-supervisor wait: the supervisor watches, after %s\n", time.Since(start).Round(time.Millisecond))
	return exitOK
}

// status prints the pod as the supervisor sees it with its settings (the
// container's environment, which kubectl exec passes on), and the running
// supervisor's progress from its termination-message file.
func status(environ []string, stdout, stderr io.Writer) int {
	cfg, _, err := supervisor.LoadConfig(environ)
	for _, e := range flatten(err) {
		fmt.Fprintf(stderr, "sidecar-supervisor status: bad setting: %v\n", e)
	}
	scan, _, err := openScanner(cfg)
	if err == nil {
		var pod procscan.Pod
		if pod, err = scan.Scan(); err == nil {
			if !pod.Outside() {
				fmt.Fprintln(stderr, "sidecar-supervisor status: "+supervisor.ErrNotShared.Error())
				return exitCannotRun
			}
			msg, _ := os.ReadFile(cfg.TerminationMessagePath)
			err = supervisor.WriteStatus(stdout, pod, scan.Named(), string(msg))
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sidecar-supervisor status: %v\n", err)
		return exitCannotRun
	}
	return exitOK
}

// hold is the preStop hook's mode: see supervisor.Hold. bad are the bad
// settings, replaced.
func hold(cfg supervisor.Config, log zerolog.Logger, bad []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The supervisor's own containers (a Job's supervisor) are not apps.
	scan, _, err := openScanner(cfg, supervisor.OwnName)
	if err != nil {
		log.Error().Err(err).Msg("hold: cannot read /proc; not holding")
		return exitCannotRun
	}
	// The hold needs no exit status: pidfds alone, on any kernel.
	watch, _, err := exitwatch.New(exitwatch.Config{Method: exitwatch.None, Setting: supervisor.EnvPrefix + "EXIT_STATUS"})
	if err != nil {
		log.Error().Err(err).Msg("hold: no pidfd support; not holding")
		return exitCannotRun
	}
	defer watch.Close()
	// A preStop hook's output is shown nowhere unless it fails: say what
	// happened in the sidecar's own log too (kubectl logs istio-proxy).
	log = log.Output(io.MultiWriter(logWriter(cfg, os.Stderr), logWriter(cfg, sidecarLog(scan))))
	for _, e := range bad {
		log.Error().Str("error", e).Msg("hold: bad setting, the value named used in its place; fix the setting")
	}
	log.Info().Str("version", version).Str("timeout", cfg.HoldTimeout.String()).Msg("hold: keeping the sidecar up until the apps have exited")
	res, err := supervisor.Hold(ctx, log, scan, watch, cfg.HoldTimeout)
	switch {
	case err != nil && ctx.Err() != nil:
		log.Warn().Msg("hold: interrupted")
	case err != nil:
		log.Error().Err(err).Msg("hold: cannot hold; the sidecar stops now")
		return exitCannotRun
	case res.TimedOut():
		log.Warn().Strs("left", res.Left).Dur("elapsed", res.Elapsed).Msg(res.String())
	default:
		log.Info().Dur("elapsed", res.Elapsed).Msg(res.String())
	}
	return exitOK
}

// sidecarLog opens the stderr of the hook's own container's main process
// (the sidecar), best effort: a process may write to another's fd through
// /proc when it may ptrace-read it (same uid, dumpable).
func sidecarLog(scan *supervisor.ProcScanner) io.Writer {
	pod, err := scan.Scan()
	if err != nil {
		return io.Discard
	}
	for _, c := range pod.Of(procscan.Self) {
		if c.HasMain && c.Main.PID != scan.Self {
			f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", c.Main.PID), os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				return f
			}
		}
	}
	return io.Discard
}
