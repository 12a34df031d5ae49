package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// A supervisor of the container shape placed before the apps has the
// postStart hook `sidecar-supervisor wait`, which the kubelet runs on each
// start of the container, the restarts too. Should the supervisor exit
// before its hook has returned, the runtime ends the hook with the
// container's main process (exit 137), and the kubelet takes that for a
// failed start: it kills the container and counts a restart, against the
// Job's backoffLimit under OnFailure. Seen on the cluster: a killed
// supervisor restarted near the pod's end finds the work done (by a
// standby, lead.go, or by itself before the kill) and exits within
// milliseconds, before the kubelet's exec of the hook has even started.
//
// So the hook leaves two marks in the state directory: hookFile as it
// starts (the pod's supervisors have hooks: the first start of each runs
// its hook before any app starts, so a supervisor can only miss its own
// hook's mark on a restart), and, as it returns, hookedPrefix+PID naming
// the main process of its container (the supervisor it served) with its
// start time. A supervisor about to exit where hookFile is there waits for
// its own mark, at most until WaitLimit (the hook's own bound) after its
// start.
const (
	hookFile     = "hook"
	hookedPrefix = "hooked-"
)

// HookStarted marks, in dir, that the supervisors of this pod have a
// postStart hook (`sidecar-supervisor wait` as it starts).
func HookStarted(dir string) error {
	if dir == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, hookFile), nil, 0o600)
}

// HookReturned marks, in dir, that the hook of main's container (main is
// the supervisor it served: OwnMain) has returned.
func HookReturned(dir string, main procscan.Process) error {
	if dir == "" {
		return nil
	}
	return writeProcess(filepath.Join(dir, hookedPrefix+strconv.Itoa(main.PID)), main.PID, main.StartTime)
}

// AwaitHook returns once this process's container has no hook left to
// return (see above): at once where the pod's supervisors have no hook,
// else when the hook's mark names this process, or WaitLimit after its
// start (up says how long it has run), or when ctx ends. It says how long
// it waited (0: not at all), or why it gave up.
func AwaitHook(ctx context.Context, dir string, up func() (time.Duration, error)) (waited time.Duration, err error) {
	if dir == "" {
		return 0, nil
	}
	if _, err := os.Stat(filepath.Join(dir, hookFile)); errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return 0, err
	}
	mark := filepath.Join(dir, hookedPrefix+strconv.Itoa(pid))
	began := time.Now()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	var until time.Time // WaitLimit after its start: up is read once, if it waits
	for first := true; ; first = false {
		if p, s, err := readProcess(mark, "the hook's mark"); err == nil && p == pid && s == start {
			if first {
				return 0, nil
			}
			return time.Since(began), nil
		}
		if until.IsZero() {
			d, err := up()
			if err != nil {
				return time.Since(began), fmt.Errorf("no mark of its postStart hook's return, and its age unknown: %w", err)
			}
			until = time.Now().Add(WaitLimit - d)
		}
		if !time.Now().Before(until) {
			return time.Since(began), fmt.Errorf("no mark of its postStart hook's return %s after its start", WaitLimit)
		}
		select {
		case <-ctx.Done():
			return time.Since(began), ctx.Err()
		case <-tick.C:
		}
	}
}
