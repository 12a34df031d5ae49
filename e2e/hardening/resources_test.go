package hardening

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
// expected, 2 there: it scans every 10ms until SUPERVISOR_APP_START_TIMEOUT)
// and then while it waits for the apps, and checks its descriptors and
// memory stay bounded, and that no process born and gone meanwhile was
// taken for an app container (2 found, 2 exited, each with its exit code).
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
	const churn = "4000"
	b, err := be.Build(scenarios.Desc{Name: "churn",
		Apps: []scenarios.App{{Name: "early", UID: 1000}, {Name: "late", UID: 1000}},
		SupervisorEnv: append(append([]string{}, fast...), "SUPERVISOR_APP_CONTAINERS=3", "SUPERVISOR_APPS=early,late,third",
			"SUPERVISOR_APP_START_TIMEOUT=30s", "SUPERVISOR_SCAN_INTERVAL=10ms")})
	if err != nil {
		t.Fatal(err)
	}
	// early churns at once, during discovery (4000 took 11.6 s on a loaded
	// CI machine, within the 30 s look); late churns once discovery has
	// given up on the third app, during the wait: the test starts it then,
	// through a file (a fixed delay raced the supervisor's own start under
	// load). Each churned process stays a zombie for 5ms, as a shell's
	// background jobs do.
	early, earlyRec := hostileArgv(b, "early", "--churn", churn, "--churn-par", "4", "--zombie", "5ms", "--sleep", "9s")
	goInside, goHost := triggerFile(b, "late", "late.go")
	late, lateRec := hostileArgv(b, "late", "--churn", churn, "--churn-par", "4", "--zombie", "5ms",
		"--churn-after", goInside, "--sleep", "1s")
	container(&b.Spec, "early").Argv = early
	container(&b.Spec, "late").Argv = late
	p := scenarios.Start(t, b)
	pid := supervisorProc(t, p)
	s := watch(pid, 20*time.Millisecond)
	defer s.Stop()

	// Phase 1: discovering while early churns.
	waitUntil(t, time.Minute, "early's churn", func() bool { return slices.Contains(scenarios.Record(earlyRec), "churned "+churn) })
	out := p.Logs("supervisor")
	if len(logLines(out, missingApps)) != 0 {
		t.Fatalf("discovery ended before early's churn did: the churn did not happen while the supervisor scanned; raise SUPERVISOR_APP_START_TIMEOUT\n%s", messages(out))
	}
	s.mu.Lock()
	fds1, hwm1, rss1 := s.maxFDs, s.hwmKB, s.rssKB
	s.mu.Unlock()

	// Phase 2: waiting while late churns.
	waitUntil(t, time.Minute, "discovery to give up on the third app", func() bool {
		return len(logLines(p.Logs("supervisor"), missingApps)) == 1
	})
	if err := os.WriteFile(goHost, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "late's churn", func() bool { return slices.Contains(scenarios.Record(lateRec), "churning "+churn) })
	waitUntil(t, time.Minute, "late's churn", func() bool { return slices.Contains(scenarios.Record(lateRec), "churned "+churn) })
	s.mu.Lock()
	fds2, hwm2, rss2 := s.maxFDs, s.hwmKB, s.rssKB
	s.mu.Unlock()

	st := waitPhaseOf(t, p, "supervisor")
	s.Stop()
	out = p.Logs("supervisor")
	t.Logf("discovering through %s processes: at most %d descriptors, VmRSS %d kB, VmHWM %d kB", churn, fds1, rss1, hwm1)
	t.Logf("waiting through %s more: at most %d descriptors, VmRSS %d kB, VmHWM %d kB", churn, fds2, rss2, hwm2)
	t.Logf("at the end: %d samples, at most %d descriptors (%s), VmHWM %d kB", s.samples, s.maxFDs, describeFDs(s.fdsAt), s.hwmKB)
	if s.maxFDs > maxFDs {
		t.Errorf("at most %d descriptors at once, want %d or fewer: %v", s.maxFDs, maxFDs, s.fdsAt)
	}
	if fds2 > fds1+1 {
		t.Errorf("descriptors grew from %d to %d with the second churn (one more pidfd, for late, is expected)", fds1, fds2)
	}
	if s.hwmKB == 0 || s.hwmKB > maxHWMkB {
		t.Errorf("VmHWM %d kB, want under %d kB (deploy/job.yaml's memory limit)", s.hwmKB, maxHWMkB)
	}
	if st.Container("supervisor").ExitCode != 0 {
		t.Errorf("pod %s", st)
	}
	found := logLines(out, "app found")
	exited := logLines(out, "app exited")
	var names []string
	for _, l := range exited {
		names = append(names, l.Str("container")+"="+l.Str("exit_code"))
	}
	slices.Sort(names)
	if len(found) != 2 || !slices.Equal(names, []string{"early=0", "late=0"}) {
		t.Errorf("%d apps found, exits %v: want early and late alone, both exit 0 (a churned process taken for an app?)\n%s",
			len(found), names, messages(out))
	}
}

