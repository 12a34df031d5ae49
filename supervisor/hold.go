package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Hold mode keeps a long-running pod's sidecar up while its applications
// drain. When such a pod is deleted the kubelet sends SIGTERM to every
// container at once; pilot-agent drains and exits after
// terminationDrainDuration, while an app may still be finishing requests
// through the mesh. Run as the istio-proxy container's preStop hook (the
// kubelet runs a container's preStop before its SIGTERM), `hold` returns
// only once every application container's main process has exited, or
// after HoldTimeout: only then does pilot-agent get its SIGTERM.
//
// The binary reaches the istio-proxy container through an emptyDir volume
// that an init container (`sidecar-supervisor install DIR`) fills before
// any other container starts, so the hook's command exists from the
// start, and no long-running supervisor container is needed in such pods.

// OwnName is the supervisor's own process name. A container whose main
// process has it is another of the supervisor's, neither an app nor a
// sidecar: a standby (lead.go) to the one that runs, or a Job's supervisor
// to the hold.
const OwnName = "sidecar-supervisor"

// HoldResult says how a hold ended.
type HoldResult struct {
	// Apps is how many app containers were held for.
	Apps int
	// Left names the app containers still running when it gave up.
	Left    []string
	Elapsed time.Duration
}

// TimedOut reports whether the hold gave up before every app exited.
func (h HoldResult) TimedOut() bool { return len(h.Left) > 0 }

func (h HoldResult) String() string {
	if h.TimedOut() {
		return fmt.Sprintf("hold gave up after %.1fs: %d of %d app containers still running (%v); the sidecar stops now",
			h.Elapsed.Seconds(), len(h.Left), h.Apps, h.Left)
	}
	return fmt.Sprintf("hold released after %.1fs: all %d app containers have exited; the sidecar stops now", h.Elapsed.Seconds(), h.Apps)
}

// Hold waits, within timeout, until the main process of every app
// container visible now has exited. It needs no exit status, so it works
// with pidfds alone on any kernel, with no privileges.
func Hold(ctx context.Context, log zerolog.Logger, scan Scanner, watch Watcher, timeout time.Duration) (HoldResult, error) {
	begun := time.Now()
	pod, err := scan.Scan()
	if err != nil {
		return HoldResult{}, fmt.Errorf("read /proc: %w", err)
	}
	if !pod.Outside() {
		return HoldResult{}, ErrNotShared
	}
	type held struct {
		name string
		proc exitwatch.Proc
	}
	var apps []held
	for _, c := range pod.Of(procscan.App) {
		if !c.HasMain {
			continue
		}
		proc, err := watch.Track(process(c.Main))
		if errors.Is(err, exitwatch.ErrGone) {
			continue
		}
		if err != nil {
			log.Error().Err(err).Str("container", c.Name).Msg("cannot watch app: not held for")
			continue
		}
		defer proc.Close()
		apps = append(apps, held{c.Name, proc})
		log.Info().Int("pid", c.Main.PID).Str("comm", c.Main.Comm).Str("container", c.Name).Msg("holding for app")
	}
	res := HoldResult{Apps: len(apps)}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, a := range apps {
		select {
		case <-a.proc.Done():
			log.Info().Str("container", a.name).Dur("elapsed", time.Since(begun)).Msg("app exited")
		case <-deadline.C:
			for _, b := range apps {
				select {
				case <-b.proc.Done():
				default:
					res.Left = append(res.Left, b.name)
				}
			}
			res.Elapsed = time.Since(begun)
			return res, nil
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	res.Elapsed = time.Since(begun)
	return res, nil
}

// Install copies the running binary into dir (an emptyDir shared with the
// istio-proxy container) as dir/sidecar-supervisor, atomically, so a
// preStop hook never runs a half-written file.
func Install(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, ".sidecar-supervisor-*")
	if err != nil {
		return "", fmt.Errorf("install into %s: %w (is it a writable emptyDir volume?)", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, OwnName)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}
