package pod

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
	"golang.org/x/sys/unix"
)

// Runc is the backend that makes every container, the pause container
// included, a real runc container from an OCI bundle under Pod.Dir, the way
// containerd's CRI plugin lays out a pod with shareProcessNamespace:
//
//   - The pause container has new PID, network, IPC, UTS, mount and cgroup
//     namespaces; it brings lo up (podsim pause), as the CNI loopback plugin
//     does for a real sandbox.
//   - Every other container joins the pause container's PID, network, IPC and
//     UTS namespaces by path (linux.namespaces[].path = /proc/PAUSE/ns/...),
//     with its own mount and cgroup namespaces, and its own cgroup
//     <this process's cgroup>/<pod>/<container> in every hierarchy (runc's
//     cgroupfs manager; on a v1/v2 hybrid host runc joins the unified
//     hierarchy too), so from inside the pod a sibling's /proc/PID/cgroup
//     reads "/../<container>".
//   - A restarted container (attempt > 0) is a new runc container,
//     "<name>-r<attempt>", with a new bundle and cgroup, as under containerd.
//
// Each container's `runc run` stays in the foreground and is the process the
// pod waits on: runc is the container's shim. It is the main process's real
// parent, reaps it (so its exit status reaches pidfd watchers inside the pod
// at once) and exits with its status, 128+signal when a signal killed it.
// When the main process of a container that joined the PID namespace by path
// ends, runc kills the rest of its cgroup before it exits, as containerd's
// shim does. The state directory (`runc --root`) is private to the pod.
type Runc struct {
	// Path is the runc binary (see FindRunc).
	Path string
	// Podsim is the podsim binary: the pause container runs it, and a
	// container with no Rootfs gets a minimal root filesystem with the
	// directory holding Podsim bind-mounted read-only at its host path, so
	// that Argv naming the host's tools works unchanged.
	Podsim string
}

// runcState is what Runc keeps per pod.
type runcState struct {
	dir     string // Pod.Dir/runc: bundles and the default rootfs
	root    string // runc --root
	cgroup  string // the pod's cgroup path, relative to runc's own cgroup
	unified string // the pod's cgroup directory in the unified hierarchy
	execs   atomic.Int64

	mu    sync.Mutex
	ids   []string // every container created, in order
	procs []*mainProc
}

func (Runc) Name() string { return "runc" }

// InstallScript installs the Debian packages the pod tests need, relative
// to the e2e module.
const InstallScript = "scripts/install-deps.sh"

// FindRunc runs e2e/scripts/install-deps.sh, which installs Debian's runc
// when it is missing (idempotent; quick and offline when it is there), and
// returns runc's path.
func FindRunc(ctx context.Context) (string, error) {
	var runc string
	if err := scripts.Run(ctx, filepath.Base(InstallScript), map[string]*string{"RUNC": &runc}); err != nil {
		return "", err
	}
	if _, err := os.Stat(runc); err != nil {
		return "", fmt.Errorf("e2e/%s printed RUNC=%s: %w", InstallScript, runc, err)
	}
	return runc, nil
}

// MustRunc is the runc backend for a test, runc installed by
// e2e/scripts/install-deps.sh when it is missing (FindRunc, bounded to 5
// minutes); it fails the test when runc cannot be had.
func MustRunc(t testing.TB, tl Tools) Runc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runc, err := FindRunc(ctx)
	if err != nil {
		t.Fatalf("the runc backend needs runc (e2e/%s installs it): %v", InstallScript, err)
	}
	return Runc{Path: runc, Podsim: tl.Podsim}
}

