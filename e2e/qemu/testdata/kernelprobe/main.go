// Command kernelprobe reports, as one JSON line, what the running kernel
// offers the supervisor and the pod simulation: pidfd on a non-child,
// PIDFD_GET_INFO, ptrace of a non-child with its exact exit status, PID,
// user and cgroup namespaces, cgroup2 leaves, pivot_root. It asserts nothing
// itself: the host-side test (e2e/qemu/qemu_test.go) compares the facts
// with what it expects of the kernel it booted.
//
// It lives under testdata so that `go test ./...` does not build it as part
// of the e2e module: it is meant for the guest, run as root.
//
// The same binary plays every process of the experiments, selected by its
// first argument (see main).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every wait on a child is bounded by this; the guest is slow (TCG) but
// none of the experiments takes more than a fraction of it.
const childTimeout = 30 * time.Second

// grandchildStatus is the status the traced grandchild exits with: not 0
// or 1, so that a tracer reporting a default value cannot pass by luck.
const grandchildStatus = 3

// leaf is the cgroup the probe creates; cgroup.move in the facts names it.
const leaf = "/sys/fs/cgroup/kernelprobe"

// guestEnv must be set to run the probe: it creates cgroups and mounts
// things, which is fine in a throw-away guest and not on a workstation.
const guestEnv = "KERNELPROBE_IN_GUEST"

func main() {
	if os.Getenv(guestEnv) != "1" {
		fmt.Fprintf(os.Stderr, "kernelprobe: meant for a throw-away qemu guest (it creates cgroups); set %s=1 to run it anyway\n", guestEnv)
		os.Exit(2)
	}
	if len(os.Args) < 2 {
		probe()
		return
	}
	var err error
	switch os.Args[1] {
	case "middle":
		err = middle()
	case "sleeper":
		err = sleeper()
	case "pidns":
		err = pidns()
	case "userns":
		fmt.Printf("%d|%s\n", os.Getuid(), strings.Join(strings.Fields(readTrim("/proc/self/uid_map")), " "))
	case "cgns":
		err = cgns()
	case "pivot":
		err = pivot()
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernelprobe:", os.Args[1]+":", err)
		os.Exit(1)
	}
}

// facts maps a fact's name to what was observed: "ok", an errno name, a
// number or a file's content.
type facts map[string]string

func probe() {
	f := facts{}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		f["release"] = describe(err)
	} else {
		f["release"] = unix.ByteSliceToString(uts.Release[:])
	}
	f["hostname"], _ = os.Hostname()
	f["yama.ptrace_scope"] = readTrim("/proc/sys/kernel/yama/ptrace_scope")
	f["clocksource"] = readTrim("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	f["lo"] = loState()
	mounts(f)
	grandchild(f)
	namespaces(f)
	cgroups(f)
	out, err := json.Marshal(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernelprobe:", err)
		os.Exit(1)
	}
	fmt.Printf("KERNELPROBE %s\n", out)
}

// mounts checks what /init mounted, by file system magic.
func mounts(f facts) {
	for _, m := range []struct {
		name  string
		path  string
		magic int64
	}{
		{"mount.cgroup2", "/sys/fs/cgroup", unix.CGROUP2_SUPER_MAGIC},
		{"mount.proc", "/proc", unix.PROC_SUPER_MAGIC},
		{"mount.tmp", "/tmp", unix.TMPFS_MAGIC},
		{"mount.run", "/run", unix.TMPFS_MAGIC},
		{"mount.dev", "/dev", unix.TMPFS_MAGIC}, // devtmpfs reports tmpfs's magic
		{"mount.sys", "/sys", unix.SYSFS_MAGIC},
	} {
		var st unix.Statfs_t
		switch err := unix.Statfs(m.path, &st); {
		case err != nil:
			f[m.name] = describe(err)
		case st.Type != m.magic:
			f[m.name] = fmt.Sprintf("magic %#x", st.Type)
		default:
			f[m.name] = "ok"
		}
	}
}

