package scenarios

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// TestRandomPods runs generated Job pods (restart policy, number of apps,
// how long each run goes on once the supervisor has found it, how each
// ends, restarts under OnFailure) and checks on each the invariants from
// the harness's own record of the runs' ends and the supervisor's log: the
// sidecar is never stopped while an app runs or is about to be restarted,
// and it is stopped on what the supervisor saw of every run, never on a
// timeout. Every run is cued: it ends only after the supervisor has found
// it, then after a random while, each app on its own.
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
		lengths := map[string][]time.Duration{} // each run's, once found
		for a := 0; a < 1+r.Intn(2); a++ {
			var args []string
			switch r.Intn(3) {
			case 0:
				args = append(args, "--exit", "3")
			case 1:
				args = append(args, "--kill", "9")
			}
			runs := 1
			if policy == pod.OnFailure {
				failures := r.Intn(3)
				args = append([]string{"--fail-first", strconv.Itoa(failures)}, noFailure(args)...)
				runs += failures
			}
			name := fmt.Sprintf("app%d", a)
			for range runs {
				lengths[name] = append(lengths[name], time.Duration(r.Intn(1200))*time.Millisecond)
			}
			app := App{Name: name, Cued: true, Args: args}
			if r.Intn(2) == 0 {
				// Seen in no container of the pod for a while at each
				// start (issue 15; the namespaces backend only).
				app.CgroupDelay = time.Duration(50+r.Intn(350)) * time.Millisecond
			}
			apps = append(apps, app)
			names = append(names, name)
		}
		desc := fmt.Sprintf("%s %v, run lengths %v", policy, apps, lengths)
		t.Run(fmt.Sprintf("%d-%s", i, b.Name), func(t *testing.T) {
			env := patient("SUPERVISOR_RESTART_POLICY="+string(policy), fmt.Sprintf("SUPERVISOR_APP_CONTAINERS=%d", len(apps)),
				"SUPERVISOR_DELETION_GRACE=0s")
			built := b.MustBuild(t, Desc{Name: "random", Policy: policy, Apps: apps, SupervisorEnv: env})
			stampFiles := withStamps(&built, names)
			p := Start(t, built)
			// Each app's runs are released by a goroutine of its own, so that
			// the apps' runs interleave as the lengths say.
			errs := make(chan error, len(names))
			for _, name := range names {
				go func() {
					k := 0
					errs <- releaseRuns(p, built, name, len(lengths[name]), func() {
						time.Sleep(lengths[name][k])
						k++
					})
				}()
			}
			for range names {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			st := p.MustWaitPhase(t, EventBound)
			t.Logf("%s: %s", desc, st)
			checkInvariants(t, p, appEnds(stampFiles), runsOf(st, names))
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

// runsOf is how many runs the named apps have had, restarts included.
func runsOf(st pod.Status, names []string) int {
	runs := 0
	for _, n := range names {
		runs += 1 + st.Container(n).Restarts
	}
	return runs
}

// checkInvariants: the supervisor's first signal to the sidecar came after
// the end of every app run, restarts included (had it come while an app ran
// or before a restart, that run would have ended after it); and it came of
// what the supervisor saw of each run, not of a timeout: an "app exited"
// line with the run's exit status for every run before that signal, and an
// outcome other than unknown. (Where a bound on the delay stood, 2 s after
// the last end, these say what it was for, whatever the machine's speed.)
// runs is how many runs there were, so that none is missing.
func checkInvariants(t *testing.T, p *pod.Pod, ends []time.Time, runs int) {
	t.Helper()
	signalled := signalledAt(p)
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
	read := 0
	for _, l := range ParseLog(p.Logs("supervisor")) {
		if l.Msg() == "sidecar signalled" || l.Msg() == "sidecar asked to stop" {
			break
		}
		if l.Msg() == "app exited" && l.Str("exit_code") != "" {
			read++
		}
	}
	if read != runs {
		t.Errorf("%d app runs' exit statuses read before the sidecar's signal, want %d (one per run)", read, runs)
	}
	if msg := p.TerminationMessage("supervisor"); strings.HasPrefix(msg, "unknown") {
		t.Errorf("termination message %q: every run was seen, the outcome is not unknown", msg)
	}
}

// TestRestartNotYetMoved: issue 15's pod. Under OnFailure app1 fails once,
// and its restart's main process, in the pod's PID namespace already, is
// held out of its container's cgroup while the supervisor scans (it awaits
// that restart), app0 fails, the supervisor logs that, and scans again;
// app0 then fails once more. The sidecar must outlive every run. Before
// the fix the supervisor took app1's restart for app1's, then, in its real
// cgroup, for a new container filling app0's slot: its one exit 0 counted
// for both, and istio-proxy was stopped while app0 still had runs to go.
// Every start is also held 800ms out of its cgroup (CgroupDelay). On the
// runc backend (runc places its init in the cgroup first) there is no
// such window: the same runs come, app0's first failure after app1's.
//
// Every run is cued and released only once the supervisor has found it;
// the window is held until the scans are seen (the supervisor's read
// system calls, /proc/PID/io: while it awaits a restart it reads nothing
// but /proc), not for a time.
func TestRestartNotYetMoved(t *testing.T) {
	names := []string{"app0", "app1"}
	onBackends(t, func(t *testing.T, b Builder) {
		var built Built
		var sup int // the supervisor's host PID (namespaces backend)
		// The hold of app1's restart, run by the kubelet while the
		// process is out of its cgroup.
		hold := func(ctx context.Context, p *pod.Pod, attempt int) error {
			if attempt != 1 {
				return nil
			}
			if err := scanned(ctx, sup); err != nil {
				return err
			}
			if err := built.Release("app0"); err != nil {
				return err
			}
			if err := AwaitLog(p, 1, About("app exited", "app0")); err != nil {
				return err
			}
			return scanned(ctx, sup)
		}
		apps := []App{
			{Name: "app0", Cued: true, Args: []string{"--fail-first", "2"}, CgroupDelay: 800 * time.Millisecond},
			{Name: "app1", Cued: true, Args: []string{"--fail-first", "1"}, CgroupDelay: 800 * time.Millisecond, CgroupHold: hold},
		}
		env := patient("SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_DELETION_GRACE=0s")
		built = b.MustBuild(t, Desc{Name: "notmoved", Policy: pod.OnFailure, Apps: apps, SupervisorEnv: env})
		stampFiles := withStamps(&built, names)
		p := Start(t, built)
		if err := AwaitLog(p, 1, About("app found", "app0")); err != nil {
			t.Fatal(err)
		}
		sup = p.Status().Container("supervisor").PID
		_, namespaces := built.Backend.(pod.Namespaces)
		if err := releaseRun(p, built, "app1", 1, nil); err != nil {
			t.Fatal(err)
		}
		if !namespaces {
			if err := AwaitLog(p, 1, About("app exited", "app1")); err != nil {
				t.Fatal(err)
			}
			if err := built.Release("app0"); err != nil {
				t.Fatal(err)
			}
		}
		errs := make(chan error, 2)
		go func() { errs <- releaseRun(p, built, "app1", 2, nil) }()
		go func() {
			err := releaseRun(p, built, "app0", 2, nil)
			if err == nil {
				err = releaseRun(p, built, "app0", 3, nil)
			}
			errs <- err
		}()
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		st := p.MustWaitPhase(t, EventBound)
		if st.Phase != pod.Succeeded {
			t.Fatalf("phase %s, want Succeeded: %s", st.Phase, st)
		}
		runs := runsOf(st, names)
		if runs != 5 {
			t.Errorf("%d app runs, want 5 (app0 three, app1 two): %s", runs, st)
		}
		if namespaces {
			// The interleaving held: app0's failure was logged before
			// app1's restart, held out of its cgroup, was found.
			failed, found, n := -1, -1, 0
			for i, l := range ParseLog(p.Logs("supervisor")) {
				if failed < 0 && About("app exited", "app0")(l) {
					failed = i
				}
				if About("app found", "app1")(l) {
					if n++; n == 2 {
						found = i
					}
				}
			}
			if failed < 0 || found < 0 || failed > found {
				t.Errorf("app0's failure (line %d) not logged before app1's restart was found (line %d)", failed, found)
			}
		}
		checkInvariants(t, p, appEnds(stampFiles), runs)
	})
}

// scanned returns once the process pid (the supervisor awaiting a
// restart) has made enough read system calls for a few scans of the pod's
// /proc (three files of each of its processes each), within EventBound.
func scanned(ctx context.Context, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, EventBound)
	defer cancel()
	first, err := Syscr(pid)
	if err != nil {
		return err
	}
	for {
		n, err := Syscr(pid)
		if err != nil {
			return err
		}
		if n-first >= 100 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pid %d made %d reads in %s: no scan seen: %w", pid, n-first, EventBound, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