// Sandbox implements Backend: the pause container.
func (r Runc) Sandbox(ctx context.Context, p *Pod) error {
	unified, err := CgroupRoot()
	if err != nil {
		return err
	}
	st := &runcState{
		dir:    filepath.Join(p.Dir, "runc"),
		cgroup: filepath.Base(p.Dir),
	}
	st.root = filepath.Join(st.dir, "state")
	st.unified = filepath.Join(unified, st.cgroup)
	p.BackendState = st
	if err := os.MkdirAll(st.root, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(st.defaultRootfs(), 0o755); err != nil {
		return err
	}
	// The pause container owns the pod's namespaces; it needs CAP_SYS_ADMIN
	// for sethostname and CAP_NET_ADMIN to bring lo up (what the CRI plugin
	// and the CNI loopback plugin do from outside for a real sandbox).
	pause := &Container{
		Name: "pause",
		Argv: []string{r.Podsim, "pause", "--hostname", p.Spec.Name},
		Caps: append(append([]int{}, DefaultCaps...), unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN),
	}
	proc, out, err := p.startAttempt(ctx, pause, 0)
	if err != nil {
		return fmt.Errorf("start pause: %w", err)
	}
	p.PausePID = proc.PID()
	return awaitPause(ctx, out)
}

// defaultRootfs is the root filesystem of containers with no Rootfs (and of
// pause): empty, with the tools bind-mounted in.
func (st *runcState) defaultRootfs() string { return filepath.Join(st.dir, "rootfs") }

// containerID is a container attempt's runc id: a restarted container is a
// new container, as under containerd.
func containerID(c *Container, attempt int) string {
	if attempt > 0 {
		return fmt.Sprintf("%s-r%d", c.Name, attempt)
	}
	return c.Name
}

// Start implements Backend: `runc run` in the foreground. The first
// container, started by Sandbox before PausePID is known, is the pause
// container: it makes the pod's namespaces instead of joining them.
func (r Runc) Start(ctx context.Context, p *Pod, c *Container, attempt int, stdout *os.File) (Process, error) {
	st := p.BackendState.(*runcState)
	id := containerID(c, attempt)
	bundle := filepath.Join(st.dir, "bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, err
	}
	spec, err := r.spec(p, st, c, id, p.PausePID == 0)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(spec, "", "\t")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	pidFile := filepath.Join(bundle, "pid")
	watch, err := watchFile(pidFile)
	if err != nil {
		return nil, err
	}
	defer watch.Close()
	// runc run: create and start, then forward signals and reap until the
	// container's main process ends. No terminal: the container's stdio is
	// runc's (stdin /dev/null, stdout and stderr the pod's log pipe).
	cmd := exec.Command(r.Path, "--root", st.root, "run", "--bundle", bundle, "--pid-file", pidFile, id)
	cmd.Stdout, cmd.Stderr = stdout, stdout
	proc := &mainProc{cmd: cmd, cgroup: filepath.Join(st.unified, id), id: id, done: make(chan struct{}), killAll: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		exec.CommandContext(ctx, r.Path, "--root", st.root, "kill", "--all", id, "KILL").Run()
		cancel()
	}}
	st.mu.Lock()
	st.ids = append(st.ids, id)
	st.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("runc run %s: %w", id, err)
	}
	st.mu.Lock()
	st.procs = append(st.procs, proc)
	st.mu.Unlock()
	go proc.wait()
	// The pid file appears (renamed into place) once the process runs.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pid, err := watch.wait(wctx, proc.done)
	if err != nil {
		proc.KillAll()
		return nil, fmt.Errorf("runc run %s: %w", id, err)
	}
	// A pidfd-backed handle: signals cannot reach a recycled pid.
	if proc.main, err = os.FindProcess(pid); err != nil {
		return nil, err
	}
	return proc, nil
}

// Exec implements Backend: `runc exec`, whose process runs in the
// container with its user, capabilities and cgroup and, its parent being
// runc outside the pod, has PPID 0 there, as with kubectl exec.
func (r Runc) Exec(ctx context.Context, p *Pod, c *Container, attempt int, argv []string) ([]byte, error) {
	st := p.BackendState.(*runcState)
	id := containerID(c, attempt)
	pidFile := filepath.Join(st.dir, "bundles", id, fmt.Sprintf("exec-%d.pid", st.execs.Add(1)))
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, r.Path, "--root", st.root, "exec", "--pid-file", pidFile, id)
	cmd.Args = append(cmd.Args, argv...)
	cmd.Stdout, cmd.Stderr = &out, &out
	// On timeout kill the process in the container, not only runc exec
	// (which cannot forward SIGKILL): runc then returns.
	cmd.Cancel = func() error {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return cmd.Process.Kill()
	}
	// Once runc exec has returned, the rest of the output comes at once,
	// however loaded the machine: the bound is for a child of the hook
	// that would hold it open (Wait then fails with exec.ErrWaitDelay).
	cmd.WaitDelay = execOutputBound
	err := cmd.Run()
	os.Remove(pidFile)
	if ctx.Err() != nil {
		return out.Bytes(), fmt.Errorf("exec %v: %w", argv, ctx.Err())
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("exec %v: %w", argv, err)
	}
	return out.Bytes(), nil
}

