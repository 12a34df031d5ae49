// Command sidecar-supervisor stops a pod's sidecar once its application
// containers have finished. See the README for how to add it to a pod.
//
//	sidecar-supervisor               supervise (the supervisor container)
//	sidecar-supervisor hold          return once every app container has
//	                                 exited, or after SUPERVISOR_HOLD_TIMEOUT
//	                                 (istio-proxy's preStop hook)
//	sidecar-supervisor install DIR   copy this binary into DIR (an init
//	                                 container filling an emptyDir for hold)
//	sidecar-supervisor status        print the pod as the supervisor sees it,
//	                                 and what the running supervisor is doing
//	                                 (kubectl exec into its container)
//	sidecar-supervisor ready         exit 0 once the running supervisor has
//	                                 made its first scan, else 1 (the native
//	                                 shape's startup probe)
//	sidecar-supervisor wait          return once it has, or after 30 s;
//	                                 always exit 0 (the container shape's
//	                                 postStart hook: the kubelet starts the
//	                                 apps after it)
//	sidecar-supervisor version
//
// Exit codes: 0 done (or the pod is being deleted); 1 cannot work here (no
// shared PID namespace, /proc unreadable, no pidfd support); 2 bad usage. A
// bad setting is logged and replaced (supervisor.LoadConfig), never an exit:
// that would leave the sidecar up and the Job hanging.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// probeExitArg makes the binary exit 7 once its stdin closes: the real
// process the start-up probes watch to learn whether the kernel reports
// exit statuses (pidfd) and whether this process may trace (ptrace).
const probeExitArg = "probe-exit"

const (
	exitOK        = 0
	exitCannotRun = 1
	exitUsage     = 2
)

func main() {
	args := os.Args[1:]
	mode := ""
	if len(args) > 0 {
		mode = args[0]
	}
	switch {
	case mode == probeExitArg && len(args) == 1:
		io.Copy(io.Discard, os.Stdin)
		os.Exit(7)
	case mode == "" || mode == "hold":
		os.Exit(run(mode, os.Environ(), os.Stderr))
	case mode == "install" && len(args) == 2:
		dst, err := supervisor.Install(args[1])
		if err != nil {
			fmt.Fprintf(os.Stderr, "sidecar-supervisor install: %v\n", err)
			os.Exit(exitCannotRun)
		}
		fmt.Fprintf(os.Stderr, "sidecar-supervisor %s installed as %s\n", version, dst)
	case mode == "status" && len(args) == 1:
		os.Exit(status(os.Environ(), os.Stdout, os.Stderr))
	case mode == "ready" && len(args) == 1:
		// The native shape's startup probe: the running supervisor has
		// made its first scan (SUPERVISOR_STATE_DIR's ready file), with
		// the run's own settings (a bad one replaced as the run does).
		cfg, _, _ := supervisor.LoadConfig(os.Environ())
		note, err := supervisor.ReadyProbe(&cfg, supervisor.Uptime)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sidecar-supervisor ready: %v\n", err)
			os.Exit(exitCannotRun)
		}
		if note != "" {
			fmt.Fprintf(os.Stderr, "sidecar-supervisor ready: %s\n", note)
		}
	case mode == "wait" && len(args) == 1:
		cfg, _, _ := supervisor.LoadConfig(os.Environ())
		os.Exit(wait(cfg.StateDir, os.Stderr))
	case mode == "version" && len(args) == 1:
		fmt.Println(version)
	default:
		fmt.Fprintf(os.Stderr, "usage: sidecar-supervisor [hold | install DIR | status | ready | wait | version]\n")
		os.Exit(exitUsage)
	}
}

