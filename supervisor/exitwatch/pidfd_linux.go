//go:build linux

package exitwatch

// The kernel features used here, and the release that added each:
//
//	pidfd_send_signal(2)   5.1
//	pidfd_open(2)          5.3   also on processes that are not our children
//	poll on a pidfd        5.3   POLLIN once the process exits (zombie);
//	                             POLLHUP once it is reaped (a wake-up at reap
//	                             from 6.15 on)
//	PIDFD_GET_INFO ioctl   6.13
//	PIDFD_INFO_EXIT        6.15  the wait status, recorded when the real parent
//	                             reaps the process, readable by anyone holding a
//	                             pidfd opened before that; no privileges needed
//
// Features are probed with real calls (probePidfd), never from the kernel
// version: seccomp can block a call the version says exists.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// checkPidfd checks that pidfd_open works at all: without it (before 5.3,
// or a seccomp profile denying it) the supervisor cannot work.
func checkPidfd() error {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w (the supervisor needs Linux 5.3 or later, or gVisor release-20260504.0 or later, and a seccomp profile that allows pidfd_open, such as RuntimeDefault; this kernel is %s)", err, kernelName())
	}
	return unix.Close(fd)
}

// kernelName is the kernel's release and version as uname gives them.
// gVisor's: "4.19.0-gvisor" ("4.4.0" before its release-20260427.0), and
// "#1 SMP Sun Jan 10 15:06:54 PST 2016".
func kernelName() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown (uname: " + err.Error() + ")"
	}
	return unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
}

// probePidfd checks, by real calls, whether the kernel gives exit statuses
// through pidfds: it starts argv (a process that must exit with code 7 at
// once), opens a pidfd on it, reaps it, and asks. A probe that fails
// (runProbe) only says pidfd cannot give statuses: auto then tries the
// other methods, and at worst runs with statuses unknown, never exits.
func probePidfd(argv []string) support {
	fd, oerr := -1, error(nil)
	err := runProbe(argv, "exit probe", func(pid int) { fd, oerr = unix.PidfdOpen(pid, 0) })
	if fd >= 0 {
		defer unix.Close(fd)
	}
	switch {
	case err != nil:
		return support{reason: err.Error()}
	case oerr != nil:
		return support{reason: fmt.Sprintf("pidfd_open of the exit probe: %v", oerr)}
	}
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	switch err := unix.IoctlPidfdInfo(fd, &info); {
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL):
		// ENOTTY: no PIDFD_GET_INFO (before 6.13).
		return support{reason: "the kernel has no PIDFD_GET_INFO (Linux 6.15+ has it)"}
	case err != nil:
		return support{reason: fmt.Sprintf("PIDFD_GET_INFO: %v", err)}
	case info.Mask&unix.PIDFD_INFO_EXIT == 0:
		// 6.13 and 6.14 know the ioctl but not PIDFD_INFO_EXIT.
		return support{reason: "the kernel has no PIDFD_INFO_EXIT (Linux 6.15+ has it)"}
	case decodeWaitStatus(uint32(info.Exit_code)) != Status{Known: true, Code: 7}:
		return support{reason: fmt.Sprintf("PIDFD_INFO_EXIT gave status %#x for an exit with code 7", info.Exit_code)}
	}
	return support{ok: true}
}

// runProbe starts argv, our child, which must exit with code 7 at once (its
// stdin is /dev/null), calls started with its PID while it is ours (not
// yet reaped), and reaps it. A child that has not exited within probeLimit
// (a node that keeps this container off the CPU) is killed: an error, as
// a failed start or another status is.
func runProbe(argv []string, name string, started func(pid int)) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s %s: %w", name, argv[0], err)
	}
	started(cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(probeLimit):
		cmd.Process.Kill() // reaped by the Wait above, whenever it ends
		return fmt.Errorf("%s %s did not exit within %s: the node keeps this container off the CPU (raise its CPU request)", name, argv[0], probeLimit)
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.ExitCode() != 7 {
		return fmt.Errorf("%s %s: want exit status 7, got %v", name, argv[0], werr)
	}
	return nil
}

// pidfds holds processes by pidfd and waits for all of them on one epoll
// instance, in one goroutine: no polling, one blocked thread however many
// processes are watched.
type pidfds struct {
	epfd     int
	wake     int // eventfd that stops the loop
	loopDone chan struct{}

	mu     sync.Mutex
	procs  map[int32]*pidfdProc
	nextID int32
	closed bool
}

// newPidfds starts the wait loop.
func newPidfds() (*pidfds, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	// id 0 is the wake-up eventfd; processes get ids from 1.
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: 0}); err != nil {
		unix.Close(wake)
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	k := &pidfds{epfd: epfd, wake: wake, loopDone: make(chan struct{}), procs: map[int32]*pidfdProc{}}
	go k.loop()
	return k, nil
}

