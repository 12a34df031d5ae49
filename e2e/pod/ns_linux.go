package pod

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Namespaces is the backend that builds a pod from namespaces by hand, over
// the host filesystem. Podsim is the path of the podsim binary
// (e2e/cmd/podsim).
type Namespaces struct {
	Podsim string
}

// nsState is what Namespaces keeps per pod.
type nsState struct {
	cgroup string // the pod's cgroup v2 directory
	pause  *exec.Cmd
	exited chan struct{}
}

func (Namespaces) Name() string { return "namespaces" }

// Sandbox starts pause in new PID, network, IPC and UTS namespaces, in its
// own cgroup. It is started from a goroutine that keeps its thread for the
// pod's lifetime, so Pdeathsig (which fires when the starting *thread*
// ends) kills the pod only if the test process dies.
func (n Namespaces) Sandbox(ctx context.Context, p *Pod) error {
	root, err := CgroupRoot()
	if err != nil {
		return err
	}
	st := &nsState{cgroup: filepath.Join(root, filepath.Base(p.Dir)), exited: make(chan struct{})}
	p.BackendState = st
	if err := os.MkdirAll(filepath.Join(st.cgroup, "pause"), 0o755); err != nil {
		return fmt.Errorf("create pod cgroup: %w", err)
	}
	started := make(chan error, 1)
	var out io.ReadCloser
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(st.exited)
		cmd := exec.Command(n.Podsim, "pause", "--hostname", p.Spec.Name, "--cgroup", filepath.Join(st.cgroup, "pause"))
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			Pdeathsig:  syscall.SIGKILL,
		}
		cmd.Stderr = os.Stderr
		pipe, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			started <- err
			return
		}
		st.pause, out = cmd, pipe
		started <- nil
		cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start pause: %w", err)
	}
	p.PausePID = st.pause.Process.Pid
	return awaitPause(ctx, out)
}

// awaitPause waits for pause's first line on out: "ready" once lo is up;
// anything else (runc's error, say) is the reason it is not. Its later
// output (none, unless runc complains on the way out) is drained and out
// closed in the background, so that no write of it ever blocks.
func awaitPause(ctx context.Context, out io.ReadCloser) error {
	line := make(chan string, 1)
	go func() {
		defer out.Close()
		br := bufio.NewReader(out)
		s, _ := br.ReadString('\n')
		line <- s
		io.Copy(io.Discard, br)
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			return fmt.Errorf("pause did not start (said %q)", s)
		}
	case <-ctx.Done():
		return fmt.Errorf("pause not ready: %w", ctx.Err())
	case <-time.After(30 * time.Second):
		return errors.New("pause not ready within 30s")
	}
	return nil
}

// cgroupDir is a container attempt's cgroup: a restarted container is a new
// container, with a new cgroup, as under containerd.
func (st *nsState) cgroupDir(c *Container, attempt int) string {
	return filepath.Join(st.cgroup, containerID(c, attempt))
}

// Start implements Backend: podsim enter, in the pod's namespaces.
func (n Namespaces) Start(ctx context.Context, p *Pod, c *Container, attempt int, stdout *os.File) (Process, error) {
	st := p.BackendState.(*nsState)
	cg := st.cgroupDir(c, attempt)
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return nil, err
	}
	inst, err := p.instanceFile(c)
	if err != nil {
		return nil, err
	}
	bind := ""
	if inst != "" {
		target := cmp.Or(c.TerminationMessage, p.messageFile(c.Name))
		bind = inst + ":" + target
	}
	var hold func() error
	if c.CgroupHold != nil {
		hold = func() error {
			hctx, cancel := p.untilDeleted(ctx)
			defer cancel()
			return c.CgroupHold(hctx, p, attempt)
		}
	}
	cmd, err := n.enter(p, c, cg, bind, 0, false, c.Argv, stdout, hold)
	if err != nil {
		return nil, err
	}
	proc := &mainProc{cmd: cmd, main: cmd.Process, cgroup: cg, done: make(chan struct{})}
	go proc.wait()
	return proc, nil
}

