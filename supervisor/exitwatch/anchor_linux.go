//go:build linux

package exitwatch

// Accounting outlives the supervisor's container when its file is opened
// through a mount of another container that lives longer (acct_linux.go:
// the kernel ends accounting with the mount it was opened through). Once a
// sidecar is found whose container mounts the same state directory (under
// exit-status ptrace the template mounts the state volume in istio-proxy,
// at the same path), the kernel is pointed at the same file through that
// container's view of it, /proc/PID/root/DIR: accounting then lasts as
// long as istio-proxy does, which the supervisor stops only after the
// apps, and the next supervisor reads what ended meanwhile
// (TestAccountingOutlivesItsContainer). Facts, not guesses: the directory
// seen there must be ours (same device and inode), and the process the
// one found (same start time, not a zombie) once the kernel holds the
// file. Reading another uid's /proc/PID/root needs CAP_SYS_PTRACE (the
// ptrace method's); without it, or without the mount, accounting ends
// with the supervisor, as the log says. Should the anchor's container end
// first, the next rotation tick (a second) points the kernel back at the
// supervisor's own mount.

import (
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// procRoot is p's root directory, as /proc shows it.
func procRoot(p Process) string {
	return "/proc/" + strconv.Itoa(p.PID) + "/root"
}

// pointThrough makes the kernel write to pacct.<gen> as p's container
// sees it, and checks that p still runs once the kernel holds the file.
func (a *acctLog) pointThrough(p Process, gen int) error {
	if err := acctOn(procRoot(p) + a.path(gen)); err != nil {
		return err
	}
	if !a.runs(p) {
		// Gone or replaced meanwhile: the kernel may hold the file through
		// a mount about to go.
		return fmt.Errorf("pid %d: %w", p.PID, ErrGone)
	}
	return nil
}

// runs reports whether p still runs: the same process (start time), not a
// zombie (whose mounts may be gone already).
func (a *acctLog) runs(p Process) bool {
	state, st, err := procStat(p.PID)
	return err == nil && st == p.StartTime && state != 'Z' && state != 'X'
}

// anchor points the kernel at the current file through p's mount of the
// state directory, unless it already goes through a process that runs. It
// checks that p's container sees our directory there, and that p is still
// the process found once the kernel holds the file; else the error says
// why, and accounting goes on through our own mount.
func (a *acctLog) anchor(p Process) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.host.PID != 0 && a.runs(a.host) {
		return false, nil
	}
	root := procRoot(p)
	var ours, theirs unix.Stat_t
	if err := unix.Stat(a.dir, &ours); err != nil {
		return false, fmt.Errorf("stat the state directory: %w", err)
	}
	switch err := unix.Stat(root+a.dir, &theirs); {
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		return false, fmt.Errorf("another container's files (%s) are not ours to open: that needs CAP_SYS_PTRACE (exit-status ptrace has it)", root)
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
		return false, fmt.Errorf("its container does not mount the state directory at %s (the template mounts the supervisor's state volume in istio-proxy there under exit-status ptrace)", a.dir)
	case err != nil:
		return false, fmt.Errorf("stat %s: %w", root+a.dir, err)
	case theirs.Dev != ours.Dev || theirs.Ino != ours.Ino:
		return false, fmt.Errorf("its container has another directory at %s, not the supervisor's state volume", a.dir)
	}
	switch err := a.pointThrough(p, a.gen); {
	case errors.Is(err, ErrGone):
		// The kernel holds the file through a mount about to go.
		return false, errors.Join(err, acctOn(a.path(a.gen)))
	case err != nil:
		return false, err // refused: accounting stays where it was
	}
	a.host = p
	return true, nil
}
