//go:build !linux

package supervisor

import "github.com/sidecar-supervisor/sidecar-supervisor/procscan"

// PidfdSupport is what ProbePidfd found.
type PidfdSupport struct {
	ExitInfo bool
	Reason   string
}

// ProbePidfd fails: pidfds are Linux-only.
func ProbePidfd(argv []string) (PidfdSupport, error) {
	return PidfdSupport{}, errUnsupported("pidfds need Linux")
}

// StartTimer reads a process's start time, for the PID-reuse check.
type StartTimer interface {
	StartTime(pid int) (uint64, error)
}

// PidfdKernel is Linux-only.
type PidfdKernel struct{}

// NewPidfdKernel fails: pidfds are Linux-only.
func NewPidfdKernel(st StartTimer, exitInfo bool) (*PidfdKernel, error) {
	return nil, errUnsupported("pidfds need Linux")
}

func (k *PidfdKernel) Open(p procscan.Process, status bool) (Proc, error) {
	return nil, errUnsupported("pidfds need Linux")
}
func (k *PidfdKernel) Method() string { return string(MethodNone) }
func (k *PidfdKernel) Close() error   { return nil }

// PtraceSupport is what ProbePtrace found.
type PtraceSupport struct {
	OK     bool
	Reason string
}

// ProbePtrace fails: ptrace exit statuses are Linux-only here.
func ProbePtrace(argv []string) PtraceSupport {
	return PtraceSupport{Reason: "ptrace needs Linux"}
}

// PtraceKernel is Linux-only.
type PtraceKernel struct{ *PidfdKernel }

// NewPtraceKernel fails: Linux-only.
func NewPtraceKernel(st StartTimer) (*PtraceKernel, error) {
	return nil, errUnsupported("ptrace needs Linux")
}