// loState reports "up" when lo has IFF_UP.
func loState() string {
	flags := readTrim("/sys/class/net/lo/flags")
	v, err := strconv.ParseUint(strings.TrimPrefix(flags, "0x"), 16, 32)
	if err != nil {
		return flags
	}
	if v&unix.IFF_UP != 0 {
		return "up"
	}
	return "down"
}

// grandchild runs the supervisor's situation: the process to watch is not
// our child (its parent, "middle", plays the container runtime and reaps
// it). We open a pidfd on it, try PIDFD_GET_INFO, seize it with ptrace and
// collect its exit status before its real parent does.
func grandchild(f facts) {
	// ptrace requests are accepted only from the thread that attached.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	release, hold, err := os.Pipe()
	if err != nil {
		f["grandchild"] = describe(err)
		return
	}
	defer hold.Close()
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	mid := exec.CommandContext(ctx, "/proc/self/exe", "middle")
	mid.ExtraFiles = []*os.File{release}
	mid.Stderr = os.Stderr
	stdout, err := mid.StdoutPipe()
	if err != nil {
		f["grandchild"] = describe(err)
		return
	}
	if err := mid.Start(); err != nil {
		f["grandchild"] = describe(err)
		return
	}
	release.Close()
	line, err := readLine(stdout, childTimeout)
	if err != nil {
		f["grandchild"] = "no pid from middle: " + describe(err)
		return
	}
	pid, err := strconv.Atoi(line)
	if err != nil {
		f["grandchild"] = "bad pid " + strconv.Quote(line)
		return
	}
	f["grandchild"] = "ok"
	if ppid := statField(pid, 4); ppid == strconv.Itoa(mid.Process.Pid) {
		f["grandchild.parent"] = "middle"
	} else {
		f["grandchild.parent"] = "ppid " + ppid
	}

	pidfd, err := unix.PidfdOpen(pid, 0)
	f["pidfd_open"] = describe(err)
	if err == nil {
		defer unix.Close(pidfd)
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
		f["pidfd_get_info"] = describe(unix.IoctlPidfdInfo(pidfd, &info))
	}

	// x/sys's PtraceSeize passes no options; SEIZE takes them in data.
	_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, unix.PTRACE_O_TRACEEXIT, 0, 0)
	if errno != 0 {
		f["ptrace_seize"] = describe(errno)
		hold.Close()
		mid.Wait()
		return
	}
	f["ptrace_seize"] = "ok"
	hold.Close() // the grandchild reads EOF and exits with grandchildStatus

	// If the grandchild never exits, kill it so that wait4 returns.
	watchdog := time.AfterFunc(childTimeout, func() { unix.Kill(pid, unix.SIGKILL) })
	defer watchdog.Stop()
	f["ptrace.exit_event"] = "missing"
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			f["ptrace.exit_status"] = describe(err)
			break
		}
		if ws.Exited() {
			f["ptrace.exit_status"] = strconv.Itoa(ws.ExitStatus())
			break
		}
		if ws.Signaled() {
			f["ptrace.exit_status"] = "signal " + ws.Signal().String()
			break
		}
		if !ws.Stopped() {
			continue
		}
		// The event is in bits 16-23; syscall's TrapCause hides group-stops.
		sig := 0
		switch event := uint32(ws) >> 16; event {
		case unix.PTRACE_EVENT_EXIT:
			f["ptrace.exit_event"] = "seen"
		case unix.PTRACE_EVENT_STOP:
			unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_LISTEN, uintptr(pid), 0, 0, 0, 0)
			continue
		default:
			// A signal-delivery-stop (Go's runtime sends itself SIGURG):
			// hand the signal on.
			sig = int(ws.StopSignal())
		}
		unix.PtraceCont(pid, sig)
	}

	if err := mid.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			f["parent.exit_status"] = strconv.Itoa(ee.ExitCode())
		} else {
			f["parent.exit_status"] = describe(err)
		}
	} else {
		f["parent.exit_status"] = "0"
	}
	if pidfd >= 0 && f["pidfd_open"] == "ok" {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 5000)
		switch {
		case err != nil:
			f["pidfd.poll"] = describe(err)
		case n == 1 && fds[0].Revents&unix.POLLIN != 0:
			f["pidfd.poll"] = "readable"
		default:
			f["pidfd.poll"] = fmt.Sprintf("revents %#x", fds[0].Revents)
		}
	}
}

