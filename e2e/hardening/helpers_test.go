package hardening

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) { pod.RunTests(m) }

var straceOnce = sync.OnceValues(func() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var p string
	err := scripts.Run(ctx, "install-strace.sh", map[string]*string{"STRACE": &p})
	return p, err
})

// strace returns strace's path, installing it from Debian if need be.
func strace(t *testing.T) string {
	t.Helper()
	p, err := straceOnce()
	if err != nil {
		t.Fatalf("strace (e2e/scripts/install-strace.sh): %v", err)
	}
	return p
}

// buildNamespaces builds d on the namespaces backend, for the tests that
// use the host's tools in the pod (strace, sleep(1)), and returns the tools
// too.
func buildNamespaces(t *testing.T, d scenarios.Desc) (scenarios.Built, pod.Tools) {
	t.Helper()
	pod.NeedRoot(t)
	tl := pod.MustTools(t)
	b, err := scenarios.BuildNamespaces(d, tl)
	if err != nil {
		t.Fatal(err)
	}
	return b, tl
}

// patient is the supervisor's settings: scenarios.Patient, then env.
func patient(env ...string) []string { return append(slices.Clone(scenarios.Patient), env...) }

// ended waits until the named containers have run and stopped, and returns
// the pod's status then.
func ended(t *testing.T, p *pod.Pod, names ...string) pod.Status {
	t.Helper()
	return p.MustWaitFor(t, scenarios.EventBound, pod.Ended(names...))
}

// release lets the cued apps end (scenarios.Built.Release).
func release(t *testing.T, b scenarios.Built, apps ...string) {
	t.Helper()
	for _, a := range apps {
		if err := b.Release(a); err != nil {
			t.Fatal(err)
		}
	}
}

// releaseFound lets the cued app end once the supervisor has found it.
func releaseFound(t *testing.T, p *pod.Pod, b scenarios.Built, app string) {
	t.Helper()
	scenarios.WaitLogFor(t, p, "app found", app)
	release(t, b, app)
}

// waitUntil polls cond (a file or a log: there is no event to wait on)
// until it holds, within a bound.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkJSONLog asserts every line the supervisor wrote is one JSON object:
// no process name, however odd, can break a line or forge one.
func checkJSONLog(t *testing.T, out string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("supervisor log line is not JSON (%v): %q", err, line)
			continue
		}
		n++
	}
	if n == 0 {
		t.Errorf("no supervisor log lines in %q", out)
	}
}

// nsPID is the PID that a host process has in its innermost PID namespace
// (the pod's), from the NSpid line.
func nsPID(t *testing.T, hostPID int) int {
	t.Helper()
	st, err := pod.ProcStatus(hostPID)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(st["NSpid"])
	if len(f) == 0 {
		t.Fatalf("pid %d: no NSpid line", hostPID)
	}
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// children lists a host process's children.
func children(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// commOf reads a process's comm, "" if it is gone.
func commOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSuffix(string(b), "\n")
}

// fds lists a process's open file descriptors and what each is.
func fds(pid int) (map[int]string, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		out[n] = target
	}
	return out, nil
}

// listening returns the inodes of every listening socket in the network
// namespace of pid: TCP sockets in LISTEN, UDP sockets bound without a
// peer (they receive from anyone), unix sockets that accept connections.
func listening(pid int) (map[string]string, error) {
	out := map[string]string{}
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6", "unix"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] { // after the header
			fl := strings.Fields(line)
			switch {
			case proto == "unix" && len(fl) >= 7:
				// Num RefCount Protocol Flags Type St Inode Path
				flags, _ := strconv.ParseUint(fl[3], 16, 32)
				const soAcceptCon = 0x10000 // __SO_ACCEPTCON: listen(2) was called
				if flags&soAcceptCon != 0 {
					out[fl[6]] = "unix " + strings.Join(fl[7:], " ")
				}
			case proto != "unix" && len(fl) >= 10:
				// sl local rem st tx:rx tr:tm retrnsmt uid timeout inode
				local, remote, st, inode := fl[1], fl[2], fl[3], fl[9]
				peerless := strings.HasSuffix(remote, ":0000") && strings.Trim(strings.Split(remote, ":")[0], "0") == ""
				if (strings.HasPrefix(proto, "tcp") && st == "0A") || (strings.HasPrefix(proto, "udp") && peerless) {
					out[inode] = proto + " " + local
				}
			}
		}
	}
	return out, nil
}

// sampler watches a process until stop: the most fds it had, every socket
// it held and whether one was listening, and its last VmRSS and VmHWM.
type sampler struct {
	pid     int
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	maxFDs  int
	samples int
	sockets map[string]bool   // socket:[inode] seen
	listens map[string]string // inode -> what, for sockets of ours that listened
	rssKB   int
	hwmKB   int
	fdsAt   map[int]string // the fds at the largest count
}

func watch(pid int, every time.Duration) *sampler {
	s := &sampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{}),
		sockets: map[string]bool{}, listens: map[string]string{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *sampler) sample() {
	fd, err := fds(s.pid)
	if err != nil {
		return // gone
	}
	st, _ := measure.Counters(fmt.Sprintf("/proc/%d/status", s.pid))
	var lis map[string]string
	for _, target := range fd {
		if strings.HasPrefix(target, "socket:[") && lis == nil {
			lis, _ = listening(s.pid)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	if len(fd) > s.maxFDs {
		s.maxFDs, s.fdsAt = len(fd), fd
	}
	for _, target := range fd {
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			inode = strings.TrimSuffix(inode, "]")
			s.sockets[inode] = true
			if what, ok := lis[inode]; ok {
				s.listens[inode] = what
			}
		}
	}
	if v := int(st["VmRSS"]); v > 0 {
		s.rssKB = v
	}
	if v := int(st["VmHWM"]); v > 0 {
		s.hwmKB = v
	}
}

// peak is the most descriptors the process had at once so far, and its
// last VmRSS and VmHWM.
func (s *sampler) peak() (fds, rssKB, hwmKB int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxFDs, s.rssKB, s.hwmKB
}

// checkBounds asserts the process has had at most maxFDs descriptors at
// once so far, and a VmHWM under maxHWMkB.
func (s *sampler) checkBounds(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maxFDs > maxFDs {
		t.Errorf("at most %d descriptors at once, want %d or fewer: %v", s.maxFDs, maxFDs, s.fdsAt)
	}
	if s.hwmKB == 0 || s.hwmKB > maxHWMkB {
		t.Errorf("VmHWM %d kB, want under %d kB (deploy/job.yaml's memory limit)", s.hwmKB, maxHWMkB)
	}
}

// Stop ends the sampling and returns once the last sample is taken. It
// may be called more than once.
func (s *sampler) Stop() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}
