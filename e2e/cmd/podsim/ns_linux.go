package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Namespace and credential changes below apply to the calling thread, and
// execve keeps only the calling thread: everything runs on the main thread,
// locked to the main goroutine from the start.
func init() { runtime.LockOSThread() }

// pause is the pod's PID 1. The harness started it in new PID, network, IPC
// and UTS namespaces; it makes them usable and then only reaps.
func pause(args []string) error {
	fs := flag.NewFlagSet("pause", flag.ContinueOnError)
	hostname := fs.String("hostname", "pod", "the pod's hostname")
	cgroup := fs.String("cgroup", "", "cgroup v2 directory to move into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cgroup != "" {
		if err := joinCgroup(*cgroup); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(*hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := loUp(); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	// The harness waits for this line before it starts any container.
	fmt.Println("ready")
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return nil
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return nil
}

// loUp brings the loopback interface of the pod's network namespace up, as
// the pause container's runtime does.
func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

// mounts gives a container process its own copy of the mounts, this PID
// namespace's /proc, and its termination-message bind mount, unless it is
// in a container's mounts already (inMounts).
func mounts(inMounts bool, bind string) error {
	if inMounts {
		return nil
	}
	// A private copy of the mounts, then this PID namespace's own /proc.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if bind != "" {
		src, dst, ok := strings.Cut(bind, ":")
		if !ok {
			return fmt.Errorf("--bind %q: want SRC:DST", bind)
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s onto %s: %w", src, dst, err)
		}
	}
	return nil
}

func joinCgroup(dir string) error {
	if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("join cgroup %s: %w", dir, err)
	}
	return nil
}

// enter becomes a container's process. The harness started it, from
// outside, in the pod's PID/network/IPC/UTS namespaces and a new mount
// namespace, so its parent is outside the pod (PPID 0 from inside).
func enter(args []string) error {
	fs := flag.NewFlagSet("enter", flag.ContinueOnError)
	cgroup := fs.String("cgroup", "", "cgroup v2 directory of the container")
	uid := fs.Int("uid", 0, "user id")
	gid := fs.Int("gid", 0, "group id")
	dir := fs.String("dir", "/", "working directory")
	caps := fs.String("caps", "", "capability numbers to keep in the bounding set, comma-separated (\"none\" alone keeps none); unset keeps all")
	noNewPrivs := fs.Bool("no-new-privs", false, "set no_new_privs (allowPrivilegeEscalation: false)")
	inMounts := fs.Bool("in-mounts", false, "the process is in a container's mounts already (kubectl exec): make none")
	bind := fs.String("bind", "", "SRC:DST: bind-mount the file SRC onto DST in the container's mounts (the kubelet's termination-message file)")
	cgroupDelay := fs.Duration("cgroup-delay", 0, "stay this long in the creator's cgroup before joining --cgroup (a runtime that moves a process after creating it)")
	cgroupCue := fs.String("cgroup-cue", "", "a FIFO: after --cgroup-delay, stay in the creator's cgroup until it is written and closed (the harness's hold)")
	execFD := fs.Int("exec-fd", -1, "an inherited descriptor to close when the command is executed (or enter fails): the harness reads EOF on it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Named as runc names its init, which this stands in for until the
	// final execve: root, in the container's cgroup and mounts (so named
	// by its termination-message mount), not yet its program. A supervisor
	// tells it apart by this name, as it does runc's (procscan).
	if err := os.WriteFile("/proc/self/comm", []byte("runc:[2:INIT]"), 0); err != nil {
		return fmt.Errorf("name the runtime's init: %w", err)
	}
	if *execFD >= 0 {
		// The final execve closes it; so does an exit on any error below.
		unix.CloseOnExec(*execFD)
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return errors.New("no command")
	}
	if err := mounts(*inMounts, *bind); err != nil {
		return err
	}
	if *cgroup != "" {
		time.Sleep(*cgroupDelay)
		if *cgroupCue != "" {
			if err := waitFIFO(*cgroupCue); err != nil {
				return fmt.Errorf("cgroup cue: %w", err)
			}
		}
		if err := joinCgroup(*cgroup); err != nil {
			return err
		}
		// The container sees its own cgroup as "/" and siblings as
		// "/../name", as under containerd on a cgroup v2 node.
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("unshare cgroup namespace: %w", err)
		}
	}
	if *caps != "" {
		keep := map[int]bool{}
		for _, c := range strings.Split(*caps, ",") {
			if c == "none" {
				continue
			}
			n, err := strconv.Atoi(c)
			if err != nil {
				return fmt.Errorf("bad capability %q", c)
			}
			keep[n] = true
		}
		for c := 0; c <= unix.CAP_LAST_CAP; c++ {
			if !keep[c] {
				if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
					return fmt.Errorf("drop capability %d: %w", c, err)
				}
			}
		}
	}
	if err := os.Chdir(*dir); err != nil {
		return err
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			return err
		}
		path = p
	}
	if *noNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	// Drop to the container's user last: the mounts above need root. From
	// uid 0 to another, the kernel clears every capability.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(*gid, *gid, *gid); err != nil {
		return fmt.Errorf("setresgid %d: %w", *gid, err)
	}
	if err := syscall.Setresuid(*uid, *uid, *uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", *uid, err)
	}
	defaultSignals()
	return syscall.Exec(path, argv, os.Environ())
}

// defaultSignals gives every signal its default action, as a container
// runtime starts a container's process. execve resets caught signals but
// keeps ignored ones, and whatever started the harness may ignore some (a
// non-interactive shell's background job ignores SIGINT and SIGQUIT): an
// app would then silently survive them. Runs just before execve.
func defaultSignals() {
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if sig != unix.SIGKILL && sig != unix.SIGSTOP {
			sigDefault(sig)
		}
	}
}

// sigDefault gives sig its default action (SIG_DFL) in the kernel itself,
// past the Go runtime, which keeps some signals caught (SIGABRT: a
// goroutine dump, then exit 2) whatever os/signal is told.
func sigDefault(sig syscall.Signal) error {
	// struct kernel_sigaction: handler (0: SIG_DFL), flags, restorer, mask;
	// the same layout on amd64 and arm64.
	var act [4]uint64
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); errno != 0 {
		return fmt.Errorf("rt_sigaction(%v, SIG_DFL): %w", sig, errno)
	}
	return nil
}

// setComm names this process (its main thread, where init locks the main
// goroutine) with prctl(PR_SET_NAME): any bytes but NUL; the kernel keeps
// the first 15.
func setComm(name string) error {
	b := append([]byte(name), 0)
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_NAME: %w", err)
	}
	return nil
}
