package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// usage is what one container used, from its cgroup.
type usage struct {
	cpu  time.Duration // cpu.stat usage_usec: every thread, user and system
	peak uint64        // bytes: memory.max_usage_in_bytes (v1) or memory.peak (v2)
	// atExit: read once the cgroup was empty (populated 0) and before runc
	// removed it, so nothing is missed; else the last periodic sample.
	atExit bool
	// gone: the cgroup has been removed (or was read at exit): no more
	// readings will come.
	gone bool
}

// acct follows the containers' cgroups on this node and keeps each one's
// CPU time and peak memory past the container's removal.
//
// containerd's CRI plugin, told no cgroup parent by the kubelet
// (cgroupsPerQOS false, cgroupfs driver), has runc put every container in
// PARENT/<container ID> of each hierarchy (PARENT is k8s.io here). On a
// hybrid host the v1 hierarchies carry the controllers; the v2 (unified) one
// has none bound to it, but still keeps each cgroup's base CPU time
// (cpu.stat) and its cgroup.events, whose "populated" line turns 0 when the
// last process has left, which inotify reports. runc removes the cgroup
// only after the shim has reaped the container and containerd has deleted
// its task: the final figures are read between the two. A periodic sample
// (every interval) is the fallback when that read loses the race.
type acct struct {
	unified  string // the v2 hierarchy's PARENT directory
	memory   string // the v1 memory hierarchy's PARENT directory; "" on a v2-only host
	interval time.Duration

	ino     int
	mu      sync.Mutex
	ctrs    map[string]*usage // by container ID
	watches map[int32]string  // inotify watch descriptor -> container ID
	errs    []error
}

// newAcct finds the hierarchies from /proc/self/mountinfo; parent is the
// directory containerd puts the containers' cgroups in.
func newAcct(parent string, interval time.Duration) (*acct, error) {
	a := &acct{interval: interval, ctrs: map[string]*usage{}, watches: map[int32]string{}}
	unified, err := pod.CgroupMount("")
	if err != nil {
		return nil, err
	}
	if memory, _ := pod.CgroupMount("memory"); memory != "" {
		a.memory = filepath.Join(memory, parent)
	}
	if a.unified = filepath.Join(unified, parent); unified == "" {
		return nil, errors.New("no cgroup v2 hierarchy mounted (hybrid or unified): the per-container accounting needs its cpu.stat and cgroup.events")
	}
	a.ino, err = unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	return a, nil
}

func (a *acct) run(ctx context.Context) {
	defer unix.Close(a.ino)
	fds := []unix.PollFd{{Fd: int32(a.ino), Events: unix.POLLIN}}
	next := time.Now()
	for ctx.Err() == nil {
		if !time.Now().Before(next) {
			a.scan()
			next = time.Now().Add(a.interval)
		}
		wait := time.Until(next)
		if _, err := unix.Poll(fds, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			a.fail(fmt.Errorf("poll inotify: %w", err))
			return
		}
		a.events()
	}
}

// scan adopts new container cgroups (watching their cgroup.events) and
// samples the ones not read at exit yet.
func (a *acct) scan() {
	ents, err := os.ReadDir(a.unified)
	if errors.Is(err, fs.ErrNotExist) {
		return // no container yet: runc makes the directory with the first
	}
	if err != nil {
		a.fail(fmt.Errorf("list %s: %w", a.unified, err))
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		id := e.Name()
		if _, ok := a.ctrs[id]; ok {
			continue
		}
		u := &usage{}
		a.ctrs[id] = u
		wd, err := unix.InotifyAddWatch(a.ino, filepath.Join(a.unified, id, "cgroup.events"), unix.IN_MODIFY)
		if err != nil {
			// Removed in between: a container too short-lived to matter here.
			u.gone = true
			continue
		}
		a.watches[int32(wd)] = id
	}
	for id, u := range a.ctrs {
		if !u.gone {
			a.sample(id, u, false)
		}
	}
}

// events handles what inotify has queued: a cgroup.events change, read for
// "populated 0"; IN_IGNORED once the cgroup is gone.
func (a *acct) events() {
	var buf [64 * (unix.SizeofInotifyEvent + unix.NAME_MAX + 1)]byte
	for {
		n, err := unix.Read(a.ino, buf[:])
		if err != nil || n <= 0 {
			return // EAGAIN: nothing more
		}
		a.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			id, ok := a.watches[ev.Wd]
			if !ok {
				continue
			}
			u := a.ctrs[id]
			switch {
			case ev.Mask&unix.IN_IGNORED != 0:
				delete(a.watches, ev.Wd)
				u.gone = true
			case ev.Mask&unix.IN_MODIFY != 0 && !u.gone && !populated(filepath.Join(a.unified, id, "cgroup.events")):
				a.sample(id, u, true)
			}
		}
		a.mu.Unlock()
	}
}

// populated reads a cgroup.events file; a file that cannot be read counts
// as populated (the periodic sample stands).
func populated(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return true
	}
	return !bytes.Contains(b, []byte("populated 0"))
}

// sample reads a container's counters; atExit marks the final reading. A
// failed read leaves the last sample in place.
func (a *acct) sample(id string, u *usage, atExit bool) {
	cpu, err := cpuStat(filepath.Join(a.unified, id, "cpu.stat"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV) {
			u.gone = true
		}
		return
	}
	var peak uint64
	if a.memory != "" {
		peak, err = measure.ReadUint(filepath.Join(a.memory, id, "memory.max_usage_in_bytes"))
	} else {
		peak, err = measure.ReadUint(filepath.Join(a.unified, id, "memory.peak"))
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV) {
			u.gone = true
		}
		return
	}
	u.cpu, u.peak = cpu, peak
	if atExit {
		u.atExit, u.gone = true, true
	}
}

func cpuStat(path string) (time.Duration, error) {
	st, err := measure.Counters(path)
	us, ok := st["usage_usec"]
	if err == nil && !ok {
		err = fmt.Errorf("%s has no usage_usec", path)
	}
	return time.Duration(us) * time.Microsecond, err
}

func (a *acct) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

// final waits, up to limit, until every one of ids is read for the last
// time, and returns what each used. A container never seen is an error.
func (a *acct) final(ctx context.Context, ids []string, limit time.Duration) (map[string]usage, error) {
	deadline := time.Now().Add(limit)
	for {
		a.mu.Lock()
		if len(a.errs) > 0 {
			err := errors.Join(a.errs...)
			a.mu.Unlock()
			return nil, err
		}
		got, pending := map[string]usage{}, ""
		for _, id := range ids {
			u, ok := a.ctrs[id]
			switch {
			case !ok || !u.gone:
				pending = id
			default:
				got[id] = *u
			}
		}
		_, seen := a.ctrs[pending]
		a.mu.Unlock()
		if pending == "" {
			return got, nil
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			if !seen {
				return nil, fmt.Errorf("container %s: no cgroup seen under %s (set -cgroup-parent to the directory containerd uses)", pending, a.unified)
			}
			return nil, fmt.Errorf("container %s: cgroup still populated %s after the pod ended", pending, limit)
		}
		time.Sleep(a.interval)
	}
}
