package pod

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Tools are the binaries a simulated pod runs, built from this checkout.
type Tools struct {
	// Dir holds them; it and they are readable by every user, since
	// containers run as several.
	Dir string
	// Podsim is e2e/cmd/podsim (pause, enter, app, wait-http).
	Podsim string
	// PilotAgent is podsim under the name pilot-agent, so that its comm is
	// "pilot-agent": the stand-in sidecar.
	PilotAgent string
	// Supervisor is cmd/sidecar-supervisor, static, as the image has it.
	Supervisor string
}

var (
	toolsOnce sync.Once
	tools     Tools
	toolsErr  error
)

// RepoDir is the checkout's root directory.
func RepoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ToolsDirEnv names a directory holding the tools already built (podsim,
// sidecar/pilot-agent, sidecar-supervisor), for where no Go toolchain runs:
// the qemu guest.
const ToolsDirEnv = "PODSIM_TOOLS_DIR"

// BuildTools builds the tools once per process (the Go build cache makes a
// rebuild of unchanged sources quick), or takes them from $PODSIM_TOOLS_DIR.
func BuildTools(ctx context.Context) (Tools, error) {
	toolsOnce.Do(func() {
		if dir := os.Getenv(ToolsDirEnv); dir != "" {
			tools = toolsIn(dir)
			for _, f := range []string{tools.Podsim, tools.PilotAgent, tools.Supervisor} {
				if _, err := os.Stat(f); err != nil {
					toolsErr = fmt.Errorf("%s=%s: %w", ToolsDirEnv, dir, err)
				}
			}
			return
		}
		tools, toolsErr = BuildToolsFor(ctx, runtime.GOARCH)
	})
	return tools, toolsErr
}

// NeedRoot skips a test that cannot run without root: the pod simulation
// creates namespaces and cgroups. CI runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the pod simulation creates namespaces and cgroups")
	}
}

// MustTools is BuildTools for a test, bounded to 5 minutes; it fails the
// test when the tools cannot be built.
func MustTools(t testing.TB) Tools {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tl, err := BuildTools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// MustStart starts a pod for a test (bounded to a minute) and closes it
// when the test ends, failing the test if it does not close cleanly; a
// failed test gets the pod's description, and more if more is set.
func MustStart(t testing.TB, b Backend, spec Spec, more func() string) *Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Start(ctx, b, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(p.Describe())
			if more != nil {
				t.Log(more())
			}
		}
		if err := p.Close(); err != nil {
			t.Errorf("close pod: %v", err)
		}
	})
	return p
}

// RunTests is the TestMain of every package whose tests build the tools:
// it runs them, then deletes what BuildTools built in this process (not a
// $PODSIM_TOOLS_DIR). The simulated pods' processes get none of the
// descriptors this process inherited (closeInheritedOnExec).
func RunTests(m *testing.M) {
	closeInheritedOnExec()
	code := m.Run()
	if os.Getenv(ToolsDirEnv) == "" && tools.Dir != "" {
		os.RemoveAll(tools.Dir)
	}
	os.Exit(code)
}

func toolsIn(dir string) Tools {
	return Tools{
		Dir:        dir,
		Podsim:     filepath.Join(dir, "podsim"),
		PilotAgent: filepath.Join(dir, "sidecar", "pilot-agent"),
		Supervisor: filepath.Join(dir, "sidecar-supervisor"),
	}
}

// BuildToolsFor builds the tools for GOARCH goarch ("amd64", "arm64") into
// a new directory, for a qemu guest of that architecture. Each call builds
// anew (the Go build cache makes that quick); the caller removes Dir.
func BuildToolsFor(ctx context.Context, goarch string) (_ Tools, err error) {
	dir, err := os.MkdirTemp("", "podsim-tools-")
	if err != nil {
		return Tools{}, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := os.Chmod(dir, 0o755); err != nil {
		return Tools{}, err
	}
	repo := RepoDir()
	t := toolsIn(dir)
	builds := []struct{ moduleDir, out, pkg string }{
		{filepath.Join(repo, "e2e"), t.Podsim, "./cmd/podsim"},
		// As the Dockerfile builds it.
		{repo, t.Supervisor, "./cmd/sidecar-supervisor"},
	}
	for _, b := range builds {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", b.out, b.pkg)
		cmd.Dir = b.moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
		if out, err := cmd.CombinedOutput(); err != nil {
			return Tools{}, fmt.Errorf("go build %s for %s: %v\n%s", b.pkg, goarch, err, out)
		}
	}
	if err := os.MkdirAll(filepath.Dir(t.PilotAgent), 0o755); err != nil {
		return Tools{}, err
	}
	if err := os.Link(t.Podsim, t.PilotAgent); err != nil {
		return Tools{}, err
	}
	return t, nil
}

// closeInheritedOnExec marks every descriptor from 3 up close-on-exec. The
// test process may inherit some from whatever started it (a shell, a CI
// runner: one left a pipe at fd 251), and Go passes a descriptor not so
// marked to every process it starts: through the namespaces backend it
// reached the supervisor of a simulated pod, whose descriptors the
// hardening tests count (TestPrivileges counted 17, the pipe among them).
// A runtime starts each container with 0, 1 and 2 only; so does the
// harness now. Go opens its own descriptors close-on-exec already.
func closeInheritedOnExec() {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	// Before Linux 5.11: one by one.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
}
