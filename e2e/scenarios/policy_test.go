package scenarios

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// Issue 5's cases on both backends: every restart policy and the moving
// parts of a pod's life.

// policyEnv keeps the supervisor's bounds short.
var policyEnv = []string{"SUPERVISOR_STOP_TIMEOUT=5s", "SUPERVISOR_SIDECAR_START_TIMEOUT=2s", "SUPERVISOR_APP_START_TIMEOUT=2s"}

// runBuilt starts b, waits for a terminal phase within d, and returns the
// status; cleanup prints everything on failure.
func runBuilt(t *testing.T, built Built, within time.Duration) (*pod.Pod, pod.Status) {
	t.Helper()
	p := Start(t, built)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	st, err := p.WaitPhase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return p, st
}

// withStamps makes every app record the time of each of its runs' end
// ("exit UNIX_NS", written right before it exits or kills itself), and
// returns the host files.
func withStamps(b *Built, apps []string) []string {
	var files []string
	for i := range b.Spec.Containers {
		c := &b.Spec.Containers[i]
		if !slices.Contains(apps, c.Name) {
			continue
		}
		host, inside := filepath.Join(b.Dir, c.Name+".stamps"), filepath.Join(b.Dir, c.Name+".stamps")
		if _, ok := b.Backend.(pod.Runc); ok {
			host, inside = filepath.Join(b.Dir, "shared", c.Name+".stamps"), SharedMount+"/"+c.Name+".stamps"
		}
		c.Argv = append(c.Argv, "--stamps", inside)
		files = append(files, host)
	}
	return files
}

// appEnds reads every run's end from the stamp files.
func appEnds(files []string) []time.Time {
	var out []time.Time
	for _, f := range files {
		for _, l := range Record(f) {
			if fs := strings.Fields(l); len(fs) == 2 && fs[0] == "exit" {
				if ns, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
					out = append(out, time.Unix(0, ns))
				}
			}
		}
	}
	return out
}

// signalledAt is when the supervisor logged its first signal to a sidecar
// (its log's time is cut to the millisecond, so the signal came within the
// millisecond after).
func signalledAt(p *pod.Pod) time.Time {
	for _, l := range ParseLog(p.Logs("supervisor")) {
		if l.Msg() == "sidecar signalled" || l.Msg() == "sidecar asked to stop" {
			if t, err := time.Parse(time.RFC3339Nano, l.Str("time")); err == nil {
				return t
			}
		}
	}
	return time.Time{}
}

// TestOnFailurePod: under restartPolicy OnFailure the app fails twice and
// is restarted in place by the kubelet; the sidecar lives through both
// restarts and is stopped gracefully once the third run succeeds.
func TestOnFailurePod(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "onfailure", Policy: pod.OnFailure,
				Apps:          []App{{Name: "app", Args: []string{"--sleep", "1s", "--fail-first", "2"}}},
				SupervisorEnv: append([]string{"SUPERVISOR_RESTART_POLICY=OnFailure"}, policyEnv...)})
			if err != nil {
				t.Fatal(err)
			}
			stampFiles := withStamps(&built, []string{"app"})
			p, st := runBuilt(t, built, 2*time.Minute)
			if st.Phase != pod.Succeeded {
				t.Errorf("phase %s, want Succeeded", st.Phase)
			}
			if c := st.Container("app"); c.Restarts != 2 || c.ExitCode != 0 {
				t.Errorf("app %+v, want 2 restarts then exit 0", c)
			}
			if c := st.Container("istio-proxy"); c.Restarts != 0 || c.ExitCode != 0 {
				t.Errorf("istio-proxy %+v, want one run ending 0 (stopped gracefully)", c)
			}
			if rec := Record(built.PilotRecord); !slices.Equal(rec[1:], []string{"signal SIGTERM", "exit 0"}) {
				t.Errorf("pilot-agent record %q, want only the final SIGTERM", rec)
			}
			msgs := Messages(ParseLog(p.Logs("supervisor")))
			if n := countOf(msgs, "app restarted by the kubelet: watching the new container"); n != 2 {
				t.Errorf("supervisor saw %d restarts, want 2: %q", n, msgs)
			}
			checkInvariants(t, appEnds(stampFiles), signalledAt(p), 3)
		})
	}
}