// run supervises (mode "") or holds. A bad setting does not stop it: the
// value LoadConfig used in its place is logged as an error, and the
// termination message's last line names it. An exit would leave the
// sidecar up and the Job hanging, whatever the fault.
func run(mode string, environ []string, stderr io.Writer) int {
	cfg, unknown, err := supervisor.LoadConfig(environ)
	log := newLogger(cfg, stderr)
	var bad []string
	for _, e := range flatten(err) {
		bad = append(bad, e.Error())
	}
	if mode == "hold" {
		return hold(cfg, log, bad)
	}
	for _, e := range bad {
		log.Error().Str("error", e).Msg("bad setting: the supervisor runs on with the value named in its place, so that the Job still completes; fix the setting")
	}
	for _, name := range unknown {
		log.Warn().Str("variable", name).Msg("unknown setting ignored: a typo, or a setting of a newer version")
	}
	log.Info().Str("version", version).Object("config", cfg).Msg("starting")

	// SIGTERM is the kubelet deleting the pod; SIGINT a person at a terminal.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	err = supervise(ctx, cfg, log, &bad, func(sup *supervisor.Supervisor, res supervisor.Result) {
		summary := res.Summary
		if len(bad) > 0 {
			summary += "\nbad settings, run with others in their place: " + strings.Join(bad, "; ")
		}
		report(log, cfg, summary)
		log.Info().Str("summary", res.Summary).Msg("done")
		if ctx.Err() != nil {
			return
		}
		if cfg.Shape == supervisor.ShapeContainer {
			// Its exit would end its postStart hook, if that still runs
			// (a restart that found the work done): a failed start.
			switch waited, err := supervisor.AwaitHook(ctx, cfg.StateDir, supervisor.Uptime); {
			case err != nil && ctx.Err() == nil:
				log.Warn().Err(err).Msg("exiting without the mark of its postStart hook's return")
			case waited > 0:
				log.Info().Dur("waited", waited).Msg("its postStart hook has returned")
			}
		}
		if cfg.Shape == supervisor.ShapeNative {
			// A native sidecar that exits is started again by the kubelet
			// while the pod runs: it waits to be stopped with the pod's
			// other sidecars, after the regular containers.
			log.Info().Msg("idle until the kubelet stops the pod's sidecars")
		}
		// Stops again a sidecar the kubelet starts again (OnFailure).
		sup.Guard(ctx, res)
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot work here")
		report(log, cfg, "error: "+err.Error())
		return exitCannotRun
	}
	return exitOK
}

// supervise wires the real scanner and kernel into the run loop.
// A forced SUPERVISOR_EXIT_STATUS that cannot work here gives auto's
// choice (exitwatch's Choice.Refused), logged as an error and added to
// bad, the settings the termination message names.
func supervise(ctx context.Context, cfg supervisor.Config, log zerolog.Logger, bad *[]string, then func(*supervisor.Supervisor, supervisor.Result)) error {
	// A standby's container is no app (supervisor/lead.go).
	scan, own, err := openScanner(cfg, supervisor.OwnName)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable for the exit probe: %w", err)
	}
	watch, choice, err := exitwatch.New(exitwatch.Config{
		Method: cfg.ExitStatus, Probe: []string{exe, probeExitArg}, Setting: supervisor.EnvPrefix + "EXIT_STATUS", Dir: cfg.StateDir})
	if err != nil {
		return err
	}
	if choice.Refused != "" {
		log.Error().Str("error", choice.Refused).Str("method", string(choice.Method)).
			Msg("bad setting: the supervisor runs on with auto's method, so that the Job still completes; fix the setting")
		*bad = append(*bad, choice.Refused+" (auto used in its place, which chose "+string(choice.Method)+")")
	}
	defer watch.Close()
	switch {
	case choice.Accounting:
		log.Info().Str("dir", cfg.StateDir).Msg("process accounting on: the end of an app too quick to watch, or ended unread before a restart, is read from the kernel's record of its exit (a failure's status; exit 0 reads unknown)")
	case choice.AccountingFailed:
		log.Warn().Str("reason", choice.AccountingOff).Msg("process accounting cannot work here (CAP_SYS_PACCT is given): a status lost to an app too quick to watch stays unknown")
	}
	switch choice.Method {
	case exitwatch.Pidfd:
		log.Info().Str("method", string(choice.Method)).Msg("exit statuses read with pidfd (PIDFD_INFO_EXIT)")
	case exitwatch.Accounting:
		log.Info().Str("method", string(choice.Method)).Str("reason", choice.Reason).
			Msg("exit statuses read from the kernel's process accounting records")
	case exitwatch.Ptrace:
		log.Info().Str("method", string(choice.Method)).Str("reason", choice.Reason).
			Msg("exit statuses read with ptrace: the apps' main processes are traced, so they cannot be strace'd meanwhile")
	default:
		log.Warn().Str("method", string(choice.Method)).Str("reason", choice.Reason).
			Stringer("on_unknown", cfg.OnUnknown).
			Msg("app exit statuses cannot be read: exits are seen, statuses are unknown and get the on-unknown action")
	}
	logNames(log, own, cfg)
	sup := supervisor.New(cfg, log, scan, watch, nil)
	res, err := sup.Run(ctx)
	if err != nil {
		return err
	}
	then(sup, res)
	return nil
}

