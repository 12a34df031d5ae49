package supervisor

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// ExitStatus is how a process ended, as far as the kernel told.
type ExitStatus struct {
	// Known is false when the kernel could not tell (Reason says why).
	Known bool
	// Code is the exit code when Signal is 0.
	Code int
	// Signal is the signal that killed the process, or 0.
	Signal Signal
	// Reason explains an unknown status.
	Reason string
}

// Success reports a known exit with code 0.
func (s ExitStatus) Success() bool { return s.Known && s.Signal == 0 && s.Code == 0 }

// Failure reports a known exit with a non-zero code or by a signal.
func (s ExitStatus) Failure() bool { return s.Known && !s.Success() }

// ContainerCode is the exit code the kubelet would report: 128+signal for a
// process killed by a signal (the shell convention runc follows).
func (s ExitStatus) ContainerCode() int {
	if s.Signal != 0 {
		return 128 + int(s.Signal)
	}
	return s.Code
}

func (s ExitStatus) String() string {
	switch {
	case !s.Known:
		return "unknown (" + s.Reason + ")"
	case s.Signal != 0:
		return "killed by " + s.Signal.String()
	}
	return "exit " + strconv.Itoa(s.Code)
}

// decodeWaitStatus turns a raw wait(2) status (as PIDFD_INFO_EXIT and
// wait4 give it) into an ExitStatus.
func decodeWaitStatus(ws uint32) ExitStatus {
	// WTERMSIG is the low 7 bits; 0x7f there marks a stopped (not exited)
	// process, which an exit status never is; bit 7 is the core-dump flag.
	if sig := ws & 0x7f; sig != 0 && sig != 0x7f {
		return ExitStatus{Known: true, Signal: Signal(sig)}
	}
	return ExitStatus{Known: true, Code: int(ws>>8) & 0xff}
}

// ErrGone means the process exited (and was reaped) before it could be held:
// an expected event, not a failure.
var ErrGone = procscan.ErrGone

// Proc is a process held by a pidfd: signals reach exactly it, even if its
// PID is recycled, and its exit is reported once.
type Proc interface {
	PID() int
	// Signal sends sig. A process that has exited yields ErrGone.
	Signal(sig Signal) error
	// Done is closed once the process has exited (for a watched app: once
	// it has been reaped and its status is known, when the method allows).
	Done() <-chan struct{}
	// Status is valid once Done is closed.
	Status() ExitStatus
	// Close releases the pidfd.
	Close() error
}

// Kernel holds processes open. The real one uses pidfds; tests use fakes.
type Kernel interface {
	// Open holds p, checking it is still the process that was scanned
	// (start time, against PID reuse). With status true it is an app
	// whose exit status is wanted; else only its exit matters.
	Open(p procscan.Process, status bool) (Proc, error)
	// Method names how exit statuses are read ("pidfd", "none").
	Method() string
	Close() error
}

// Method names how exit statuses are read.
type Method string

// The methods.
const (
	// MethodPidfd reads PIDFD_INFO_EXIT at reap (Linux 6.15+), no privileges.
	MethodPidfd Method = "pidfd"
	// MethodNone sees exits but not their status.
	MethodNone Method = "none"
)

// errUnsupported wraps errors.ErrUnsupported with what is missing.
func errUnsupported(what string) error {
	return fmt.Errorf("%s: %w", what, errors.ErrUnsupported)
}
