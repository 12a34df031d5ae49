package supervisor

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	// MethodPtrace traces each app's main thread (any kernel, CAP_SYS_PTRACE).
	MethodPtrace Method = "ptrace"
	// MethodNone sees exits but not their status.
	MethodNone Method = "none"
)

// ExitStatusMode is SUPERVISOR_EXIT_STATUS: a method, or auto.
type ExitStatusMode string

// The modes.
const (
	ModeAuto   ExitStatusMode = "auto"
	ModePidfd  ExitStatusMode = "pidfd"
	ModePtrace ExitStatusMode = "ptrace"
	ModeNone   ExitStatusMode = "none"
)

// UnmarshalText lets env parse a mode.
func (m *ExitStatusMode) UnmarshalText(b []byte) error {
	switch v := ExitStatusMode(strings.ToLower(strings.TrimSpace(string(b)))); v {
	case ModeAuto, ModePidfd, ModePtrace, ModeNone:
		*m = v
		return nil
	}
	return fmt.Errorf("want auto, pidfd, ptrace or none")
}

// Choice is the method picked at start-up and why.
type Choice struct {
	Method Method
	// Reason explains a method other than pidfd, with the fix.
	Reason string
}

// SelectMethod picks how exit statuses are read. auto takes pidfd exit
// info where the kernel has it, else ptrace where permitted, else none; a
// forced method that cannot work is an error. ptrace is probed only when
// it may be chosen.
func SelectMethod(mode ExitStatusMode, pidfd PidfdSupport, ptrace func() PtraceSupport) (Choice, error) {
	switch mode {
	case ModeNone:
		return Choice{Method: MethodNone, Reason: "SUPERVISOR_EXIT_STATUS=none"}, nil
	case ModePidfd:
		if !pidfd.ExitInfo {
			return Choice{}, fmt.Errorf("%sEXIT_STATUS=pidfd cannot work here: %s; use auto, or ptrace", EnvPrefix, pidfd.Reason)
		}
		return Choice{Method: MethodPidfd}, nil
	case ModePtrace:
		if p := ptrace(); !p.OK {
			return Choice{}, fmt.Errorf("%sEXIT_STATUS=ptrace cannot work here: %s", EnvPrefix, p.Reason)
		}
		return Choice{Method: MethodPtrace}, nil
	}
	if pidfd.ExitInfo {
		return Choice{Method: MethodPidfd}, nil
	}
	p := ptrace()
	if p.OK {
		return Choice{Method: MethodPtrace, Reason: pidfd.Reason}, nil
	}
	return Choice{Method: MethodNone, Reason: pidfd.Reason + "; and " + p.Reason +
		". Fix: add SYS_PTRACE (see deploy/job-ptrace.yaml), or run on Linux 6.15+"}, nil
}

// errUnsupported wraps errors.ErrUnsupported with what is missing.
func errUnsupported(what string) error {
	return fmt.Errorf("%s: %w", what, errors.ErrUnsupported)
}