func countOf(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// TestAlwaysPod: under restartPolicy Always an app's exit never stops the
// sidecar; the supervisor idles, scanning nothing, and exits 0 on the pod's
// deletion.
func TestAlwaysPod(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "always", Policy: pod.Always,
				Apps:          []App{{Name: "app", Args: []string{"--sleep", "300ms"}}},
				SupervisorEnv: append([]string{"SUPERVISOR_RESTART_POLICY=Always"}, policyEnv...), Grace: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			p := Start(t, built)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The app exits 0 and is restarted, again and again.
			if _, err := p.WaitFor(ctx, func(s pod.Status) bool { return s.Container("app").Restarts >= 3 }); err != nil {
				t.Fatal(err)
			}
			waitLog(t, p, "restartPolicy Always: an app's exit never stops the sidecar; idle until the pod is deleted")
			if rec := Record(built.PilotRecord); len(rec) != 1 || !p.Status().Container("istio-proxy").Running {
				t.Fatalf("sidecar touched: %q", rec)
			}
			st, _ := deletePod(t, p)
			if c := st.Container("supervisor"); c.ExitCode != 0 {
				t.Errorf("supervisor exit %d on deletion, want 0", c.ExitCode)
			}
			if rec := Record(built.PilotRecord); !slices.Equal(rec[1:], []string{"signal SIGTERM", "exit 0"}) {
				t.Errorf("pilot-agent record %q, want only the kubelet's SIGTERM", rec)
			}
		})
	}
}

// TestNativeSidecarPod: with SUPERVISOR_NATIVE_SIDECAR the kubelet stops
// the sidecar; the supervisor ends at once and touches nothing.
func TestNativeSidecarPod(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "native", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}},
				SupervisorEnv: append([]string{"SUPERVISOR_NATIVE_SIDECAR=true"}, policyEnv...)})
			if err != nil {
				t.Fatal(err)
			}
			p := Start(t, built)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := p.WaitFor(ctx, func(s pod.Status) bool { c := s.Container("supervisor"); return c.Started && !c.Running })
			if err != nil {
				t.Fatal(err)
			}
			if c := st.Container("supervisor"); c.ExitCode != 0 {
				t.Errorf("supervisor exit %d", c.ExitCode)
			}
			if msg := p.TerminationMessage("supervisor"); !strings.Contains(msg, "native sidecar: nothing to do") {
				t.Errorf("termination message %q", msg)
			}
			if rec := Record(built.PilotRecord); len(rec) != 1 || !st.Container("istio-proxy").Running || !st.Container("app").Running {
				t.Errorf("something was touched: %q %s", rec, st)
			}
		})
	}
}

// TestSeveralSidecars: pilot-agent and a second sidecar, each with its own
// action, are both stopped after the app.
func TestSeveralSidecars(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "sidecars", Apps: []App{{Name: "app", Args: []string{"--sleep", "1s"}}},
				SupervisorEnv: append([]string{"SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,cloud-sql-proxy",
					"SUPERVISOR_SIDECAR_ACTIONS=cloud-sql-proxy=SIGINT"}, policyEnv...)})
			if err != nil {
				t.Fatal(err)
			}
			sqlRecord := addSidecar(t, &built, "cloud-sql-proxy")
			_, st := runBuilt(t, built, time.Minute)
			if st.Phase != pod.Succeeded {
				t.Errorf("phase %s", st)
			}
			if rec := Record(built.PilotRecord); !slices.Equal(rec[1:], []string{"signal SIGTERM", "exit 0"}) {
				t.Errorf("pilot-agent record %q, want SIGTERM (the outcome's action)", rec)
			}
			if rec := Record(sqlRecord); len(rec) < 2 || !slices.Equal(rec[1:], []string{"signal SIGINT", "exit 0"}) {
				t.Errorf("cloud-sql-proxy record %q, want SIGINT (its own action)", rec)
			}
		})
	}
}