// openScanner is the pod as every mode reads it: /proc, the supervisor's
// own PID in it, and the rules that tell its containers apart (ignore adds
// names to SUPERVISOR_IGNORE_PROCESSES). own is the supervisor's own
// container's Kubernetes identity, where the kubelet's mount shows it.
func openScanner(cfg supervisor.Config, ignore ...string) (scan *supervisor.ProcScanner, own procscan.Kube, err error) {
	procs, err := procscan.NewScanner("/proc")
	if err != nil {
		return nil, own, err
	}
	self, err := procs.Self()
	if err != nil {
		return nil, own, err
	}
	rules := procscan.Rules{Sidecar: cfg.SidecarProcesses, Ignore: append(slices.Clip(cfg.IgnoreProcesses), ignore...)}
	scan, own, err = supervisor.NewProcScanner(procs, self, rules, cfg.Apps, cfg.Sidecars)
	if err != nil {
		return nil, own, fmt.Errorf("read /proc: %w", err)
	}
	return scan, own, nil
}

// logNames says once how containers are told apart.
func logNames(log zerolog.Logger, own procscan.Kube, cfg supervisor.Config) {
	if own.Known() {
		log.Info().Str("container", own.Name).Str("pod_uid", own.PodUID).Strs("apps", cfg.Apps).Strs("sidecars", cfg.Sidecars).
			Msg("containers known by their Kubernetes names (the kubelet's termination-message mounts)")
		return
	}
	log.Warn().Strs("sidecar_processes", cfg.SidecarProcesses).
		Msg("container names cannot be read here (no kubelet termination-message mount: another runtime, or a pod built by hand): " +
			"sidecars are told by their main process's name, and every other container is taken for an app")
}

func report(log zerolog.Logger, cfg supervisor.Config, summary string) {
	written, err := supervisor.WriteTerminationMessage(cfg.TerminationMessagePath, summary)
	switch {
	case err != nil:
		log.Warn().Err(err).Str("path", cfg.TerminationMessagePath).Msg("cannot write the termination message")
	case !written:
		log.Debug().Str("path", cfg.TerminationMessagePath).Msg("no termination message file: not written")
	}
}

func newLogger(cfg supervisor.Config, w io.Writer) zerolog.Logger {
	// Durations as seconds ("elapsed":5.012), times to the millisecond: the
	// log is read as a timeline.
	zerolog.DurationFieldUnit = time.Second
	zerolog.FloatingPointPrecision = 3
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	return zerolog.New(logWriter(cfg, w)).Level(cfg.LogLevel).With().Timestamp().Logger()
}

func logWriter(cfg supervisor.Config, w io.Writer) io.Writer {
	if cfg.LogFormat == "console" {
		return zerolog.ConsoleWriter{Out: w, NoColor: true, TimeFormat: "15:04:05.000"}
	}
	return w
}

// flatten lists the errors joined in err, one per bad setting; none for nil.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}
