package pod

import (
	"bufio"
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
	procs []*runcProc
}

// Name implements Backend.
func (Runc) Name() string { return "runc" }

// DefaultCaps is the capability set a container gets from containerd's CRI
// plugin when its securityContext says nothing (containerd's
// oci.defaultUnixCaps, Docker's default too).
var DefaultCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER,
	unix.CAP_MKNOD, unix.CAP_NET_RAW, unix.CAP_SETGID, unix.CAP_SETUID,
	unix.CAP_SETFCAP, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE,
	unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE,
}

// capNames are the names runc's spec wants, by capability number.
var capNames = [...]string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

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
	rd, w, err := os.Pipe()
	if err != nil {
		return err
	}
	proc, err := r.start(ctx, p, st, pause, "pause", w, true)
	w.Close()
	if err != nil {
		rd.Close()
		return fmt.Errorf("start pause: %w", err)
	}
	p.PausePID = proc.PID()
	return awaitPause(ctx, rd)
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

// Start implements Backend: `runc run` in the foreground.
func (r Runc) Start(ctx context.Context, p *Pod, c *Container, attempt int, stdout *os.File) (Process, error) {
	return r.start(ctx, p, p.BackendState.(*runcState), c, containerID(c, attempt), stdout, false)
}

// start runs one container; sandbox says it is the pause container, which
// makes the pod's namespaces instead of joining them.
func (r Runc) start(ctx context.Context, p *Pod, st *runcState, c *Container, id string, stdout *os.File, sandbox bool) (*runcProc, error) {
	bundle := filepath.Join(st.dir, "bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, err
	}
	spec, err := r.spec(p, st, c, id, sandbox)
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
	proc := &runcProc{runc: r.Path, root: st.root, id: id, cmd: cmd,
		cgroup: filepath.Join(st.unified, id), done: make(chan struct{})}
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
	proc.pid = pid
	// A pidfd-backed handle: signals cannot reach a recycled pid.
	if proc.proc, err = os.FindProcess(pid); err != nil {
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
	// A child of the hook may hold the output open: do not wait for it.
	cmd.WaitDelay = time.Second
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
	procs := append([]*runcProc(nil), st.procs...)
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
	procs := append([]*runcProc(nil), st.procs...)
	st.mu.Unlock()
	for _, proc := range procs {
		select {
		case <-proc.done:
			fmt.Fprintf(&b, "%s: runc run exited %d\n", proc.id, proc.code)
		default:
			fmt.Fprintf(&b, "%s: runc run pid %d %s; main process pid %d %s\n",
				proc.id, proc.cmd.Process.Pid, procState(proc.cmd.Process.Pid), proc.pid, procState(proc.pid))
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

// runcCgroupDirs lists the pod's cgroup directory in every hierarchy this
// process is in: runc makes the containers' cgroups relative to its own
// (which is ours) in each of them.
func runcCgroupDirs(pod string) ([]string, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if mnt := mounts.find(parts[1]); mnt != "" {
			dirs = append(dirs, filepath.Join(mnt, parts[2], pod))
		}
		// Else a hierarchy not mounted here, which runc cannot use either.
	}
	return dirs, nil
}

// cgroupMount is a mounted cgroup hierarchy: its mount point and mount
// options, which name its controllers ("cpu", "name=systemd"); none for
// cgroup2.
type cgroupMount struct {
	dir  string
	v2   bool
	opts map[string]bool
}

type cgroupMountList []cgroupMount

// find returns where the hierarchy of a /proc/self/cgroup line's
// controller list ("" for cgroup2) is mounted, or "".
func (l cgroupMountList) find(controllers string) string {
	for _, m := range l {
		if controllers == "" {
			if m.v2 {
				return m.dir
			}
			continue
		}
		all := !m.v2
		for _, c := range strings.Split(controllers, ",") {
			all = all && m.opts[c]
		}
		if all {
			return m.dir
		}
	}
	return ""
}

func cgroupMounts() (cgroupMountList, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var l cgroupMountList
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			// "... - FSTYPE SOURCE SUPEROPTS"
			if fld != "-" || i+3 >= len(fields) || (fields[i+1] != "cgroup" && fields[i+1] != "cgroup2") {
				continue
			}
			m := cgroupMount{dir: fields[4], v2: fields[i+1] == "cgroup2", opts: map[string]bool{}}
			for _, o := range strings.Split(fields[i+3], ",") {
				m.opts[o] = true
			}
			l = append(l, m)
		}
	}
	return l, sc.Err()
}

// runcProc is a container's `runc run`.
type runcProc struct {
	runc, root, id string
	cmd            *exec.Cmd
	cgroup         string // in the unified hierarchy
	pid            int
	proc           *os.Process
	done           chan struct{}
	code           int
}

func (p *runcProc) PID() int { return p.pid }

func (p *runcProc) wait() {
	// Process.Wait, not Cmd.Wait: the output is the pod's pipe, handed
	// over as a file, and nothing of ours copies it.
	ps, err := p.cmd.Process.Wait()
	switch {
	case err != nil:
		p.code = 128
	case ps.Sys().(syscall.WaitStatus).Signaled():
		// runc itself was killed: its container's status is lost.
		p.code = 128 + int(ps.Sys().(syscall.WaitStatus).Signal())
	default:
		// runc's own exit status is the container's: the code, or
		// 128+signal when a signal killed the main process.
		p.code = ps.ExitCode()
	}
	close(p.done)
}

// Wait implements Process. runc, like the CRI, reports a signal death as
// the code 128+signal only: the signal itself is not reported.
func (p *runcProc) Wait() (int, syscall.Signal) {
	<-p.done
	return p.code, 0
}

// Signal implements Process: to the main process itself (through its pidfd),
// as containerd's shim does for the kubelet.
func (p *runcProc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return os.ErrProcessDone
	default:
	}
	if p.proc == nil {
		return errors.New("container not started")
	}
	return p.proc.Signal(sig)
}

