package hardening

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// Bounds on the supervisor's resources, whatever the pod does. They are
// functional, not speed assertions: the memory bound is deploy/job.yaml's
// limit (32Mi), under which the kubelet would OOM-kill it; the descriptor
// bound is what the supervisor needs (stdio, its epoll and eventfd, a
// pidfd per app and sidecar, the Go runtime's two cgroup files, and while
// scanning three /proc descriptors at a time: /proc, one process's
// directory and one of its files, procscan's streaming scan) with room to
// spare, and far below the thousands of processes each test makes come and
// go.
const (
	maxHWMkB = 32 * 1024
	maxFDs   = 20
)

// TestChurnBounds makes thousands of short-lived processes come and go in
// a pod, first while the supervisor is discovering (3 app containers
// expected, 2 there: it scans every 10ms) and then while it waits for the
// apps, and checks its descriptors and memory stay bounded, and that no
// process born and gone meanwhile was taken for an app container (3 found,
// 3 exited, each with its exit code).
//
// Each phase is bound to the supervisor's own state, never to a clock:
// early churns once the supervisor has found early and late, and the third
// app starts (after the supervisor, as a container of a slow image pull
// would) only once early's churn is over, so discovery is under way for the
// whole of it however slow the machine; late churns once the supervisor has
// found the third app, when discovery is over. The apps are cued: each ends
// when the test says.
//
// On the runc backend each container has its own cgroups in every v1
// hierarchy of this host, as under a kubelet on a v1 or hybrid node, and
// an exiting process shows "/" there: without procscan's placement of
// exiting processes, each churned zombie caught by a scan was a phantom
// app container. (The namespaces backend gives containers their own
// unified cgroup only, so there zombies look like their container.)
func TestChurnBounds(t *testing.T) {
	for _, b := range scenarios.Builders(t) {
		t.Run(b.Name, func(t *testing.T) { churnBounds(t, b) })
	}
}

func churnBounds(t *testing.T, be scenarios.Builder) {
	// 1,000 a phase: the runc backend churns some 80 processes a second
	// on this machine, alone, so 4,000 a phase took 95 s of the lane. A phase of 1,000 still
	// lasts seconds, hundreds of the supervisor's 10ms scans.
	const churn = "1000"
	apps := []string{"early", "late", "third"}
	// Discovery ends when the third app is found, not on a clock.
	d := scenarios.Desc{Name: "churn",
		SupervisorEnv: patient("SUPERVISOR_APP_CONTAINERS=3", "SUPERVISOR_APP_START_TIMEOUT=1h", "SUPERVISOR_SCAN_INTERVAL=10ms")}
	for _, a := range apps {
		d.Apps = append(d.Apps, scenarios.App{Name: a, UID: 1000, Cued: true})
	}
	b := be.MustBuild(t, d)
	// Each churned process stays a zombie for 5ms, as a shell's background
	// jobs do. Each app churns once the test releases its cue, a FIFO next
	// to its record.
	var recs, cues []string
	for _, a := range apps[:2] {
		app := scenarios.Container(&b.Spec, a)
		inside, cue := filepath.Join(filepath.Dir(argOf(app.Argv, "--record")), a+".churn"), filepath.Join(b.Shared, a+".churn")
		if err := pod.MakeCue(cue); err != nil {
			t.Fatal(err)
		}
		rec := runHostile(b, a, "--churn", churn, "--zombie", "5ms", "--churn-after", inside)
		recs, cues = append(recs, rec), append(cues, cue)
	}
	earlyRec, lateRec := recs[0], recs[1]
	churned := make(chan struct{})
	scenarios.StartLast(&b.Spec, "third", scenarios.Gate(churned))
	p := scenarios.Start(t, b)
	pid := supervisorProc(t, p)
	s := watch(pid, 20*time.Millisecond)
	defer s.Stop()

	// Phase 1: discovering while early churns.
	scenarios.WaitLogFor(t, p, "app found", "early")
	scenarios.WaitLogFor(t, p, "app found", "late")
	if err := pod.ReleaseCue(cues[0], hangGuard); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, hangGuard, "early's churn", func() bool { return slices.Contains(scenarios.Record(earlyRec), "churned "+churn) })
	if len(scenarios.LogWhere(p, scenarios.Is(missingApps))) != 0 {
		t.Fatalf("discovery ended while the third app was still to come:\n%s", messages(p.Logs("supervisor")))
	}
	fds1, rss1, hwm1 := s.peak()

	// Phase 2: waiting while late churns.
	close(churned)
	scenarios.WaitLogFor(t, p, "app found", "third")
	if err := pod.ReleaseCue(cues[1], hangGuard); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, hangGuard, "late's churn", func() bool { return slices.Contains(scenarios.Record(lateRec), "churned "+churn) })
	fds2, rss2, hwm2 := s.peak()

	release(t, b, apps...)
	st := ended(t, p, "supervisor")
	s.Stop()
	out := p.Logs("supervisor")
	t.Logf("discovering through %s processes: at most %d descriptors, VmRSS %d kB, VmHWM %d kB", churn, fds1, rss1, hwm1)
	t.Logf("waiting through %s more: at most %d descriptors, VmRSS %d kB, VmHWM %d kB", churn, fds2, rss2, hwm2)
	t.Logf("at the end: %d samples, at most %d descriptors (%s), VmHWM %d kB", s.samples, s.maxFDs, describeFDs(s.fdsAt), s.hwmKB)
	s.checkBounds(t)
	if fds2 > fds1+1 {
		t.Errorf("descriptors grew from %d to %d with the second churn (one more pidfd, for third, is expected)", fds1, fds2)
	}
	if st.Container("supervisor").ExitCode != 0 {
		t.Errorf("pod %s", st)
	}
	found := scenarios.LogWhere(p, scenarios.Is("app found"))
	exited := scenarios.LogWhere(p, scenarios.Is("app exited"))
	var names []string
	for _, l := range exited {
		names = append(names, l.Str("container")+"="+l.Str("exit_code"))
	}
	slices.Sort(names)
	if len(found) != 3 || !slices.Equal(names, []string{"early=0", "late=0", "third=0"}) {
		t.Errorf("%d apps found, exits %v: want early, late and third alone, each exit 0 (a churned process taken for an app?)\n%s",
			len(found), names, messages(out))
	}
}