// addSidecar adds a second stand-in sidecar, named name, after istio-proxy
// (other ports), and returns its record's host path.
func addSidecar(t *testing.T, b *Built, name string) string {
	t.Helper()
	i := slices.IndexFunc(b.Spec.Containers, func(c pod.Container) bool { return c.Name == "istio-proxy" })
	if i < 0 {
		t.Fatal("no istio-proxy to copy")
	}
	c := b.Spec.Containers[i]
	c.Name, c.PostStart = name, nil
	record, inside := filepath.Join(b.Dir, name+".record"), filepath.Join(b.Dir, name+".record")
	bin := filepath.Join(b.Dir, name+"-bin", name)
	switch b.Backend.(type) {
	case pod.Runc:
		record, inside = filepath.Join(b.Dir, "shared", name+".record"), SharedMount+"/"+name+".record"
		root := filepath.Join(b.Dir, "rootfs", name)
		if err := InstallTool(b.Spec.Containers[i].Rootfs+"/usr/local/bin/pilot-agent", root, "usr/local/bin/"+name); err != nil {
			t.Fatal(err)
		}
		c.Rootfs, bin = root, "/usr/local/bin/"+name
	default:
		if err := InstallTool(c.Argv[0], filepath.Dir(bin), name); err != nil {
			t.Fatal(err)
		}
	}
	c.Argv = []string{bin}
	c.Env = []string{"PODSIM_MODE=pilot-agent", "PILOT_RECORD=" + inside,
		"PILOT_ADMIN_ADDR=127.0.0.1:9801", "PILOT_HEALTH_ADDR=127.0.0.1:9802"}
	b.Spec.Containers = slices.Insert(b.Spec.Containers, i+1, c)
	return record
}

// TestMissingApp: an expected app container never appears (it finished
// before the supervisor started, or never started): after the bounded wait,
// the unknown action.
func TestMissingApp(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "missing", Apps: []App{{Name: "app", Args: []string{"--sleep", "1s", "--exit", "3"}}},
				SupervisorEnv: append([]string{"SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APPS=app,worker"}, policyEnv...)})
			if err != nil {
				t.Fatal(err)
			}
			p, st := runBuilt(t, built, time.Minute)
			msg := p.TerminationMessage("supervisor")
			// The app that was seen failed: that outweighs the missing one.
			if !strings.HasPrefix(msg, "failure: ") || !strings.Contains(msg, "never seen within SUPERVISOR_APP_START_TIMEOUT") {
				t.Errorf("termination message %q", msg)
			}
			if c := st.Container("istio-proxy"); c.ExitCode != 137 {
				t.Errorf("istio-proxy exit %d, want 137", c.ExitCode)
			}
		})
	}
}

// TestAppDoneBeforeSupervisor: the only app ended before the supervisor
// (the last container, started late) looked: bounded wait, then the unknown
// action (SIGTERM), logged.
func TestAppDoneBeforeSupervisor(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "early", Apps: []App{{Name: "app", Args: []string{"--exit", "3"}}}, SupervisorEnv: policyEnv})
			if err != nil {
				t.Fatal(err)
			}
			for i := range built.Spec.Containers {
				if c := &built.Spec.Containers[i]; c.Name == "supervisor" {
					c.StartDelay = time.Second // a slow image pull
				}
			}
			p, st := runBuilt(t, built, time.Minute)
			if msg := p.TerminationMessage("supervisor"); !strings.HasPrefix(msg, "unknown: ") {
				t.Errorf("termination message %q, want the unknown outcome", msg)
			}
			if c := st.Container("istio-proxy"); c.ExitCode != 0 {
				t.Errorf("istio-proxy exit %d, want 0 (SIGTERM, the unknown action)", c.ExitCode)
			}
			if !slices.Contains(Messages(ParseLog(p.Logs("supervisor"))), "app containers missing: they finished before the supervisor started, or never started") {
				t.Errorf("the log does not say why:\n%s", p.Logs("supervisor"))
			}
		})
	}
}

