package supervisor

import (
	"errors"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Scanner returns the pod as /proc shows it now, and what it shows of one
// process: its signal dispositions, its children.
type Scanner interface {
	Scan() (procscan.Pod, error)
	Signals(pid int) (procscan.Signals, error)
	Children(pid int) ([]procscan.Process, error)
}

// ProcScanner is the real Scanner: procscan over a proc filesystem.
type ProcScanner struct {
	Procs *procscan.Scanner
	Self  int
	Rules procscan.Rules
}

// Scan reads /proc and classifies its processes.
func (p ProcScanner) Scan() (procscan.Pod, error) {
	procs, err := p.Procs.Processes()
	if err != nil {
		return procscan.Pod{}, err
	}
	return procscan.Classify(procs, p.Self, p.Rules), nil
}

// Signals reads a process's signal dispositions.
func (p ProcScanner) Signals(pid int) (procscan.Signals, error) { return p.Procs.Signals(pid) }

// Children lists a process's children, from a scan of the whole of /proc
// where the kernel has no children files.
func (p ProcScanner) Children(pid int) ([]procscan.Process, error) {
	kids, err := p.Procs.Children(pid)
	if !errors.Is(err, procscan.ErrNoChildrenFile) {
		return kids, err
	}
	procs, err := p.Procs.Processes()
	if err != nil {
		return nil, err
	}
	for _, q := range procs {
		if q.PPID == pid {
			kids = append(kids, q)
		}
	}
	return kids, nil
}