// Exec implements Backend: a process that joins a running container (its
// cgroup and the pod's namespaces) as kubectl exec does, so it too has PPID 0.
func (n Namespaces) Exec(ctx context.Context, p *Pod, c *Container, attempt int, argv []string) ([]byte, error) {
	st := p.BackendState.(*nsState)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// As kubectl exec: in the container's own mounts (its /proc, its
	// termination-message file), those of its main process.
	// (A container whose main process is gone has no mounts to join: the
	// process gets its own, as before. Kubernetes refuses such an exec; a
	// test may stand one in for an exec racing the main process's exit.)
	main := 0
	if i := p.index(c.Name); i >= 0 && p.running(i) {
		if proc := p.proc(i); proc != nil {
			main = proc.PID()
		}
	}
	cmd, err := n.enter(p, c, st.cgroupDir(c, attempt), "", main, true, argv, w, nil)
	w.Close()
	if err != nil {
		return nil, err
	}
	outc := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		outc <- b
	}()
	waitc := make(chan error, 1)
	go func() {
		// The process leads a process group of its own: once it has exited,
		// what it started (a hook's child left behind) is killed with the
		// group, and the output's pipe closes. It is reaped only after the
		// kill, so that the group's id cannot be another's meanwhile.
		pid := cmd.Process.Pid
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		syscall.Kill(-pid, syscall.SIGKILL)
		waitc <- cmd.Wait()
	}()
	select {
	case err := <-waitc:
		t := time.NewTimer(execOutputBound)
		defer t.Stop()
		select {
		case out := <-outc:
			return out, err
		case <-t.C:
			return nil, errors.Join(err, fmt.Errorf("exec %v: its output still open %s after it exited (a process of it outside its group)", argv, execOutputBound))
		}
	case <-ctx.Done():
		cmd.Process.Kill() // and then its group, as above
		<-waitc
		return nil, fmt.Errorf("hook %v: %w", argv, ctx.Err())
	}
}

// execOutputBound bounds the wait for an exec's output once its process
// group is killed: nothing of it holds the pipe then, and the rest of the
// output comes at once, however loaded the machine. Only a process that
// left the group could hold it.
const execOutputBound = time.Minute

// Teardown implements Backend: SIGKILL to pause ends every process of the
// pod's PID namespace; then the cgroups go.
func (n Namespaces) Teardown(p *Pod) error {
	st, ok := p.BackendState.(*nsState)
	if !ok {
		return nil
	}
	if st.pause != nil && st.pause.Process != nil {
		st.pause.Process.Kill()
		select {
		case <-st.exited:
		case <-time.After(10 * time.Second):
			return errors.New("pause did not exit")
		}
	}
	return removeCgroupTree(st.cgroup)
}

// mainProc is a container's main process as its shim sees it, on either
// backend: cmd is what the pod waits on, main where signals go. On the
// namespaces backend they are one process (podsim enter becomes the main
// process); on runc's, cmd is `runc run`, the container's shim, which reaps
// the main process and exits with its status: the code, or 128+signal when
// a signal killed it (the signal itself not reported, as by the CRI).
type mainProc struct {
	cmd    *exec.Cmd
	main   *os.Process // runc's: a pidfd-backed handle, nil until it runs
	cgroup string      // in the unified hierarchy
	// id is runc's container id ("" on the namespaces backend), and
	// killAll, runc kill --all while runc still has the container.
	id       string
	killAll  func()
	done     chan struct{}
	code     int
	sig      syscall.Signal
	exitedAt time.Time // when the wait returned: the reap, as a shim sees it
}

func (p *mainProc) PID() int {
	if p.main == nil {
		return 0
	}
	return p.main.Pid
}

func (p *mainProc) wait() {
	// Process.Wait, not Cmd.Wait: the output pipe belongs to the pod, and
	// orphans may hold it open.
	ps, err := p.cmd.Process.Wait()
	p.exitedAt = time.Now()
	p.code = 128
	if err == nil {
		switch ws := ps.Sys().(syscall.WaitStatus); {
		case !ws.Signaled():
			p.code = ws.ExitStatus()
		case p.id != "":
			// runc itself was killed: its container's status is lost.
			p.code = 128 + int(ws.Signal())
		default:
			p.sig = ws.Signal()
			p.code = 128 + int(p.sig)
		}
	}
	close(p.done)
}

func (p *mainProc) Wait() (int, syscall.Signal) {
	<-p.done
	return p.code, p.sig
}

// ExitedAt is when the main process was reaped (its wait returned; on
// runc, runc run's), on this host's clock; zero while it runs. The
// benchmarks (e2e/bench) measure from it, as from the moment a shim's wait
// returns.
func (p *mainProc) ExitedAt() time.Time {
	select {
	case <-p.done:
		return p.exitedAt
	default:
		return time.Time{}
	}
}

// Signal sends sig to the main process itself (on runc through its pidfd,
// as containerd's shim does for the kubelet).
func (p *mainProc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return os.ErrProcessDone
	default:
	}
	if p.main == nil {
		return errors.New("container not started")
	}
	return p.main.Signal(sig)
}

// KillAll kills what is left in the container: runc kill --all while runc
// still has it, then the cgroup's cgroup.kill.
func (p *mainProc) KillAll() {
	select {
	case <-p.done:
	default:
		if p.killAll != nil {
			p.killAll()
		}
	}
	killCgroup(p.cgroup)
}