// TestNoSidecarPod: no sidecar ever appears: the supervisor says so and
// exits 0 within its bound.
func TestNoSidecarPod(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "nosidecar", Proxy: NoProxy, Apps: []App{{Name: "app", Args: []string{"--sleep", "1s"}}},
				SupervisorEnv: policyEnv})
			if err != nil {
				t.Fatal(err)
			}
			p, st := runBuilt(t, built, time.Minute)
			if st.Phase != pod.Succeeded || st.Container("supervisor").ExitCode != 0 {
				t.Errorf("status %s", st)
			}
			if msg := p.TerminationMessage("supervisor"); !strings.Contains(msg, "no sidecar appeared") {
				t.Errorf("termination message %q", msg)
			}
		})
	}
}

// TestOrphansOutliveMain: the app's main process exits 0 while a child of
// it would run on; the container is done (the runtime kills the rest), and
// the supervisor acts on the main process's exit, without waiting for the
// child.
func TestOrphansOutliveMain(t *testing.T) {
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			built, err := b.Build(Desc{Name: "orphans", Apps: []App{{Name: "app", Args: []string{"--sleep", "1s", "--orphan", "1m"}}},
				SupervisorEnv: policyEnv})
			if err != nil {
				t.Fatal(err)
			}
			begun := time.Now()
			_, st := runBuilt(t, built, 30*time.Second)
			if st.Phase != pod.Succeeded {
				t.Errorf("status %s", st)
			}
			t.Logf("pod done in %.1fs (the orphan would have run 60s)", time.Since(begun).Seconds())
		})
	}
}

// TestRandomPods runs generated Job pods (restart policy, number of apps,
// how long each runs, how each ends, restarts under OnFailure) and checks on
// each the two invariants from the harness's own record of container starts
// and ends, and the stand-in's receipt time of its first signal: the
// sidecar is never stopped while an app runs or is about to be restarted,
// and it is stopped within the configured bounds of the last app's end.
func TestRandomPods(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("RANDOM_PODS_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (RANDOM_PODS_SEED to repeat)", seed)
	r := rand.New(rand.NewSource(seed))
	bs := Builders(t)
	for i := 0; i < 8; i++ {
		b := bs[i%len(bs)]
		policy := pod.Never
		if r.Intn(2) == 0 {
			policy = pod.OnFailure
		}
		var apps []App
		var names []string
		for a := 0; a < 1+r.Intn(2); a++ {
			args := []string{"--sleep", fmt.Sprintf("%dms", 800+r.Intn(1200))}
			switch r.Intn(3) {
			case 0:
				args = append(args, "--exit", "3")
			case 1:
				args = append(args, "--kill", "9")
			}
			if policy == pod.OnFailure {
				args = append([]string{"--fail-first", strconv.Itoa(r.Intn(3))}, args...)
				args = noFailure(args)
			}
			name := fmt.Sprintf("app%d", a)
			app := App{Name: name, Args: args}
			if r.Intn(2) == 0 {
				// Seen in no container of the pod for a while at each
				// start (issue 15; the namespaces backend only).
				app.CgroupDelay = time.Duration(50+r.Intn(350)) * time.Millisecond
			}
			apps = append(apps, app)
			names = append(names, name)
		}
		desc := fmt.Sprintf("%s %v", policy, apps)
		t.Run(fmt.Sprintf("%d-%s", i, b.Name), func(t *testing.T) {
			env := append([]string{"SUPERVISOR_RESTART_POLICY=" + string(policy), fmt.Sprintf("SUPERVISOR_APP_CONTAINERS=%d", len(apps)),
				"SUPERVISOR_DELETION_GRACE=0s"}, policyEnv...)
			built, err := b.Build(Desc{Name: "random", Policy: policy, Apps: apps, SupervisorEnv: env})
			if err != nil {
				t.Fatal(err)
			}
			stampFiles := withStamps(&built, names)
			p, st := runBuilt(t, built, 2*time.Minute)
			t.Logf("%s: %s", desc, st)
			runs := 0
			for _, c := range st.Containers {
				if slices.Contains(names, c.Name) {
					runs += 1 + c.Restarts
				}
			}
			checkInvariants(t, appEnds(stampFiles), signalledAt(p), runs)
		})
	}
}

