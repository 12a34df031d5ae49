package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// memPoint is the memory section's measures of one pod size.
type memPoint struct {
	hwmKB sample // the supervisor's VmHWM when it exits: its peak
	found sample // log's "starting" → "app found": one scan of the pod, about
	// perProcKB is the idle processes' cost each, from /proc/meminfo
	// (MemAvailable before the pod and once they all run).
	perProcKB sample
	failed    int
	lastErr   error
	skipped   string
}

// memWindow is how long discovery goes on scanning the whole pod (a
// second app that never comes): at least a few scans at any size.
func memWindow(procs int) time.Duration {
	return 10*time.Second + time.Duration(procs)*200*time.Microsecond
}

// memGOMEMLIMIT is deploy/'s memory limit, 32 MiB, which the manifests
// give the supervisor as GOMEMLIMIT.
const memGOMEMLIMIT = "33554432"

// memoryScale measures the supervisor's peak memory in pods of procs
// processes, runs pods each: it scans the pod for memWindow, looking for a
// second app that never comes, then the app ends and it stops the sidecar.
// The extra processes are children of the idle program in a filler
// container. It raises what the kernel needs for them (pid_max,
// threads-max) for the section and puts it back after.
func memoryScale(ctx context.Context, e env, procs []int, runs int) map[int]*memPoint {
	out := map[int]*memPoint{}
	for _, n := range procs {
		out[n] = &memPoint{}
	}
	idle := filepath.Join(e.root, "idle")
	if err := writeIdle(idle); err != nil {
		for _, m := range out {
			m.skipped = err.Error()
		}
		return out
	}
	most := 0
	for _, n := range procs {
		most = max(most, n)
	}
	restore, err := raiseLimits(most)
	defer restore()
	if err != nil {
		for _, m := range out {
			m.skipped = err.Error()
		}
		return out
	}
	for _, n := range procs {
		m := out[n]
		// Each idle process costs about 75 kB of the kernel's memory:
		// the largest pods need GiBs the machine may not have free.
		if avail, need := memAvailableKB(), uint64(n)*100+(1<<20); avail < need {
			m.skipped = fmt.Sprintf("needs about %.1f GiB free for %s processes; MemAvailable is %.1f GiB",
				float64(need)/(1<<20), thousands(n), float64(avail)/(1<<20))
			log.Printf("memory: %s", m.skipped)
			continue
		}
		for i := 0; i < runs && ctx.Err() == nil; i++ {
			if err := memoryRun(ctx, e, idle, n, m); err != nil {
				m.failed++
				m.lastErr = err
				log.Printf("memory %d run %d: %v", n, i, err)
			}
		}
		log.Printf("memory: %s processes done: VmHWM %v kB", thousands(n), m.hwmKB)
	}
	return out
}