// middle starts the grandchild, prints its pid and reaps it, exiting with
// its status: the container runtime's part.
func middle() error {
	gc := exec.Command("/proc/self/exe", "sleeper", strconv.Itoa(grandchildStatus))
	gc.Stdin = os.NewFile(3, "release")
	gc.Stderr = os.Stderr
	if err := gc.Start(); err != nil {
		return err
	}
	fmt.Println(gc.Process.Pid)
	err := gc.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		os.Exit(ee.ExitCode())
	}
	return err
}

// sleeper waits for EOF on stdin, then exits with the status in its argument.
func sleeper() error {
	code, err := strconv.Atoi(os.Args[2])
	if err != nil {
		return err
	}
	io.Copy(io.Discard, os.Stdin)
	os.Exit(code)
	return nil
}

// namespaces starts children in new PID+mount, user and mount namespaces.
func namespaces(f facts) {
	out, err := child(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS}, "pidns")
	if err != nil {
		f["pidns"] = describe(err)
	} else {
		var r map[string]string
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			f["pidns"] = "bad output " + strconv.Quote(out)
		}
		for k, v := range r {
			f["pidns."+k] = v
		}
	}

	// Root in a user namespace that maps to nobody outside: the child
	// switches to its namespace's uid 0, which is host uid 65534.
	out, err = child(&syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}},
		Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
	}, "userns")
	if err != nil {
		f["userns"] = describe(err)
	} else {
		f["userns.uid"], f["userns.uid_map"], _ = strings.Cut(out, "|")
	}

	out, err = child(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}, "pivot")
	f["pivot_root"] = orErr(out, err)
}

// pidns runs as PID 1 of a new PID namespace with its own mount namespace,
// mounts a fresh /proc and reports what it shows.
func pidns() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	self, err := os.Readlink("/proc/self")
	if err != nil {
		return err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	pids := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids++
		}
	}
	out, _ := json.Marshal(map[string]string{
		"getpid":    strconv.Itoa(os.Getpid()),
		"proc_self": self,
		"proc_pids": strconv.Itoa(pids),
	})
	fmt.Println(string(out))
	return nil
}

// pivot tries pivot_root(2) into a tmpfs, in its own mount namespace: what
// runc does for every container. It fails with EINVAL when the root is the
// kernel's rootfs, which /init avoids.
func pivot() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	dir, err := os.MkdirTemp("", "newroot")
	if err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "old"), 0o755); err != nil {
		return err
	}
	if err := unix.PivotRoot(dir, filepath.Join(dir, "old")); err != nil {
		return fmt.Errorf("pivot_root: %s", describe(err))
	}
	fmt.Println("ok")
	return nil
}

