package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// method is one way of stopping istio-proxy once the app has exited: a
// column of the table.
type method string

// The methods, in the table's order.
const (
	// seed wraps the app's command: sh -c 'APP; pkill -TERM pilot-agent'.
	seed method = "seed"
	// poll1s and poll50ms are e2e/bench/poller in the supervisor's place.
	poll1s   method = "poll1s"
	poll50ms method = "poll50ms"
	// pidfd and ptrace are the supervisor with SUPERVISOR_EXIT_STATUS set so.
	pidfd  method = "pidfd"
	ptrace method = "ptrace"
)

var methods = []method{seed, poll1s, poll50ms, pidfd, ptrace}

func (m method) title() string {
	switch m {
	case seed:
		return "seed wrapper `sh -c 'APP; pkill'`"
	case poll1s:
		return "/proc poller, 1 s"
	case poll50ms:
		return "/proc poller, 50 ms"
	case pidfd:
		return "supervisor, pidfd"
	case ptrace:
		return "supervisor, ptrace"
	}
	return string(m)
}

func (m method) supervisor() bool { return m == pidfd || m == ptrace }

func (m method) pollInterval() time.Duration {
	if m == poll1s {
		return time.Second
	}
	return 50 * time.Millisecond
}

// watcher is the container whose process does the watching.
func (m method) watcher() string {
	switch m {
	case seed:
		return appName(0)
	case poll1s, poll50ms:
		return "poller"
	}
	return "supervisor"
}

// Linux capability numbers (include/uapi/linux/capability.h), for the
// ptrace supervisor's container as deploy/job-ptrace.yaml has it.
const (
	capKill      = 5
	capSysPtrace = 19
)

// env is what every pod of a run shares.
type env struct {
	tools  pod.Tools // Supervisor is the binary under test
	poller string    // e2e/bench/poller, built
	root   string    // a directory for the pods' files
}

// podOpts shapes one benchmark pod: app containers running podsim app
// until a FIFO is written, the stand-in pilot-agent, and the method's
// watcher last.
type podOpts struct {
	method method
	apps   int // app containers (0 means 1)
	// procs, when > 0, brings the pod's process count to this with
	// sleeping processes in an extra container (forks of sh blocked on a
	// FIFO; the supervisor ignores the container by its main process's
	// name, sh).
	procs int
	// idle, when set, is the idle program (writeIdle): the extra
	// processes are its children, each far smaller than a fork of sh.
	idle string
	// supervisorEnv are settings of the supervisor that replace the
	// benchmark's (by name) or add to them.
	supervisorEnv []string
	// ack makes the app answer each SIGUSR1 through a FIFO.
	ack bool
}

// benchPod is a started pod and the files the measures come from.
type benchPod struct {
	*pod.Pod
	opts   podOpts
	built  scenarios.Built
	dir    string // the benchmark's files (FIFOs, stamps)
	trig   string // FIFO: the apps end once it is opened for writing and closed
	ack    string // FIFO: the app writes a byte per SIGUSR1
	filled string // FIFO: the filler's hook returns once its processes exist
}

func appName(i int) string {
	if i == 0 {
		return "app"
	}
	return fmt.Sprintf("app%d", i+1)
}

func (o podOpts) nApps() int { return max(o.apps, 1) }

// baseProcs is how many processes a pod has without the filler's
// children: pause, the apps, pilot-agent and envoy, the watcher, and the
// filler's sh.
func (o podOpts) baseProcs() int { return 1 + o.nApps() + 2 + 1 + 1 }