// noFailure makes an OnFailure app's last run succeed: its failures are the
// first --fail-first runs only (the Job controller would delete a pod that
// never succeeds, ending the run another way).
func noFailure(args []string) []string {
	out := args[:0]
	for i := 0; i < len(args); i++ {
		if (args[i] == "--exit" || args[i] == "--kill") && i+1 < len(args) {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// checkInvariants: the supervisor's first signal to the sidecar came after
// the end of every app run, restarts included (had it come while an app ran
// or before a restart, that run would have ended after it), and within the
// bounds of the last end. runs is how many runs there were, so that none
// is missing from the stamps.
func checkInvariants(t *testing.T, ends []time.Time, signalled time.Time, runs int) {
	t.Helper()
	if signalled.IsZero() {
		t.Fatal("the supervisor never signalled the sidecar")
	}
	if len(ends) != runs {
		t.Fatalf("%d app runs stamped their end, want %d", len(ends), runs)
	}
	last := slices.MaxFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	// The log's time is cut to the millisecond.
	if signalled.Add(time.Millisecond).Before(last) {
		t.Errorf("sidecar signalled at %s, before the last app run ended at %s",
			signalled.Format("15:04:05.000000"), last.Format("15:04:05.000000"))
	}
	// Bound: every app is seen (SUPERVISOR_APP_CONTAINERS are all there), so
	// only the reap, the pidfd wake-up and scheduling on a loaded machine
	// stand between; 2 s is far above all three.
	if late := signalled.Sub(last); late > 2*time.Second {
		t.Errorf("sidecar signalled %s after the last app run ended", late)
	}
}

// TestRestartNotYetMoved: issue 15's pod, with every restart's main process
// held 800ms (eight scans) in the pod's PID namespace before it joins its
// container's cgroup. Under OnFailure app1 fails once, then app0 fails
// (300ms later, while app1's restart is still out of its cgroup) and fails
// once more (app1 starts 800ms after app0, the first start waiting too);
// the sidecar must outlive every run. Before the fix the
// supervisor took app1's restart for app1's, then, in its real cgroup, for
// a new container filling app0's slot: its one exit 0 counted for both, and
// istio-proxy was stopped while app0 still had runs to go. On the runc
// backend (runc places its init in the cgroup first) the same pod runs
// without the window.
func TestRestartNotYetMoved(t *testing.T) {
	names := []string{"app0", "app1"}
	for _, b := range Builders(t) {
		t.Run(b.Name, func(t *testing.T) {
			apps := []App{
				{Name: "app0", Args: []string{"--fail-first", "2", "--sleep", "2600ms"}, CgroupDelay: 800 * time.Millisecond},
				{Name: "app1", Args: []string{"--fail-first", "1", "--sleep", "1500ms"}, CgroupDelay: 800 * time.Millisecond},
			}
			env := append([]string{"SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_DELETION_GRACE=0s"}, policyEnv...)
			built, err := b.Build(Desc{Name: "notmoved", Policy: pod.OnFailure, Apps: apps, SupervisorEnv: env})
			if err != nil {
				t.Fatal(err)
			}
			stampFiles := withStamps(&built, names)
			p, st := runBuilt(t, built, 2*time.Minute)
			if st.Phase != pod.Succeeded {
				t.Fatalf("phase %s, want Succeeded: %s", st.Phase, st)
			}
			runs := 0
			for _, c := range st.Containers {
				if slices.Contains(names, c.Name) {
					runs += 1 + c.Restarts
				}
			}
			if runs != 5 {
				t.Errorf("%d app runs, want 5 (app0 three, app1 two): %s", runs, st)
			}
			checkInvariants(t, appEnds(stampFiles), signalledAt(p), runs)
		})
	}
}
