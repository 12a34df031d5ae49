package supervisor

import (
	"errors"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// Scanner returns the pod as /proc shows it now, and what it shows of one
// process: its signal dispositions, its children.
type Scanner interface {
	Scan() (procscan.Pod, error)
	// Named reports whether containers are known by their Kubernetes names.
	Named() bool
	Signals(pid int) (procscan.Signals, error)
	Children(pid int) ([]procscan.Process, error)
	// Args is a process's whole command line (a sidecar's, for its stop's
	// flags: see procscan.Scanner.Args).
	Args(pid int) ([]string, error)
	// LastPID is the PID the kernel allocated last in the pod (see
	// procscan.Scanner.LastPID): when it has not moved since a scan, the
	// next scan finds no new process. An error means it cannot be read.
	LastPID() (int, error)
	// Age is how long ago a process started (procscan.Age).
	Age(p procscan.Process) (time.Duration, error)
}

// ProcScanner is the real Scanner: procscan over a proc filesystem.
type ProcScanner struct {
	Procs *procscan.Scanner
	Self  int
	Rules procscan.Rules
	// Names are the rules by Kubernetes name; their PodUID is empty where
	// the names cannot be read (NewProcScanner).
	Names procscan.NameRules
	// kube caches the names read, by main process (those of the last scan).
	kube map[instance]procscan.Kube
}

// NewProcScanner is the real Scanner of the pod that the process self (a
// PID in procs's namespace) is in. It reads the supervisor's own container's
// Kubernetes identity: where the kubelet's mount shows it, every container
// is known by its name (NameRules, with apps and sidecars by name); where
// it does not (another runtime, a pod built by hand), the rules by process
// name alone tell the containers apart. self is also how it says which.
func NewProcScanner(procs *procscan.Scanner, self int, rules procscan.Rules, apps, sidecars []string) (*ProcScanner, procscan.Kube, error) {
	p := &ProcScanner{Procs: procs, Self: self, Rules: rules, kube: map[instance]procscan.Kube{}}
	own, err := procs.Kube(self)
	if err != nil {
		return nil, own, err
	}
	if own.Known() {
		p.Names = procscan.NameRules{PodUID: own.PodUID, Apps: apps, Sidecars: sidecars}
	}
	return p, own, nil
}

// Named reports whether the kubelet's names can be read here.
func (p *ProcScanner) Named() bool { return p.Names.PodUID != "" }

// PodUID is the pod's UID, where the kubelet's names can be read ("" else).
func (p *ProcScanner) PodUID() string { return p.Names.PodUID }

// Scan reads /proc and classifies its processes, by name where it can. It
// keeps a few values per container, whatever the pod's process count
// (procscan.Scanner.Scan): under restartPolicy Never, a supervisor killed
// for its memory would leave the sidecar running and the Job with it.
func (p *ProcScanner) Scan() (procscan.Pod, error) {
	pod, err := p.Procs.Scan(p.Self, p.Rules)
	if err != nil {
		return procscan.Pod{}, err
	}
	if p.Names.PodUID != "" {
		mains := map[int]procscan.Process{}
		for _, c := range pod.Containers {
			mains[c.Main.PID] = c.Main
		}
		for k := range p.kube {
			if m, ok := mains[k.pid]; !ok || m.StartTime != k.start {
				delete(p.kube, k) // gone: the cache holds the pod's main processes only
			}
		}
		pod.Name(func(pid int) (procscan.Kube, bool) { return p.kubeOf(mains[pid]) }, p.Names)
	}
	return pod, nil
}

// kubeOf reads a main process's identity once: a process's mounts are set
// before it execs its command. One not found is read again next time (a
// process caught before its mounts were made). ending: the process has
// begun to exit, or is gone, since it was scanned: its mounts are gone
// with it, and so is its name.
func (p *ProcScanner) kubeOf(main procscan.Process) (procscan.Kube, bool) {
	key := instance{main.PID, main.StartTime}
	if k, ok := p.kube[key]; ok {
		return k, false
	}
	k, err := p.Procs.Kube(main.PID)
	if err == nil && k.Known() {
		p.kube[key] = k
		return k, false
	}
	now, err := p.Procs.Process(main.PID)
	return k, err != nil || now.Exiting || now.StartTime != main.StartTime
}

// Args reads a process's command line.
func (p *ProcScanner) Args(pid int) ([]string, error) { return p.Procs.Args(pid) }

// LastPID reads the PID the kernel allocated last in the pod.
func (p *ProcScanner) LastPID() (int, error) { return p.Procs.LastPID() }

// Age is how long ago a process started, by the kernel's boot clock.
func (p *ProcScanner) Age(proc procscan.Process) (time.Duration, error) { return procscan.Age(proc) }

// Signals reads a process's signal dispositions.
func (p *ProcScanner) Signals(pid int) (procscan.Signals, error) { return p.Procs.Signals(pid) }

// Children lists a process's children, from a scan of the whole of /proc
// where the kernel has no children files.
func (p *ProcScanner) Children(pid int) ([]procscan.Process, error) {
	kids, err := p.Procs.Children(pid)
	if !errors.Is(err, procscan.ErrNoChildrenFile) {
		return kids, err
	}
	err = p.Procs.Each(func(q procscan.Process) {
		if q.PPID == pid {
			kids = append(kids, q)
		}
	})
	if err != nil {
		return nil, err
	}
	return kids, nil
}