// open holds p by a pidfd and starts watching for its exit. With
// wantStatus (PIDFD_INFO_EXIT) it is done once reaped, its status read;
// else once it exits (POLLIN), with the status unknown for reason.
func (k *pidfds) open(p Process, wantStatus bool, reason string) (*pidfdProc, error) {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("pid %d: %w", p.PID, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", p.PID, err)
	}
	// The PID may have been recycled between the scan and pidfd_open. If the
	// start time still matches now, the process held the PID throughout, so
	// the pidfd is its. If the process is gone already, the pidfd refers to
	// it unless the PID was recycled *and* the newcomer also died within
	// this window, which needs the PID counter to wrap around: accepted.
	st, err := startTime(p.PID)
	switch {
	case errors.Is(err, ErrGone):
	case err != nil:
		unix.Close(fd)
		return nil, err
	case st != p.StartTime:
		unix.Close(fd)
		return nil, fmt.Errorf("pid %d was recycled (start time %d, scanned %d): %w", p.PID, st, p.StartTime, ErrGone)
	}

	proc := &pidfdProc{k: k, pid: p.PID, fd: fd, done: make(chan struct{}), wantStatus: wantStatus}
	// An app with exit info is done at reap: register no events, and epoll
	// reports only POLLHUP (always reported). Otherwise POLLIN at exit.
	var events uint32 = unix.EPOLLIN
	if wantStatus {
		events = 0
	} else {
		proc.status = Status{Reason: reason}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		unix.Close(fd)
		return nil, errors.New("kernel watcher closed")
	}
	k.nextID++
	proc.id = k.nextID
	if err := unix.EpollCtl(k.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: events, Fd: proc.id}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("epoll_ctl pidfd of %d: %w", p.PID, err)
	}
	k.procs[proc.id] = proc
	return proc, nil
}

func (k *pidfds) loop() {
	defer close(k.loopDone)
	events := make([]unix.EpollEvent, 16)
	for {
		n, err := unix.EpollWait(k.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// Only EBADF/EFAULT/EINVAL, which would be our bug: fail every
			// watched process rather than hang.
			k.failAll(fmt.Sprintf("epoll_wait: %v", err))
			return
		}
		for _, ev := range events[:n] {
			if ev.Fd == 0 {
				return
			}
			k.mu.Lock()
			proc := k.procs[ev.Fd]
			k.mu.Unlock()
			if proc != nil {
				proc.exited(ev.Events)
			}
		}
	}
}

func (k *pidfds) failAll(reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.procs {
		p.finish(Status{Reason: reason})
	}
}

// close stops the loop and releases every pidfd.
func (k *pidfds) close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	procs := k.procs
	k.procs = map[int32]*pidfdProc{}
	k.mu.Unlock()
	var one = []byte{1, 0, 0, 0, 0, 0, 0, 0}
	unix.Write(k.wake, one)
	<-k.loopDone
	for _, p := range procs {
		p.release()
	}
	unix.Close(k.wake)
	return unix.Close(k.epfd)
}

type pidfdProc struct {
	k          *pidfds
	id         int32
	pid        int
	wantStatus bool

	mu     sync.Mutex
	fd     int // -1 once closed
	status Status
	done   chan struct{}
	ended  bool
}

func (p *pidfdProc) PID() int              { return p.pid }
func (p *pidfdProc) Done() <-chan struct{} { return p.done }

func (p *pidfdProc) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// hasExited reports whether the process has exited (its pidfd polls
// readable from the moment it is a zombie), asking the kernel now.
func (p *pidfdProc) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended || p.fd < 0 {
		return p.ended
	}
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// exited runs in the loop when epoll reports the pidfd.
func (p *pidfdProc) exited(events uint32) {
	p.mu.Lock()
	if p.ended || p.fd < 0 {
		p.mu.Unlock()
		return
	}
	status := p.status
	if p.wantStatus {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
		if err := unix.IoctlPidfdInfo(p.fd, &info); err != nil {
			status = Status{Reason: fmt.Sprintf("PIDFD_GET_INFO: %v", err)}
		} else if info.Mask&unix.PIDFD_INFO_EXIT == 0 {
			status = Status{Reason: "the kernel recorded no exit status"}
		} else {
			status = decodeWaitStatus(uint32(info.Exit_code))
		}
	}
	p.mu.Unlock()
	p.finish(status)
}

// finish records the status once, stops watching and wakes Done.
func (p *pidfdProc) finish(status Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.ended = true
	p.status = status
	if p.fd >= 0 {
		// Level-triggered: stop reporting this fd. The pidfd stays open so
		// Signal keeps answering ESRCH rather than hitting a reused fd.
		unix.EpollCtl(p.k.epfd, unix.EPOLL_CTL_DEL, p.fd, nil)
	}
	close(p.done)
}

// Signal sends sig through the pidfd.
func (p *pidfdProc) Signal(sig Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd < 0 {
		return fmt.Errorf("signal pid %d: pidfd closed: %w", p.pid, ErrGone)
	}
	err := unix.PidfdSendSignal(p.fd, unix.Signal(sig), nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal pid %d: %w", p.pid, ErrGone)
	}
	if err != nil {
		return fmt.Errorf("pidfd_send_signal %s to pid %d: %w", sig, p.pid, err)
	}
	return nil
}

// Close stops watching and releases the pidfd.
func (p *pidfdProc) Close() error {
	p.k.mu.Lock()
	delete(p.k.procs, p.id)
	p.k.mu.Unlock()
	p.release()
	return nil
}

func (p *pidfdProc) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd < 0 {
		return
	}
	if !p.ended {
		unix.EpollCtl(p.k.epfd, unix.EPOLL_CTL_DEL, p.fd, nil)
	}
	unix.Close(p.fd)
	p.fd = -1
}