// KillAll implements Process: runc kill --all while runc still has the
// container, then the cgroup's cgroup.kill for anything left.
func (p *runcProc) KillAll() {
	select {
	case <-p.done:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		exec.CommandContext(ctx, p.runc, "--root", p.root, "kill", "--all", p.id, "KILL").Run()
		cancel()
	}
	killCgroup(p.cgroup)
}

// spec is the container's OCI runtime spec.
func (r Runc) spec(p *Pod, st *runcState, c *Container, id string, sandbox bool) (*ociSpec, error) {
	rootfs, readOnly := c.Rootfs, c.ReadOnlyRootfs
	mounts := defaultMounts()
	if rootfs == "" {
		rootfs = st.defaultRootfs()
		tools := filepath.Dir(r.Podsim)
		mounts = append(mounts, ociMount{Destination: tools, Type: "bind", Source: tools, Options: []string{"rbind", "ro"}})
	}
	if _, err := os.Stat(rootfs); err != nil {
		return nil, fmt.Errorf("container %s rootfs: %w", c.Name, err)
	}
	for _, m := range c.Mounts {
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		mounts = append(mounts, ociMount{Destination: m.Container, Type: "bind", Source: m.Host, Options: []string{"rbind", opt}})
	}
	// The termination-message file: the instance's, as the kubelet mounts
	// it (onto /dev/termination-log by default), or without names the
	// pod's file for the containers that write one.
	inst := ""
	if !sandbox {
		var err error
		if inst, err = p.instanceFile(c); err != nil {
			return nil, err
		}
	}
	switch dst := c.TerminationMessage; {
	case inst != "":
		if dst == "" {
			dst = "/dev/termination-log"
		}
		mounts = append(mounts, ociMount{Destination: dst, Type: "bind", Source: inst, Options: []string{"rbind", "rw"}})
	case dst != "":
		mounts = append(mounts, ociMount{Destination: dst, Type: "bind",
			Source: p.TerminationMessagePath(c.Name), Options: []string{"rbind", "rw"}})
	}
	caps := DefaultCaps
	if c.Caps != nil {
		caps = c.Caps
	}
	var names []string
	for _, n := range caps {
		if n < 0 || n >= len(capNames) {
			return nil, fmt.Errorf("container %s: unknown capability %d", c.Name, n)
		}
		names = append(names, capNames[n])
	}
	if names == nil {
		names = []string{} // none, not runc's default
	}
	env := c.Env
	hasPath := false
	for _, e := range env {
		hasPath = hasPath || strings.HasPrefix(e, "PATH=")
	}
	if !hasPath {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cwd := c.Dir
	if cwd == "" {
		cwd = "/"
	}
	s := &ociSpec{
		Version: "1.0.2-dev",
		Process: ociProcess{
			User: ociUser{UID: c.UID, GID: c.GID}, Args: c.Argv, Env: env, Cwd: cwd,
			Capabilities:    ociCaps{Bounding: names, Effective: names, Permitted: names},
			NoNewPrivileges: c.NoNewPrivs,
		},
		Root:   ociRoot{Path: rootfs, Readonly: readOnly},
		Mounts: mounts,
		Linux: ociLinux{
			CgroupsPath: st.cgroup + "/" + id,
			// Deny every device but runc's defaults (null, zero, full, tty,
			// random, urandom, ptmx...), as containerd does.
			Resources:     &ociResources{Devices: []ociDevice{{Allow: false, Access: "rwm"}}},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	if sandbox { // the pause container makes the pod's namespaces
		s.Hostname = p.Spec.Name
		for _, t := range []string{"pid", "network", "ipc", "uts", "mount", "cgroup"} {
			s.Linux.Namespaces = append(s.Linux.Namespaces, ociNamespace{Type: t})
		}
		return s, nil
	}
	join := func(t, name string) ociNamespace {
		return ociNamespace{Type: t, Path: fmt.Sprintf("/proc/%d/ns/%s", p.PausePID, name)}
	}
	pid := join("pid", "pid")
	if c.OwnPIDNamespace {
		pid = ociNamespace{Type: "pid"}
	}
	s.Linux.Namespaces = []ociNamespace{pid, join("network", "net"), join("ipc", "ipc"), join("uts", "uts"),
		{Type: "mount"}, {Type: "cgroup"}}
	return s, nil
}

// defaultMounts are containerd's default mounts for a Linux container.
func defaultMounts() []ociMount {
	return []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

// containerd's default masked and read-only paths.
var (
	maskedPaths = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// The part of the OCI runtime spec (config.json) the backend writes.
type (
	ociSpec struct {
		Version  string     `json:"ociVersion"`
		Process  ociProcess `json:"process"`
		Root     ociRoot    `json:"root"`
		Hostname string     `json:"hostname,omitempty"`
		Mounts   []ociMount `json:"mounts"`
		Linux    ociLinux   `json:"linux"`
	}
	ociProcess struct {
		User            ociUser  `json:"user"`
		Args            []string `json:"args"`
		Env             []string `json:"env"`
		Cwd             string   `json:"cwd"`
		Capabilities    ociCaps  `json:"capabilities"`
		NoNewPrivileges bool     `json:"noNewPrivileges"`
	}
	ociUser struct {
		UID int `json:"uid"`
		GID int `json:"gid"`
	}
	ociCaps struct {
		Bounding  []string `json:"bounding"`
		Effective []string `json:"effective"`
		Permitted []string `json:"permitted"`
	}
	ociRoot struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	}
	ociMount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options,omitempty"`
	}
	ociLinux struct {
		Namespaces    []ociNamespace `json:"namespaces"`
		CgroupsPath   string         `json:"cgroupsPath"`
		Resources     *ociResources  `json:"resources,omitempty"`
		MaskedPaths   []string       `json:"maskedPaths,omitempty"`
		ReadonlyPaths []string       `json:"readonlyPaths,omitempty"`
	}
	ociNamespace struct {
		Type string `json:"type"`
		Path string `json:"path,omitempty"`
	}
	ociResources struct {
		Devices []ociDevice `json:"devices"`
	}
	ociDevice struct {
		Allow  bool   `json:"allow"`
		Access string `json:"access"`
	}
)

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
	for {
		b, err := os.ReadFile(w.path)
		if err == nil {
			return strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		select {
		case <-w.events:
		case <-stopped:
			if b, err := os.ReadFile(w.path); err == nil {
				return strconv.Atoi(strings.TrimSpace(string(b)))
			}
			return 0, errors.New("runc ended before the container started (its error is in the container's log)")
		case <-ctx.Done():
			return 0, fmt.Errorf("no pid file %s: %w", w.path, ctx.Err())
		}
	}
}

func (w *fileWatch) Close() error { return w.f.Close() }
