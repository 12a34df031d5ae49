package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// The ready file: a supervisor writes it in SUPERVISOR_STATE_DIR once its
// first scan of the pod is done, and removes it as it starts. Two hooks
// of the kubelet read it, each a command exec'd in the supervisor's
// container (with its environment, in the pod's PID namespace):
//
//   - the native shape's startup probe, `sidecar-supervisor ready`: the
//     kubelet starts the next container only once it passes;
//   - the container shape's postStart hook, `sidecar-supervisor wait`,
//     where the supervisor comes before the apps: the kubelet runs it
//     once it has started the supervisor, and starts the next container
//     (the first app) only when it returns. It returns once the file is
//     there, or after WaitLimit, and always exits 0: a hook that fails has
//     the kubelet kill the supervisor, and under restartPolicy Never that
//     is the hang the supervisor exists to remove. Past the bound the apps
//     start as they would without the hook: never worse than none.
//
// Either way no app starts before the supervisor watches, however loaded
// the node. Watching is not seeing: an app of milliseconds is adopted
// from its runtime's init on (look.go, every 2 ms) whenever the
// supervisor gets the CPU once in that app's life; one that runs wholly
// while the supervisor is kept off the CPU (a node loaded enough, a vCPU
// stolen) is missed, counted unknown after APP_START_TIMEOUT. The hook
// makes that rare (docs/performance.md has the figures), not impossible.
//
// The file names the process that wrote it, its PID and start time (clock
// ticks since boot, /proc/PID/stat), and counts only while that process
// runs: a supervisor that dies and is restarted leaves its file behind,
// and the new one's hooks must not pass on it before its own first scan.
// Its PID is then gone, or another process's with another start time.
const readyFile = "ready"

// WaitLimit bounds `sidecar-supervisor wait`: a first scan takes
// milliseconds (281 ms at most seen on a loaded node); a supervisor that
// has not made it by then is not coming (bad settings, a read-only state
// directory), and the apps go on without it.
const WaitLimit = 30 * time.Second

// waitPoll is how often `wait` looks for the file: what it adds to the
// first app's start.
const waitPoll = 5 * time.Millisecond

// procRoot is where Ready reads the writer's start time.
const procRoot = "/proc"

// ready writes the ready file in dir, naming this process, or removes it
// (at the start). The file is written whole and renamed into place, so a
// hook never reads half of it.
func ready(dir string, on bool) error {
	p := filepath.Join(dir, readyFile)
	if !on {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return err
	}
	return writeProcess(p, pid, start)
}

// writeProcess writes path naming a process, its PID and start time
// (the ready file, the hook's mark: hooked.go), whole: written aside and
// renamed into place, so a reader never reads half of it.
func writeProcess(path string, pid int, start uint64) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", pid, start), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readProcess reads the process a file of writeProcess names; what says
// which file it is, for the error.
func readProcess(path, what string) (pid int, start uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		pid, err = strconv.Atoi(f[0])
		if err == nil {
			start, err = strconv.ParseUint(f[1], 10, 64)
		}
	}
	if len(f) != 2 || err != nil || pid <= 0 {
		return 0, 0, fmt.Errorf("%s holds %q, not a supervisor's PID and start time", what, b)
	}
	return pid, start, nil
}

func startTime(pid int) (uint64, error) {
	s, err := procscan.NewScanner(procRoot)
	if err != nil {
		return 0, err
	}
	return s.StartTime(pid)
}

// Ready reports whether the supervisor whose state directory is dir has
// made its first scan of the pod (`sidecar-supervisor ready`).
func Ready(dir string) error {
	if dir == "" {
		return errors.New("no usable " + EnvPrefix + "STATE_DIR (unset, or a bad value the supervisor's log names): no ready file is kept")
	}
	pid, start, err := readProcess(filepath.Join(dir, readyFile), "the ready file")
	if err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	now, err := startTime(pid)
	if err != nil || now != start {
		return fmt.Errorf("not ready: the ready file is an earlier supervisor's (PID %d, which runs no more)", pid)
	}
	return nil
}

// ReadyProbe is the native shape's startup probe, `sidecar-supervisor
// ready`, for a supervisor run with cfg (LoadConfig's, from the same
// environment, so the probe and the run agree on the directory). It passes
// (nil) once the supervisor's first scan is done (Ready); and also, with
// why in note, where the ready file will not come: a startup probe that
// keeps failing holds the pod before its apps for good (the kubelet
// restarts the container, and probes again), the hang the supervisor
// exists to remove. The file will not come where the run keeps none (no
// usable SUPERVISOR_STATE_DIR: the run logs it as a bad setting), or where
// the supervisor has run WaitLimit without writing it (a directory it
// cannot write, said in its log), the bound the container shape's wait
// hook has. Past either, the apps start as they would without the probe.
// up says how long the supervisor has run (Uptime).
func ReadyProbe(cfg *Config, up func() (time.Duration, error)) (note string, err error) {
	if cfg.Shape != ShapeNative || cfg.StateDir == "" {
		return "the supervisor runs without a ready file (its log says why): ready without it", nil
	}
	if err = Ready(cfg.StateDir); err == nil {
		return "", nil
	}
	if d, uerr := up(); uerr == nil && d >= WaitLimit {
		return fmt.Sprintf("%v, with the supervisor up %s: ready without it, as without the probe", err, d.Round(time.Second)), nil
	}
	return "", err
}

// Uptime is how long the main process of the caller's container has run,
// by the kernel's clock: the supervisor's, for a probe the kubelet execs
// in its container. The main process is the container's oldest whose
// parent is outside the pod's PID namespace (procscan.Container.Main).
func Uptime() (time.Duration, error) {
	m, err := OwnMain()
	if err != nil {
		return 0, err
	}
	return procscan.Age(m)
}

// OwnMain is the main process of the caller's container (see Uptime).
func OwnMain() (procscan.Process, error) {
	s, err := procscan.NewScanner(procRoot)
	if err != nil {
		return procscan.Process{}, err
	}
	self, err := s.Self()
	if err != nil {
		return procscan.Process{}, err
	}
	pod, err := s.Scan(self, procscan.Rules{})
	if err != nil {
		return procscan.Process{}, err
	}
	for _, c := range pod.Of(procscan.Self) {
		if c.HasMain {
			return c.Main, nil
		}
	}
	return procscan.Process{}, errors.New("this container has no main process in the PID namespace")
}

// WaitReady returns once Ready(dir) passes, or with its last error after
// limit or once ctx is done. Without a state directory it returns at once.
func WaitReady(ctx context.Context, dir string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	for {
		err := Ready(dir)
		if err == nil || dir == "" {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}
