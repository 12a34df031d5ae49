// Package exitwatch learns, from inside a pod, that a process of another
// container has exited, and with what status, and signals processes
// safely. The process is never our child (its parent is the runtime's shim,
// outside the pod's PID namespace), so wait(2) cannot tell; three methods
// can, each with its price:
//
//	pidfd       PIDFD_INFO_EXIT (Linux 6.15+): the status the real parent
//	            reaps, read through a pidfd; exact, no privileges
//	ptrace      the status as the process's tracer (any kernel); exact,
//	            needs CAP_SYS_PTRACE, and a traced process cannot be
//	            strace'd
//	accounting  the kernel's process accounting record of the exit (any
//	            kernel with CONFIG_BSD_PROCESS_ACCT_V3); outlives the
//	            process, not the supervisor's container; needs
//	            CAP_SYS_PACCT and a state directory; a failure's status
//	            is exact, exit 0 reads unknown: the kernel records 0 too
//	            when a threaded program's main thread has not yet taken
//	            its code (acct_linux.go)
//	none        a pidfd alone (Linux 5.3+): the exit is seen, its status
//	            unknown
//
// New probes the kernel with real calls (never its version: seccomp can
// block a call the version says exists), chooses the method (auto takes the
// first that works, in that order) and says why. Accounting, where it
// works, is on whatever the method: a status the method lost (the process
// reaped before it was watched, or ended unread just before the
// supervisor was killed) is read from its record. Watch takes an app, whose
// status is wanted; Track a sidecar, whose exit alone matters (a pidfd
// whatever the method). Both take a PID with its start time, and refuse a
// PID recycled since the scan that found it; a process so taken is
// signalled through its pidfd, so a signal can never reach a newcomer with
// its PID.
//
// This file holds what every platform shares; the Linux parts are in
// _linux.go files, and exitwatch_other.go makes the package build (and
// fail at New) elsewhere.
package exitwatch

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Method says how exit statuses are read.
type Method string

// The methods, and Auto, which chooses one.
const (
	Auto       Method = "auto"
	Pidfd      Method = "pidfd"
	Accounting Method = "accounting"
	Ptrace     Method = "ptrace"
	None       Method = "none"
)

// UnmarshalText accepts a method or auto, in any case.
func (m *Method) UnmarshalText(b []byte) error {
	switch v := Method(strings.ToLower(strings.TrimSpace(string(b)))); v {
	case Auto, Pidfd, Accounting, Ptrace, None:
		*m = v
		return nil
	}
	return errors.New("want auto, pidfd, accounting, ptrace or none")
}

// Process names one process for good: its PID, and its start time (field
// 22 of /proc/PID/stat, clock ticks since boot), which a recycled PID does
// not share.
type Process struct {
	PID       int
	StartTime uint64
}

// ErrGone means the process exited (and was reaped) before it could be
// taken or signalled: an expected event, not a failure.
var ErrGone = errors.New("process is gone")

// Proc is a process kept by a pidfd: signals reach exactly it, and its exit
// is reported once.
type Proc interface {
	PID() int
	// Signal sends sig. A process that has exited yields ErrGone.
	Signal(sig Signal) error
	// Done is closed once the process has exited (for a watched app: once
	// it has been reaped and its status read, when the method allows).
	Done() <-chan struct{}
	// Status is valid once Done is closed.
	Status() Status
	// Close releases the pidfd.
	Close() error
}

// Config says which method to use and how to probe for it.
type Config struct {
	// Method is the wanted method, or Auto.
	Method Method
	// Probe is a command that exits with code 7 once its stdin closes (the
	// supervisor's own binary, in its probe-exit mode): the real process
	// the probes watch.
	Probe []string
	// Setting names the setting that chose Method, for the messages.
	Setting string
	// Dir is where process accounting keeps its records (the state
	// directory, which a restarted supervisor finds again), or "": no
	// accounting.
	Dir string
}

// Choice is the method New chose, and why.
type Choice struct {
	Method Method
	// Reason explains a method other than pidfd, with the fix.
	Reason string
	// Accounting is on: a status the method lost is read from its
	// record. AccountingOff says why it is not, with the fix;
	// AccountingFailed, that it was wanted (CAP_SYS_PACCT given) and
	// could not work.
	Accounting       bool
	AccountingOff    string
	AccountingFailed bool
	// Refused says why a forced method cannot work here; Method is then
	// auto's choice, so that the supervisor still runs (a bad setting).
	Refused string
}

// support is what a probe found.
type support struct {
	ok     bool
	reason string // why not, with the fix
	failed bool   // wanted, and failed (accounting with CAP_SYS_PACCT)
}