// messages is the supervisor's log, one line per message with its
// container and status fields, for a failure to show.
func messages(out string) string {
	var b strings.Builder
	for _, l := range scenarios.ParseLog(out) {
		fmt.Fprintf(&b, "%s container=%s pid=%s exit_code=%s status=%s reason=%s\n",
			l.Msg(), l.Str("container"), l.Str("pid"), l.Str("exit_code"), l.Str("status"), l.Str("reason"))
	}
	return b.String()
}

// missingApps is the supervisor's message when discovery gives up.
const missingApps = "app containers missing: they finished before the supervisor started, or never started"

// hostileArgv is the command of an app container running podsim hostile
// on either backend, and the host path of its record.
func hostileArgv(b scenarios.Built, name string, args ...string) (argv []string, record string) {
	app := container(&b.Spec, name)
	podsim, dir, hostDir := app.Argv[0], filepath.Dir(recordArg(app.Argv)), b.Dir
	if dir == scenarios.SharedMount {
		hostDir = filepath.Join(b.Dir, "shared")
	}
	argv = append([]string{podsim, "hostile", "--record", filepath.Join(dir, name+".record")}, args...)
	return argv, filepath.Join(hostDir, name+".record")
}

// triggerFile is a file of the app's record directory, by its path inside
// the container and on the host.
func triggerFile(b scenarios.Built, app, name string) (inside, host string) {
	_, rec := hostileArgv(b, app)
	return filepath.Join(filepath.Dir(recordArg(container(&b.Spec, app).Argv)), name), filepath.Join(filepath.Dir(rec), name)
}

// recordArg is the --record argument of a podsim app command.
func recordArg(argv []string) string {
	for i, a := range argv {
		if a == "--record" && i+1 < len(argv) {
			return argv[i+1]
		}
	}
	return ""
}

// TestTenThousandProcesses keeps 10,000 processes alive in an app
// container (among them pilot-agent decoys) while the supervisor scans
// every 10ms, looking for a second app that never comes: every scan reads
// them all, for the 20s the app lives on. Its memory stays under the pod
// limit and its descriptors few; it finds the app and the sidecar among
// them and stops only the sidecar.
func TestTenThousandProcesses(t *testing.T) {
	needRoot(t)
	tl := pod.MustTools(t)
	b, err := scenarios.BuildNamespaces(scenarios.Desc{Name: "many",
		Apps: []scenarios.App{{Name: "app", UID: 1000}},
		SupervisorEnv: append(append([]string{}, fast...), "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APPS=app,ghost",
			"SUPERVISOR_APP_START_TIMEOUT=50s", "SUPERVISOR_SCAN_INTERVAL=10ms")}, tl)
	if err != nil {
		t.Fatal(err)
	}
	argv, rec := hostileArgv(b, "app", "--swarm", "10000", "--decoy", "pilot-agent", "--decoy", "pilot-agent", "--sleep", "20s")
	container(&b.Spec, "app").Argv = argv
	p := scenarios.Start(t, b)
	pid := supervisorProc(t, p)
	s := watch(pid, 50*time.Millisecond)
	defer s.Stop()
	waitUntil(t, 2*time.Minute, "the swarm", func() bool { return slices.Contains(scenarios.Record(rec), "swarm 10000") })
	swarmed := time.Now()
	if out := p.Logs("supervisor"); len(logLines(out, missingApps)) != 0 {
		t.Fatalf("discovery ended before the swarm was complete: raise SUPERVISOR_APP_START_TIMEOUT\n%s", messages(out))
	}
	// Scans over the whole swarm until the app exits (or discovery ends).
	waitUntil(t, time.Minute, "the app's exit", func() bool {
		out := p.Logs("supervisor")
		return len(logLines(out, "app exited")) > 0 || len(logLines(out, missingApps)) > 0
	})
	scanned := time.Since(swarmed)
	s.mu.Lock()
	fds, rss, hwm := s.maxFDs, s.rssKB, s.hwmKB
	s.mu.Unlock()
	t.Logf("%s of scans over 10,000+ processes: at most %d descriptors, VmRSS %d kB, VmHWM %d kB", scanned.Round(time.Millisecond), fds, rss, hwm)
	if scanned < 5*time.Second {
		t.Errorf("only %s of scans over the whole swarm", scanned)
	}
	if fds > maxFDs {
		t.Errorf("at most %d descriptors at once, want %d or fewer: %v", fds, maxFDs, s.fdsAt)
	}
	if hwm == 0 || hwm > maxHWMkB {
		t.Errorf("VmHWM %d kB, want under %d kB (deploy/job.yaml's memory limit)", hwm, maxHWMkB)
	}
	st := waitPhaseOf(t, p, "supervisor")
	out := p.Logs("supervisor")
	if found := logLines(out, "app found"); len(found) != 1 || found[0].Str("container") != "app" {
		t.Errorf("app found: %v", found)
	}
	if sig := logLines(out, "sidecar signalled"); len(sig) != 1 || sig[0].Str("container") != "istio-proxy" {
		t.Errorf("sidecar signalled: %v, want istio-proxy alone (pod %s)\n%s", sig, st, messages(out))
	}
	for _, line := range scenarios.Record(rec) {
		if strings.HasPrefix(line, "signal ") {
			t.Errorf("a decoy got %q", line)
		}
	}
}