// hangGuard bounds the waits for work of a size (thousands of processes
// made, a swarm's scans) on a loaded machine: only a hang reaches it.
const hangGuard = 10 * time.Minute

// messages is the supervisor's log, one line per message with its
// container and status fields, for a failure to show.
func messages(out string) string {
	var b strings.Builder
	for _, l := range scenarios.ParseLog(out) {
		fmt.Fprintf(&b, "%s %s\n", l.Msg(), l.Fields("container", "pid", "exit_code", "status", "reason"))
	}
	return b.String()
}

// missingApps is the supervisor's message when discovery gives up.
const missingApps = "app containers missing: they finished before the supervisor started, or never started"

// runHostile makes the app container name run podsim hostile with args,
// on either backend, keeping its record and, if cued, its cue (--fifo);
// it returns the host path of the record.
func runHostile(b scenarios.Built, name string, args ...string) (record string) {
	app := scenarios.Container(&b.Spec, name)
	argv := []string{app.Argv[0], "hostile", "--record", argOf(app.Argv, "--record")}
	if cue := argOf(app.Argv, "--fifo"); cue != "" {
		argv = append(argv, "--fifo", cue)
	}
	app.Argv = append(argv, args...)
	return filepath.Join(b.Shared, name+".record")
}

// argOf is the argument of flag in a podsim app command, "" if none.
func argOf(argv []string, flag string) string {
	for i, a := range argv {
		if a == flag && i+1 < len(argv) {
			return argv[i+1]
		}
	}
	return ""
}

// TestTenThousandProcesses keeps 10,000 processes alive in an app
// container (among them pilot-agent decoys) while the supervisor scans
// every 10ms, looking for a second app, ghost, which starts only once the
// supervisor has made scanFloor scans over the whole swarm (counted by its
// reads, /proc/PID/io's syscr: each scan reads at least one file of every
// process). Its memory stays under the pod limit and its descriptors few;
// it finds the app and ghost among them, and stops only the sidecar.
func TestTenThousandProcesses(t *testing.T) {
	const swarm, scanFloor = 10000, 10
	// Discovery ends when ghost is found, not on a clock.
	b, _ := buildNamespaces(t, scenarios.Desc{Name: "many",
		Apps:          []scenarios.App{{Name: "app", UID: 1000, Cued: true}, {Name: "ghost", UID: 1000, Cued: true}},
		SupervisorEnv: patient("SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APP_START_TIMEOUT=1h", "SUPERVISOR_SCAN_INTERVAL=10ms")})
	rec := runHostile(b, "app", "--swarm", strconv.Itoa(swarm), "--decoy", "pilot-agent", "--decoy", "pilot-agent")
	scanned := make(chan struct{})
	scenarios.StartLast(&b.Spec, "ghost", scenarios.Gate(scanned))
	p := scenarios.Start(t, b)
	pid := supervisorProc(t, p)
	s := watch(pid, 50*time.Millisecond)
	defer s.Stop()
	waitUntil(t, hangGuard, "the swarm", func() bool { return slices.Contains(scenarios.Record(rec), fmt.Sprintf("swarm %d", swarm)) })
	// Scans over the whole swarm while ghost is looked for. (The supervisor
	// reads little else meanwhile: /proc/loadavg, a read every 2ms.)
	begun, err := scenarios.Syscr(pid)
	if err != nil {
		t.Fatal(err)
	}
	var reads uint64
	waitUntil(t, hangGuard, fmt.Sprintf("%d scans over the swarm", scanFloor), func() bool {
		n, err := scenarios.Syscr(pid)
		reads = n - begun
		return err == nil && reads >= scanFloor*swarm
	})
	if len(scenarios.LogWhere(p, scenarios.Is(missingApps))) != 0 || len(scenarios.LogWhere(p, scenarios.Is("app found"))) != 1 {
		t.Fatalf("discovery did not go on while ghost was to come:\n%s", messages(p.Logs("supervisor")))
	}
	fds, rss, hwm := s.peak()
	t.Logf("%d reads (at least %d scans) over %d+ processes: at most %d descriptors, VmRSS %d kB, VmHWM %d kB",
		reads, scanFloor, swarm, fds, rss, hwm)
	s.checkBounds(t)
	close(scanned)
	releaseFound(t, p, b, "ghost")
	release(t, b, "app")
	st := ended(t, p, "supervisor")
	out := p.Logs("supervisor")
	var found []string
	for _, l := range scenarios.LogWhere(p, scenarios.Is("app found")) {
		found = append(found, l.Str("container"))
	}
	if slices.Sort(found); !slices.Equal(found, []string{"app", "ghost"}) {
		t.Errorf("app found: %v, want app and ghost", found)
	}
	if sig := scenarios.LogWhere(p, scenarios.Is("sidecar signalled")); len(sig) != 1 || sig[0].Str("container") != "istio-proxy" {
		t.Errorf("sidecar signalled: %v, want istio-proxy alone (pod %s)\n%s", sig, st, messages(out))
	}
	for _, line := range scenarios.Record(rec) {
		if strings.HasPrefix(line, "signal ") {
			t.Errorf("a decoy got %q", line)
		}
	}
}
