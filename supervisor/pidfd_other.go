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
