package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// usage is a process's scheduler counters, summed over its threads.
type usage struct {
	// cpuNS is the time on a CPU (schedstat's first field).
	cpuNS uint64
	// switches is voluntary plus involuntary context switches: each is a
	// wake-up (or a preemption) of one of its threads.
	switches uint64
	threads  int
}

// readUsage sums /proc/PID/task/*/schedstat and the context-switch counts
// of /proc/PID/task/*/status. (/proc/PID/status counts the main thread
// only.) A thread that ended between two readings takes its counts with
// it; Go programs seldom end threads.
func readUsage(pid int) (usage, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return usage{}, fmt.Errorf("pid %d: no tasks (%v)", pid, err)
	}
	var u usage
	for _, t := range tasks {
		ss, err := os.ReadFile(t + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(ss))
		if len(f) < 1 {
			return usage{}, fmt.Errorf("%s/schedstat: %q", t, ss)
		}
		ns, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return usage{}, fmt.Errorf("%s/schedstat: %w", t, err)
		}
		st, err := measure.Counters(t + "/status")
		if err != nil {
			continue
		}
		u.cpuNS += ns
		u.switches += st["voluntary_ctxt_switches"] + st["nonvoluntary_ctxt_switches"]
		u.threads++
	}
	if u.threads == 0 {
		return usage{}, fmt.Errorf("pid %d: gone", pid)
	}
	return u, nil
}

func (u usage) sub(v usage) usage {
	return usage{cpuNS: u.cpuNS - v.cpuNS, switches: u.switches - v.switches, threads: u.threads}
}

// memory is a process's resident set now and at its peak, in kB.
type memory struct{ rssKB, hwmKB uint64 }

func readMemory(pid int) (memory, error) {
	st, err := measure.Counters(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	return memory{rssKB: st["VmRSS"], hwmKB: st["VmHWM"]}, nil
}

// sleepingIn summarises where a process's threads sleep in the kernel
// (/proc/PID/task/*/wchan), e.g. "futex_wait_queue ×5, do_epoll_wait ×1":
// a thread that polls would show a timer wait here.
func sleepingIn(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	count := map[string]int{}
	for _, t := range tasks {
		b, err := os.ReadFile(t + "/wchan")
		if err != nil {
			continue
		}
		w := strings.TrimSpace(string(b))
		if w == "" || w == "0" {
			w = "running"
		}
		count[w]++
	}
	names := make([]string, 0, len(count))
	for n := range count {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if count[names[i]] != count[names[j]] {
			return count[names[i]] > count[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s ×%d", n, count[n])
	}
	return strings.Join(parts, ", ")
}
