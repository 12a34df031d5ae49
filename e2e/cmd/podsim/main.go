// Command podsim is the multi-call binary behind the e2e pod simulation
// (package e2e/pod). Its mode is argv[0]'s base name, or the first argument
// when that is podsim itself (as busybox does):
//
//	pause        PID 1 of a pod: brings lo up, sets the hostname, reaps
//	             orphans, exits on SIGTERM/SIGINT
//	enter        a container's entry: mounts a fresh /proc, joins the
//	             container's cgroup and a new cgroup namespace, drops to the
//	             container's uid, then execs the container's command
//	pilot-agent  a stand-in for Istio's pilot-agent: a child named envoy,
//	             /quitquitquit and /healthz/ready, and a record of every
//	             signal it gets (see pilotagent.go)
//	app          a test application: sleeps, exits, kills itself, forks
//	             children, makes HTTP requests (see app.go)
//	wait-http    polls a URL until it answers 200, within a bound (a
//	             postStart hook, as `pilot-agent wait` is in Istio)
//	ps           lists the processes it sees: pid, ppid, uid, comm, cgroup
//	hostile      a process awkward to read from /proc: odd comm and argv[0],
//	             decoys named like the sidecar, swarms, churn (hostile.go)
//	true         exits at once (with the code given, default 0)
//	daprd, linkerd2-proxy, consul-dataplane, vault, otelcol,
//	otelcol-contrib, fluent-bit
//	             stand-ins for those sidecars: their HTTP stop and their
//	             exit codes (see sidecars.go)
//
// $PODSIM_MODE, when set, is the mode instead, and every argument is the
// mode's: how a process with an arbitrary argv[0] still runs podsim.
//
// It must stay small and static: the qemu tests run it on another kernel.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	mode, args := filepath.Base(os.Args[0]), os.Args[1:]
	// The harness's own "podsim enter" carries the container's environment,
	// which may hold PODSIM_MODE for the container's command: enter wins.
	entering := mode == "podsim" && len(args) > 0 && args[0] == "enter"
	if m := os.Getenv(modeEnv); m != "" && !entering {
		mode = m
	} else if mode == "podsim" || strings.HasPrefix(mode, "podsim") {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: podsim pause|enter|pilot-agent|app|wait-http ...")
			os.Exit(2)
		}
		mode, args = args[0], args[1:]
	}
	sidecar := func(args []string) error { return sidecarStandIn(mode, args) }
	run, ok := map[string]func([]string) error{
		"pause": pause, "enter": enter, "pilot-agent": pilotAgent, "envoy": envoy, "app": app,
		"wait-http": waitHTTP, "ps": ps, "hostile": hostile, "true": exitCode,
		"daprd": sidecar, "linkerd2-proxy": sidecar, "consul-dataplane": sidecar, "vault": sidecar,
		"otelcol": sidecar, "otelcol-contrib": sidecar, "fluent-bit": sidecar,
	}[mode]
	err := fmt.Errorf("unknown mode %q", mode)
	if ok {
		err = run(args)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "podsim %s: %v\n", mode, err)
		os.Exit(125)
	}
}

// recorder appends lines to a file, a record the tests assert on or the
// stamps the benchmarks (e2e/bench) read; with no file it appends nothing.
type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func newRecorder(path string) *recorder {
	r := &recorder{}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
		if err != nil {
			fmt.Fprintf(os.Stderr, "record: %v\n", err)
		}
		r.f = f
	}
	return r
}

// log records an event, and writes it with the time to stderr.
func (r *recorder) log(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), line)
	r.write(line)
}

// stamp records "EVENT UNIX_NS" (CLOCK_REALTIME, nanoseconds) for an event
// that happened at t: the clock readings, kept apart from the records.
func (r *recorder) stamp(event string, t time.Time) {
	r.write(fmt.Sprintf("%s %d", event, t.UnixNano()))
}

func (r *recorder) write(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		r.f.WriteString(line + "\n")
	}
}

// ps lists the processes this container sees, one per line:
// "PID PPID UID COMM CGROUP" (cgroup: the unified line's path).
func ps(args []string) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if l < 0 || r < 0 {
			continue
		}
		comm := s[l+1 : r]
		fields := strings.Fields(s[r+1:])
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		unified := "?"
		for _, line := range strings.Split(string(cg), "\n") {
			if strings.HasPrefix(line, "0::") {
				unified = strings.TrimPrefix(line, "0::")
			}
		}
		uid := -1
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			uid = int(fi.Sys().(*syscall.Stat_t).Uid)
		}
		fmt.Printf("%d %s %d %s %s\n", pid, fields[1], uid, strings.ReplaceAll(comm, " ", "_"), unified)
	}
	return nil
}