// Teardown implements Backend: runc delete --force on every container it
// still knows (the pause container last; its end ends the pod's PID
// namespace), then the pod's cgroups in every hierarchy.
func (r Runc) Teardown(p *Pod) error {
	st, ok := p.BackendState.(*runcState)
	if !ok {
		return nil
	}
	st.mu.Lock()
	ids := append([]string(nil), st.ids...)
	procs := append([]*mainProc(nil), st.procs...)
	st.mu.Unlock()
	var errs []error
	for i := len(ids) - 1; i >= 0; i-- { // pause was created first
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, r.Path, "--root", st.root, "delete", "--force", ids[i]).CombinedOutput()
		cancel()
		if err != nil && !strings.Contains(string(out), "does not exist") {
			errs = append(errs, fmt.Errorf("runc delete %s: %v: %s", ids[i], err, out))
		}
	}
	deadline := time.After(10 * time.Second)
	for _, proc := range procs {
		select {
		case <-proc.done:
		case <-deadline:
			errs = append(errs, fmt.Errorf("runc run %s still running 10s after runc delete", proc.id))
			proc.cmd.Process.Kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	out, err := exec.CommandContext(ctx, r.Path, "--root", st.root, "list", "--quiet").Output()
	cancel()
	if left := strings.TrimSpace(string(out)); err != nil || left != "" {
		errs = append(errs, fmt.Errorf("runc list after teardown: %q, %v", left, err))
	}
	dirs, err := runcCgroupDirs(st.cgroup)
	errs = append(errs, err)
	for _, d := range dirs {
		errs = append(errs, removeCgroupTree(d))
	}
	return errors.Join(errs...)
}

// Describe implements Describer: what runc lists, and the state of each
// runc run still going and of its container's main process (a hang shows
// there: a main process gone while its runc run is still in the kernel).
func (r Runc) Describe(p *Pod) string {
	st, ok := p.BackendState.(*runcState)
	if !ok {
		return "no sandbox\n"
	}
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	out, err := exec.CommandContext(ctx, r.Path, "--root", st.root, "list").CombinedOutput()
	cancel()
	fmt.Fprintf(&b, "runc list (%v):\n%s", err, out)
	st.mu.Lock()
	procs := append([]*mainProc(nil), st.procs...)
	st.mu.Unlock()
	for _, proc := range procs {
		select {
		case <-proc.done:
			fmt.Fprintf(&b, "%s: runc run exited %d\n", proc.id, proc.code)
		default:
			fmt.Fprintf(&b, "%s: runc run pid %d %s; main process pid %d %s\n",
				proc.id, proc.cmd.Process.Pid, procState(proc.cmd.Process.Pid), proc.PID(), procState(proc.PID()))
		}
	}
	return b.String()
}

// procState is a host process's state letter and where it sleeps in the
// kernel.
func procState(pid int) string {
	if pid <= 0 {
		return "(unknown)"
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "(gone)"
	}
	state := "?"
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		state = string(stat[i+2])
	}
	wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
	return fmt.Sprintf("state %s wchan %s", state, wchan)
}

// fileWatch waits for a file that runc writes by renaming it into place
// (--pid-file), through inotify on its directory.
type fileWatch struct {
	path   string
	f      *os.File
	events chan struct{}
}

func watchFile(path string) (*fileWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch %s: %w", filepath.Dir(path), err)
	}
	// Non-blocking, so the runtime poller serves Read and Close ends it.
	w := &fileWatch{path: path, f: os.NewFile(uintptr(fd), "inotify"), events: make(chan struct{}, 1)}
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := w.f.Read(buf); err != nil {
				return
			}
			select {
			case w.events <- struct{}{}:
			default:
			}
		}
	}()
	return w, nil
}

// wait returns the pid in the file once it is there; it gives up when
// stopped is closed (runc ended) and the file is still missing.
func (w *fileWatch) wait(ctx context.Context, stopped <-chan struct{}) (int, error) {
	for ended := false; ; {
		b, err := os.ReadFile(w.path)
		switch {
		case err == nil:
			return strconv.Atoi(strings.TrimSpace(string(b)))
		case !errors.Is(err, os.ErrNotExist):
			return 0, err
		case ended:
			return 0, errors.New("runc ended before the container started (its error is in the container's log)")
		}
		select {
		case <-w.events:
		case <-stopped:
			ended = true
		case <-ctx.Done():
			return 0, fmt.Errorf("no pid file %s: %w", w.path, ctx.Err())
		}
	}
}

func (w *fileWatch) Close() error { return w.f.Close() }
