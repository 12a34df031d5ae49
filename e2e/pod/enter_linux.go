package pod

import (
	"cmp"
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

// enter starts podsim enter in the pod's namespaces from a throw-away
// locked thread: setns changes the calling thread, and the thread is
// discarded (never unlocked) afterwards.
// bind, "SRC:DST" or "", is the container's termination-message mount.
// joinMnt, a host PID or 0, is whose mount namespace the process joins
// (through nsenter: a Go program, multi-threaded, cannot setns one) instead
// of making mounts of its own. group makes the process the leader of a new
// process group (an exec's, which Exec kills as a whole). hold, if set, is
// run while the process waits, in the pod's PID namespace, to join its
// cgroup (Container.CgroupHold); it joins once hold returns.
func (n Namespaces) enter(p *Pod, c *Container, cgroup, bind string, joinMnt int, group bool, argv []string, out *os.File, hold func() error) (*exec.Cmd, error) {
	dir := cmp.Or(c.Dir, "/")
	args := []string{"enter", "--cgroup", cgroup, "--uid", strconv.Itoa(c.UID), "--gid", strconv.Itoa(c.GID), "--dir", dir}
	if c.Caps != nil {
		s := []string{"none"}
		for _, cp := range c.Caps {
			s = append(s, strconv.Itoa(cp))
		}
		args = append(args, "--caps", strings.Join(s, ","))
	}
	if c.NoNewPrivs {
		args = append(args, "--no-new-privs")
	}
	if bind != "" {
		args = append(args, "--bind", bind)
	}
	if c.CgroupDelay > 0 {
		args = append(args, "--cgroup-delay", c.CgroupDelay.String())
	}
	cue := ""
	if hold != nil {
		// Private to this attempt; enter reads it, as root, before it
		// joins its cgroup.
		cue = filepath.Join(p.Dir, "cgroup-hold-"+filepath.Base(cgroup))
		if err := unix.Mkfifo(cue, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", cue, err)
		}
		defer os.Remove(cue)
		args = append(args, "--cgroup-cue", cue)
	}
	// enter closes fd 3 when it executes argv: Start returns only then, so
	// that a container seen from the pod already runs its command, as its
	// uid (runc's pid file likewise comes after the execve).
	execR, execW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer execR.Close()
	args = append(append(args, "--exec-fd", "3", "--"), argv...)
	type result struct {
		cmd *exec.Cmd
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: this thread joins the pod's namespaces and must
		// end with this goroutine.
		join := []string{"net", "ipc", "uts", "pid"}
		if c.OwnPIDNamespace {
			join = join[:3]
		}
		for _, ns := range join {
			fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", p.PausePID, ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				res <- result{err: fmt.Errorf("open pod %s namespace: %w", ns, err)}
				return
			}
			err = unix.Setns(fd, 0) // its type is the file's
			unix.Close(fd)
			if err != nil {
				res <- result{err: fmt.Errorf("join pod %s namespace: %w", ns, err)}
				return
			}
		}
		cmd := exec.Command(n.Podsim, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		if joinMnt > 0 {
			cmd = exec.Command("nsenter", append([]string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", joinMnt), "--", n.Podsim, "enter", "--in-mounts"}, args[1:]...)...)
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, c.Env...)
		cmd.Stdout, cmd.Stderr = out, out
		cmd.ExtraFiles = []*os.File{execW}
		if c.OwnPIDNamespace {
			cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID
		}
		cmd.SysProcAttr.Setpgid = group
		err := cmd.Start()
		res <- result{cmd, err}
	}()
	r := <-res
	execW.Close()
	if r.err != nil {
		return r.cmd, r.err
	}
	if hold != nil {
		err := hold()
		if err == nil {
			// enter opens the cue after its CgroupDelay; ReleaseCue waits.
			err = ReleaseCue(cue, time.Minute)
		}
		if err != nil {
			r.cmd.Process.Kill()
			r.cmd.Wait()
			return nil, fmt.Errorf("podsim enter %v: held out of its cgroup: %w", argv, err)
		}
	}
	eof := make(chan struct{})
	go func() { io.Copy(io.Discard, execR); close(eof) }()
	select {
	case <-eof:
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		r.cmd.Wait()
		return nil, fmt.Errorf("podsim enter %v: no exec within 30s", argv)
	}
	return r.cmd, nil
}

// MakeCue makes a FIFO at path, which any uid may open: a process that
// opens it for reading (podsim app --fifo, podsim enter --cgroup-cue) waits
// there until ReleaseCue.
func MakeCue(path string) error {
	if err := unix.Mkfifo(path, 0o666); err != nil {
		return fmt.Errorf("mkfifo %s: %w", path, err)
	}
	return os.Chmod(path, 0o666) // past the umask
}

// ReleaseCue lets the process waiting on the FIFO at path go on: it opens
// the FIFO for writing, which waits for that process to open it for
// reading, and closes it. The wait is bounded by within (a hang guard, as
// a container start on a loaded machine may take tens of seconds).
func ReleaseCue(path string, within time.Duration) error {
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			err = f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		// Unblock the opener with a reader of our own.
		if f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			<-done
			f.Close()
		}
		return fmt.Errorf("nothing waited on the cue %s within %s", path, within)
	}
}