// cgroups creates a leaf, moves a process into it by writing cgroup.procs,
// starts one there with clone3(CLONE_INTO_CGROUP), and has one unshare a
// cgroup namespace.
func cgroups(f facts) {
	if f["mount.cgroup2"] != "ok" {
		return // not a cgroup2 hierarchy: writing its files would create them
	}
	f["cgroup.controllers"] = readTrim("/sys/fs/cgroup/cgroup.controllers")
	if err := os.Mkdir(leaf, 0o755); err != nil {
		f["cgroup.mkdir"] = describe(err)
		return
	}
	f["cgroup.mkdir"] = "ok"
	// Controllers for the leaf, as a pod's cgroup has them.
	f["cgroup.subtree_control"] = describe(writeExisting("/sys/fs/cgroup/cgroup.subtree_control", "+pids +memory"))

	// Move a running process by writing its pid.
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	sl := exec.CommandContext(ctx, "/proc/self/exe", "sleeper", "0")
	hold, err := sl.StdinPipe()
	if err == nil {
		err = sl.Start()
	}
	if err != nil {
		f["cgroup.move"] = describe(err)
	} else {
		if err := writeExisting(leaf+"/cgroup.procs", strconv.Itoa(sl.Process.Pid)); err != nil {
			f["cgroup.move"] = describe(err)
		} else {
			f["cgroup.move"] = readTrim(fmt.Sprintf("/proc/%d/cgroup", sl.Process.Pid))
		}
		hold.Close()
		sl.Wait()
	}

	// Start a process inside the leaf (Go uses clone3 CLONE_INTO_CGROUP).
	dirfd, err := unix.Open(leaf, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		f["cgroup.clone_into"] = describe(err)
	} else {
		out, err := child(&syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: dirfd}, "cgns", "-")
		f["cgroup.clone_into"] = orErr(out, err)
		unix.Close(dirfd)
	}

	// Join the leaf, then unshare a cgroup namespace: the leaf becomes "/".
	out, err := child(nil, "cgns", leaf)
	if err != nil {
		f["cgroupns"] = describe(err)
		return
	}
	before, after, _ := strings.Cut(out, "|")
	f["cgroupns.before"] = before
	f["cgroupns.after"] = after
}

// cgns prints its cgroup; with a cgroup directory as argument it first moves
// itself there, unshares a cgroup namespace and prints "before|after".
func cgns() error {
	if os.Args[2] == "-" {
		fmt.Println(readTrim("/proc/self/cgroup"))
		return nil
	}
	if err := writeExisting(filepath.Join(os.Args[2], "cgroup.procs"), "0"); err != nil {
		return fmt.Errorf("join %s: %w", os.Args[2], err)
	}
	// unshare acts on the calling thread only; read that thread's view.
	runtime.LockOSThread()
	before := readTrim("/proc/thread-self/cgroup")
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare(CLONE_NEWCGROUP): %s", describe(err))
	}
	fmt.Printf("%s|%s\n", before, readTrim("/proc/thread-self/cgroup"))
	return nil
}

// child runs this binary in mode args with attr and returns its trimmed
// stdout, or its stderr in the error.
func child(attr *syscall.SysProcAttr, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", args...)
	cmd.SysProcAttr = attr
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// readLine reads one line from r, giving up after d.
func readLine(r io.Reader, d time.Duration) (string, error) {
	ch := make(chan string, 1) // buffered: the reader never blocks on a gone receiver
	errc := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			errc <- err
			return
		}
		ch <- strings.TrimSpace(line)
	}()
	select {
	case l := <-ch:
		return l, nil
	case err := <-errc:
		return "", err
	case <-time.After(d):
		return "", errors.New("timed out")
	}
}

// statField returns field n (1-based, as in proc(5)) of /proc/PID/stat.
func statField(pid, n int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return describe(err)
	}
	// comm (field 2) may hold spaces; the fields after it follow the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || n < 3 {
		return "?"
	}
	fields := strings.Fields(s[i+1:])
	if n-3 >= len(fields) {
		return "?"
	}
	return fields[n-3]
}

// writeExisting writes to a kernel file that must exist (no O_CREATE, unlike
// os.WriteFile): a cgroup file missing means the wrong file system.
func writeExisting(name, data string) error {
	fh, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fh.WriteString(data)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

func readTrim(name string) string {
	b, err := os.ReadFile(name)
	if err != nil {
		return describe(err)
	}
	return strings.TrimSpace(string(b))
}

// describe is "ok" for nil and the errno's name (ENOTTY) when there is one,
// which is what the host-side test compares.
func describe(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return err.Error()
}

func orErr(out string, err error) string {
	if err != nil {
		return describe(err)
	}
	return out
}