// choose picks the method. auto takes pidfd where the kernel gives exit
// statuses, else ptrace where permitted, else accounting where it works,
// else none; a forced method that cannot work gives auto's choice, and
// why it was refused. ptrace is probed only when it may be chosen, once.
func choose(cfg Config, pidfd, acct support, ptrace func() support) Choice {
	ptrace = sync.OnceValue(ptrace)
	var refused string
	switch cfg.Method {
	case None:
		return Choice{Method: None, Reason: cfg.Setting + "=none"}
	case Pidfd:
		if pidfd.ok {
			return Choice{Method: Pidfd}
		}
		refused = fmt.Sprintf("%s=pidfd cannot work here: %s; use auto, accounting or ptrace", cfg.Setting, pidfd.reason)
	case Accounting:
		if acct.ok {
			return Choice{Method: Accounting}
		}
		refused = fmt.Sprintf("%s=accounting cannot work here: %s", cfg.Setting, acct.reason)
	case Ptrace:
		if p := ptrace(); p.ok {
			return Choice{Method: Ptrace}
		}
		refused = fmt.Sprintf("%s=ptrace cannot work here: %s", cfg.Setting, ptrace().reason)
	}
	c := chooseAuto(pidfd, acct, ptrace)
	c.Refused = refused
	return c
}

func chooseAuto(pidfd, acct support, ptrace func() support) Choice {
	if pidfd.ok {
		return Choice{Method: Pidfd}
	}
	p := ptrace()
	if p.ok {
		return Choice{Method: Ptrace, Reason: pidfd.reason}
	}
	if acct.ok {
		return Choice{Method: Accounting, Reason: pidfd.reason + "; and ptrace: " + p.reason}
	}
	return Choice{Method: None, Reason: pidfd.reason + "; and ptrace: " + p.reason + "; and accounting: " + acct.reason +
		". Fix: add SYS_PACCT or SYS_PTRACE, as root (see deploy/job-ptrace.yaml), or run on Linux 6.15+"}
}

// Status is how a process ended, as far as the kernel told.
type Status struct {
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
func (s Status) Success() bool { return s.Known && s.Signal == 0 && s.Code == 0 }

// Failure reports a known exit with a non-zero code or by a signal.
func (s Status) Failure() bool { return s.Known && !s.Success() }

// ContainerCode is the exit code the kubelet would report: 128+signal for a
// process killed by a signal (the shell convention runc follows).
func (s Status) ContainerCode() int {
	if s.Signal != 0 {
		return 128 + int(s.Signal)
	}
	return s.Code
}

func (s Status) String() string {
	switch {
	case !s.Known:
		return "unknown (" + s.Reason + ")"
	case s.Signal != 0:
		return "killed by " + s.Signal.String()
	}
	return "exit " + strconv.Itoa(s.Code)
}

// decodeWaitStatus turns a raw wait(2) status (as PIDFD_INFO_EXIT and
// wait4 give it) into a Status.
func decodeWaitStatus(ws uint32) Status {
	// WTERMSIG is the low 7 bits; 0x7f there marks a stopped (not exited)
	// process, which an exit status never is; bit 7 is the core-dump flag.
	if sig := ws & 0x7f; sig != 0 && sig != 0x7f {
		return Status{Known: true, Signal: Signal(sig)}
	}
	return Status{Known: true, Code: int(ws>>8) & 0xff}
}

// Signal is a Linux signal number, parsed from a name such as "SIGTERM",
// "term" or "15".
type Signal int

// The signals the supervisor sends itself.
const (
	SIGINT  Signal = 2
	SIGKILL Signal = 9
	SIGTERM Signal = 15
)

// signalNames are the Linux (x86, arm64) numbers. Kept as data rather than
// taken from x/sys/unix so the package builds on any OS.
var signalNames = map[string]Signal{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12,
	"SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17,
	"SIGCONT": 18, "SIGSTOP": 19, "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22,
	"SIGURG": 23, "SIGXCPU": 24, "SIGXFSZ": 25, "SIGVTALRM": 26, "SIGPROF": 27,
	"SIGWINCH": 28, "SIGIO": 29, "SIGPWR": 30, "SIGSYS": 31,
}

// ParseSignal accepts a signal name with or without "SIG", in any case, or a
// number from 1 to 64 (real-time signals included).
func ParseSignal(s string) (Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal number %d out of range 1-64", n)
		}
		return Signal(n), nil
	}
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

// String returns the signal's name, e.g. "SIGTERM", or "SIG42".
func (s Signal) String() string {
	for name, n := range signalNames {
		if n == s {
			return name
		}
	}
	return "SIG" + strconv.Itoa(int(s))
}

// UnmarshalText lets a configuration parser read a Signal.
func (s *Signal) UnmarshalText(b []byte) error {
	sig, err := ParseSignal(string(b))
	if err != nil {
		return err
	}
	*s = sig
	return nil
}

// Graceful reports whether sig's default action would end the process
// (terminate or dump core): a process must handle such a signal before it
// is sent one, if its death is not the point. SIGKILL needs no handler.
func (s Signal) Graceful() bool {
	switch s {
	case SIGKILL, 17, 18, 19, 20, 21, 22, 23, 28: // KILL, CHLD, CONT, STOP, TSTP, TTIN, TTOU, URG, WINCH
		return false
	}
	return true
}