func startPod(ctx context.Context, e env, o podOpts) (*benchPod, error) {
	dir, err := os.MkdirTemp(e.root, string(o.method)+"-")
	if err != nil {
		return nil, err
	}
	bp := &benchPod{opts: o, dir: dir, trig: filepath.Join(dir, "trigger"), ack: filepath.Join(dir, "ack"), filled: filepath.Join(dir, "filled")}
	fail := func(err error) (*benchPod, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	// Containers of several uids write here.
	if err := os.Chmod(dir, 0o777); err != nil {
		return fail(err)
	}
	for _, f := range []string{bp.trig, bp.ack, bp.filled} {
		if err := unix.Mkfifo(f, 0o666); err != nil {
			return fail(fmt.Errorf("mkfifo %s: %w", f, err))
		}
		if err := os.Chmod(f, 0o666); err != nil {
			return fail(err)
		}
	}
	d := scenarios.Desc{
		Name:       "bench-" + string(o.method),
		Proxy:      scenarios.StandIn,
		ProxyDrain: time.Millisecond,
		ProxyEnv:   []string{"PILOT_TIMESTAMPS=" + bp.pilotStamps()},
		Grace:      5 * time.Second,
	}
	for i := 0; i < o.nApps(); i++ {
		args := []string{"--fifo", bp.trig, "--stamps", bp.appStamps(i)}
		if o.ack {
			args = append(args, "--ack", bp.ack)
		}
		d.Apps = append(d.Apps, scenarios.App{Name: appName(i), Args: args, UID: 1000})
	}
	if o.method.supervisor() {
		d.SupervisorEnv = withEnv([]string{
			"SUPERVISOR_EXIT_STATUS=" + string(o.method),
			"SUPERVISOR_APP_CONTAINERS=" + strconv.Itoa(o.nApps()),
			"SUPERVISOR_APP_START_TIMEOUT=20s", "SUPERVISOR_STOP_TIMEOUT=5s",
			// The filler's container, if any (its main process is sh).
			"SUPERVISOR_IGNORE_PROCESSES=sh",
		}, o.supervisorEnv)
	} else {
		d.NoSupervisor = true
	}
	built, err := scenarios.BuildNamespaces(d, e.tools)
	if err != nil {
		return fail(err)
	}
	bp.built = built
	spec := built.Spec
	switch o.method {
	case seed:
		// The seed's wrapper. It must be allowed to signal pilot-agent:
		// the same uid (or CAP_KILL).
		c := &spec.Containers[0]
		c.Argv = []string{"/bin/sh", "-c", shellJoin(c.Argv) + "; pkill -TERM pilot-agent"}
		c.UID, c.GID = scenarios.ProxyUID, scenarios.ProxyUID
	case poll1s, poll50ms:
		spec.Containers = append(spec.Containers, pod.Container{
			Name: "poller", Argv: []string{e.poller, "-interval", o.method.pollInterval().String(), "-app", "podsim", "-sidecar", "pilot-agent"},
			UID: scenarios.ProxyUID, GID: scenarios.ProxyUID, NoNewPrivs: true, Caps: []int{},
		})
	case ptrace:
		// As deploy/job-ptrace.yaml: root with SYS_PTRACE and KILL only.
		c := &spec.Containers[len(spec.Containers)-1]
		c.UID, c.GID, c.Caps = 0, 0, []int{capSysPtrace, capKill}
	}
	if o.procs > 0 {
		n := o.procs - o.baseProcs()
		if n < 0 {
			return fail(fmt.Errorf("%d processes asked, the pod has %d without any filler", o.procs, o.baseProcs()))
		}
		sleeper := filepath.Join(dir, "sleep")
		if err := unix.Mkfifo(sleeper, 0o666); err != nil {
			return fail(err)
		}
		// Forks of sh, no exec: each child blocks opening a FIFO no one
		// writes to, for about 100 kB each. The postStart hook returns
		// once they all exist, and only then does the next container
		// (the watcher) start.
		script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do read x < %s & i=$((i+1)); done; echo > %s; read x < %s`, n, sleeper, bp.filled, sleeper)
		if o.idle != "" {
			// The idle program forks as many children as it has
			// arguments, 100 at a time, and returns once they exist.
			batch := strings.TrimSpace(strings.Repeat("x ", idleBatch))
			script = fmt.Sprintf(`i=0; while [ $i -lt %d ]; do %s %s || exit 1; i=$((i+1)); done; `, n/idleBatch, o.idle, batch)
			if r := n % idleBatch; r > 0 {
				script += fmt.Sprintf(`%s %s || exit 1; `, o.idle, strings.TrimSpace(strings.Repeat("x ", r)))
			}
			script += fmt.Sprintf(`echo > %s; read x < %s`, bp.filled, sleeper)
		}
		filler := pod.Container{
			Name: "filler", Argv: []string{"/bin/sh", "-c", script}, UID: 1000, GID: 1000,
			PostStart: []string{"/bin/sh", "-c", "read x < " + bp.filled},
		}
		if o.idle != "" {
			// Root, whom RLIMIT_NPROC does not hold: a uid's processes
			// are limited to it (96,362 on the machine of BENCHMARKS.md),
			// and raising its hard limit needs CAP_SYS_RESOURCE.
			filler.UID, filler.GID = 0, 0
		}
		last := len(spec.Containers) - 1
		spec.Containers = append(spec.Containers[:last], filler, spec.Containers[last])
	}
	p, err := pod.Start(ctx, built.Backend, spec)
	if err != nil {
		os.RemoveAll(built.Dir)
		return fail(err)
	}
	bp.Pod = p
	return bp, nil
}

func (bp *benchPod) appStamps(i int) string { return filepath.Join(bp.dir, appName(i)+".stamps") }
func (bp *benchPod) pilotStamps() string    { return filepath.Join(bp.dir, "pilot-agent.stamps") }

func (bp *benchPod) Close() error {
	err := bp.Pod.Close()
	os.RemoveAll(bp.dir)
	return err
}

// ready reports whether the watcher watches and pilot-agent runs, so that
// the apps may be ended.
func (bp *benchPod) ready() bool {
	if !slices.ContainsFunc(scenarios.Record(bp.built.PilotRecord), startsWith("start")) {
		return false
	}
	switch bp.opts.method {
	case seed:
		return slices.ContainsFunc(scenarios.Record(filepath.Join(bp.built.Dir, appName(0)+".record")), startsWith("app start"))
	case poll1s, poll50ms:
		return strings.Contains(bp.Logs("poller"), "watching")
	}
	found := 0
	lines, _ := measure.ParseLog(bp.Logs("supervisor"))
	for _, l := range lines {
		if l.Message == "app found" {
			found++
		}
	}
	return found == bp.opts.nApps()
}

func startsWith(prefix string) func(string) bool {
	return func(l string) bool { return strings.HasPrefix(l, prefix) }
}

// waitReady waits for ready, looking every 2 ms (the harness's polling,
// before anything is measured).
func (bp *benchPod) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for !bp.ready() {
		if st := bp.Status(); st.Phase == pod.Succeeded || st.Phase == pod.Failed {
			return fmt.Errorf("pod ended before it was ready: %s", st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// trigger ends the apps: it opens their FIFO for writing (which fails
// while no reader has it open) and closes it. It returns when that was.
func (bp *benchPod) trigger() (time.Time, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		fd, err := unix.Open(bp.trig, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			t := time.Now()
			unix.Close(fd)
			return t, nil
		}
		if !errors.Is(err, unix.ENXIO) || time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("open %s: %w", bp.trig, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// end triggers the apps' end and waits for the pod's (its filler aside),
// triggering again should an app have opened the FIFO late.
func (bp *benchPod) end(ctx context.Context) (time.Time, pod.Status, error) {
	return bp.endWithin(ctx, 30*time.Second)
}

// endWithin is end, waiting up to d for the pod's end.
func (bp *benchPod) endWithin(ctx context.Context, d time.Duration) (time.Time, pod.Status, error) {
	t, err := bp.trigger()
	if err != nil {
		return t, bp.Status(), err
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := bp.WaitFor(wctx, ended)
		wcancel()
		if err == nil {
			return t, st, nil
		}
		if ctx.Err() != nil {
			return t, st, err
		}
		for _, a := range st.Containers {
			if strings.HasPrefix(a.Name, "app") && a.Running {
				bp.trigger()
			}
		}
	}
}

// ended is true once every container but the filler has terminated (the
// filler runs until the pod is closed).
func ended(st pod.Status) bool {
	for _, c := range st.Containers {
		if c.Name != "filler" && (c.Running || !c.Started) {
			return false
		}
	}
	return true
}

// stamp reads the time of the first event line in a stamps file.
func stamp(path, event string) (time.Time, error) {
	ts, err := scenarios.Stamps(path, event)
	if err == nil && len(ts) == 0 {
		err = fmt.Errorf("%s: no %q", path, event)
	}
	if err != nil {
		return time.Time{}, err
	}
	return ts[0], nil
}

// reaped is when the pod reaped container name's main process.
func (bp *benchPod) reaped(name string) (time.Time, error) {
	et, ok := bp.Process(name).(interface{ ExitedAt() time.Time })
	if !ok {
		return time.Time{}, fmt.Errorf("container %s: the backend does not time the reap", name)
	}
	t := et.ExitedAt()
	if t.IsZero() {
		return t, fmt.Errorf("container %s not reaped", name)
	}
	return t, nil
}

func (bp *benchPod) pid(name string) (int, error) {
	c := bp.Status().Container(name)
	if !c.Running || c.PID == 0 {
		return 0, fmt.Errorf("container %s is not running", name)
	}
	return c.PID, nil
}

// idleBatch is how many children one run of the idle program forks.
const idleBatch = 100

// withEnv is env with each NAME=value of set replacing env's NAME, or
// added.
func withEnv(env, set []string) []string {
	out := slices.Clone(env)
	for _, kv := range set {
		name, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(out, func(e string) bool { return strings.HasPrefix(e, name+"=") })
		if i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