func memoryRun(ctx context.Context, e env, idle string, n int, m *memPoint) error {
	window := memWindow(n)
	before := memAvailableKB()
	bp, err := startPod(ctx, e, podOpts{method: pidfd, procs: n, idle: idle, supervisorEnv: []string{
		"SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APPS=" + appName(0) + ",ghost",
		"SUPERVISOR_APP_START_TIMEOUT=" + window.String(),
		"SUPERVISOR_SCAN_INTERVAL=100ms",
		"GOMEMLIMIT=" + memGOMEMLIMIT,
	}})
	if err != nil {
		return err
	}
	defer bp.Close()
	// The supervisor starts once the filler's processes all exist (its
	// postStart hook): bounded by the hook's own 2 minutes.
	var pid int
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		if c := bp.Status().Container("supervisor"); c.Started && !c.Running {
			return false, errors.New("it exited")
		}
		pid, err = bp.pid("supervisor")
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("supervisor not running: %w\n%s", err, bp.Describe())
	}
	filled := memAvailableKB()
	s, err := sampleMemory(pid, 50*time.Millisecond)
	if err != nil {
		return err
	}
	defer s.stop()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, window+5*time.Minute, true, func(context.Context) (bool, error) {
		if c := bp.Status().Container("supervisor"); !c.Running {
			return false, errors.New("the supervisor exited")
		}
		return strings.Contains(bp.Logs("supervisor"), "app containers missing"), nil
	}); err != nil {
		return fmt.Errorf("discovery did not end: %w\n%s", err, bp.Describe())
	}
	if _, st, err := bp.endWithin(ctx, 5*time.Minute); err != nil {
		return fmt.Errorf("%w\n%s", err, bp.Describe())
	} else if c := st.Container("supervisor"); c.ExitCode != 0 {
		return fmt.Errorf("supervisor exited %d\n%s", c.ExitCode, bp.Describe())
	}
	hwm := s.stop()
	if hwm == 0 {
		return errors.New("no VmHWM read")
	}
	m.hwmKB = append(m.hwmKB, float64(hwm))
	if d, err := watchingTime(bp.Logs("supervisor")); err == nil {
		m.found = append(m.found, float64(d))
	}
	if before > filled {
		m.perProcKB = append(m.perProcKB, float64(before-filled)/float64(n))
	}
	return nil
}

// memSampler reads a process's VmHWM until it exits.
type memSampler struct {
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	mu   sync.Mutex
	hwm  uint64
}

// sampleMemory reads pid's VmHWM every interval. A reading counts only if
// the process still ran after it (its pidfd not yet readable), so that a
// PID reused after its exit is never read.
func sampleMemory(pid int, every time.Duration) (*memSampler, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	s := &memSampler{done: make(chan struct{})}
	s.wg.Go(func() {
		defer unix.Close(fd)
		for {
			mem, err := readMemory(pid)
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, _ := unix.Poll(fds, 0); n > 0 || err != nil {
				return // exited
			}
			s.mu.Lock()
			s.hwm = max(s.hwm, mem.hwmKB)
			s.mu.Unlock()
			select {
			case <-s.done:
				return
			case <-time.After(every):
			}
		}
	})
	return s, nil
}

func (s *memSampler) stop() uint64 {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hwm
}

func memAvailableKB() uint64 {
	st, err := measure.Counters("/proc/meminfo")
	if err != nil {
		return 0
	}
	return st["MemAvailable"]
}

// raiseLimits makes room for n more processes: kernel.pid_max (the pod's
// PIDs come from the same space as the host's) and kernel.threads-max
// (each process is a thread too). (RLIMIT_NPROC does not hold the filler:
// it runs as root.) It returns what puts them back.
func raiseLimits(n int) (restore func(), err error) {
	var undo []func()
	restore = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	running := threadsNow()
	for _, sc := range []struct {
		file string
		want int
	}{
		{"/proc/sys/kernel/pid_max", min(4<<20, 2*(running+n)+32768)},
		{"/proc/sys/kernel/threads-max", running + 2*n + 10000},
	} {
		u, err := measure.ReadUint(sc.file)
		if err != nil {
			return restore, err
		}
		old := int(u)
		if old >= sc.want {
			continue
		}
		if err := os.WriteFile(sc.file, []byte(strconv.Itoa(sc.want)), 0); err != nil {
			return restore, fmt.Errorf("raise %s to %d: %w", sc.file, sc.want, err)
		}
		log.Printf("memory: %s raised from %d to %d for the section", sc.file, old, sc.want)
		undo = append(undo, func() {
			if err := os.WriteFile(sc.file, []byte(strconv.Itoa(old)), 0); err != nil {
				log.Printf("memory: restore %s to %d: %v", sc.file, old, err)
			}
		})
	}
	return restore, nil
}

// threadsNow is how many threads the machine runs (/proc/loadavg's fourth
// field: running/total).
func threadsNow() int {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0
	}
	_, total, _ := strings.Cut(f[3], "/")
	n, _ := strconv.Atoi(total)
	return n
}
