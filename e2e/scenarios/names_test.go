package scenarios

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// Issue 18's pod shapes: the supervisor knows every container by the name
// the kubelet's termination-message mount gives it, waits for the apps
// SUPERVISOR_APPS names, stops istio-proxy, and leaves anything else alone.

// logFor lists the supervisor's log lines with message msg about container.
func logFor(p *pod.Pod, msg, container string) []LogLine { return LogWhere(p, About(msg, container)) }

// succeeded checks the pod ended Succeeded with istio-proxy stopped once,
// exit 0.
func succeeded(t *testing.T, st pod.Status) {
	t.Helper()
	if st.Phase != pod.Succeeded {
		t.Errorf("phase %s, want Succeeded (%s)", st.Phase, st)
	}
	if c := st.Container("istio-proxy"); c.ExitCode != 0 || c.Restarts != 0 {
		t.Errorf("istio-proxy %+v, want exit 0, never restarted", c)
	}
}

func TestNamedPods(t *testing.T) {
	for _, b := range Builders(t) {
		// A native sidecar of the pod's own beside the classic istio-proxy:
		// not an app (the kubelet stops it only after the apps, so waiting
		// for it would hang the Job), and not stopped by the supervisor.
		// It is restarted while the supervisor still looks for an app (late
		// starts only then): each new instance, a new container of the same
		// name, is seen and never taken for an app either. Each instance of
		// logship runs until the supervisor has logged it.
		t.Run(b.Name+"/native sidecar, restarted", func(t *testing.T) {
			d := Desc{Name: "native", Apps: []App{
				{Name: "logship", Native: true, Cued: true},
				{Name: "app", Cued: true, UID: 1000},
				{Name: "late", Cued: true, UID: 1000},
			}, SupervisorEnv: patient()}
			built := b.MustBuild(t, d)
			open := make(chan struct{})
			StartLast(&built.Spec, "late", Gate(open))
			p := Start(t, built)
			// An instance is known by its main process's PID: the supervisor
			// may log one twice (runc, cgroup v1: as its cgroups change while
			// it is set up, or as it exits).
			const instances = 3
			leftAlone := func() int {
				pids := map[string]bool{}
				for _, l := range logFor(p, "container neither waited for nor stopped", "logship") {
					pids[l.Str("pid")] = true
				}
				return len(pids)
			}
			for k := 1; k <= instances; k++ {
				ctx, cancel := context.WithTimeout(context.Background(), EventBound)
				err := p.Await(ctx, func() bool { return leftAlone() >= k })
				cancel()
				if err != nil {
					t.Fatalf("instance %d of the native sidecar not logged as left alone: %v", k, err)
				}
				if k < instances {
					if err := built.Release("logship"); err != nil {
						t.Fatal(err)
					}
				}
			}
			close(open)
			releaseApps(t, p, built, d.Apps[1:])
			st := p.MustWaitPhase(t, EventBound)
			succeeded(t, st)
			if c := st.Container("logship"); c.Restarts != instances-1 {
				t.Errorf("logship %+v, want %d restarts", c, instances-1)
			}
			if len(logFor(p, "app found", "logship")) != 0 {
				t.Errorf("the native sidecar was taken for an app")
			}
			if msg := p.TerminationMessage("supervisor"); !strings.HasPrefix(msg, "success: all 2 app containers exit 0") {
				t.Errorf("termination message %q", msg)
			}
		})
		// An ephemeral container (kubectl debug) added while the app runs and
		// left running: neither waited for nor stopped. (Once the apps are
		// found the supervisor does not scan: it may never see it.)
		t.Run(b.Name+"/ephemeral container", func(t *testing.T) {
			d := Desc{Name: "debug", Apps: []App{
				{Name: "app", Cued: true, UID: 1000},
				{Name: "debugger", Ephemeral: true, Args: []string{"--sleep", "1h"}},
			}, SupervisorEnv: patient()}
			p, built := run(t, b, d)
			WaitLogFor(t, p, "app found", "app")
			ctx, cancel := context.WithTimeout(context.Background(), EventBound)
			defer cancel()
			if err := p.StartEphemeral(ctx, "debugger"); err != nil {
				t.Fatal(err)
			}
			releaseApps(t, p, built, d.Apps[:1])
			st := p.MustWaitPhase(t, EventBound)
			succeeded(t, st)
			if len(logFor(p, "app found", "debugger")) != 0 {
				t.Errorf("the debug container was taken for an app")
			}
			if !st.Container("debugger").Running {
				t.Errorf("the debug container was stopped: %+v", st.Container("debugger"))
			}
		})
		// OnFailure, two apps, one failing twice, with a debug container
		// started meanwhile: each restart is the same name coming back, the
		// debug container is never taken for one.
		t.Run(b.Name+"/onfailure restarts by name", func(t *testing.T) {
			names := []string{"a0", "a1"}
			d := Desc{Name: "restarts", Policy: pod.OnFailure, Apps: []App{
				{Name: "a0", Cued: true, Args: []string{"--fail-first", "2"}},
				{Name: "a1", Cued: true},
				{Name: "debugger", Ephemeral: true, Args: []string{"--sleep", "1h"}},
			}, SupervisorEnv: patient("SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_DELETION_GRACE=0s")}
			built := b.MustBuild(t, d)
			stamps := withStamps(&built, names)
			p := Start(t, built)
			WaitLogFor(t, p, "app found", "a0")
			ctx, cancel := context.WithTimeout(context.Background(), EventBound)
			defer cancel()
			if err := p.StartEphemeral(ctx, "debugger"); err != nil {
				t.Fatal(err)
			}
			// Every run ends once the supervisor has found it: a0's three,
			// then a1's one.
			if err := releaseRuns(p, built, "a0", 3, nil); err != nil {
				t.Fatal(err)
			}
			if err := releaseRuns(p, built, "a1", 1, nil); err != nil {
				t.Fatal(err)
			}
			st, err := p.WaitPhase(ctx)
			if err != nil {
				t.Fatal(err)
			}
			succeeded(t, st)
			if c := st.Container("a0"); c.Restarts != 2 {
				t.Errorf("a0 restarted %d times, want 2", c.Restarts)
			}
			for _, l := range ParseLog(p.Logs("supervisor")) {
				if l.Msg() == "app restarted by the kubelet: watching the new container" &&
					(l.Str("container") != "a0" || l.Str("replaces") != "a0") {
					t.Errorf("a restart taken for another container's: %v", l)
				}
			}
			if n := len(logFor(p, "app restarted by the kubelet: watching the new container", "a0")); n != 2 {
				t.Errorf("%d restarts of a0 seen, want 2:\n%s", n, p.Logs("supervisor"))
			}
			checkInvariants(t, p, appEnds(stamps), 4)
		})
		// `kubectl exec ... sidecar-supervisor status` while the app runs:
		// every container by name and kind, and what the supervisor waits for.
		t.Run(b.Name+"/status", func(t *testing.T) {
			d := Desc{Name: "status", Apps: []App{
				{Name: "logship", Native: true, Args: []string{"--sleep", "1h"}},
				{Name: "app", Cued: true, UID: 1000},
			}, SupervisorEnv: patient()}
			p, built := run(t, b, d)
			// The progress `status` shows is written once the scan that
			// found the app is done, after its "app found" line.
			waiting := "running: waiting for app app (pid "
			if !eventually(func() bool { return strings.Contains(p.TerminationMessage("supervisor"), waiting) }) {
				t.Fatalf("the supervisor's termination-message file never said %q within %s: %q", waiting, EventBound, p.TerminationMessage("supervisor"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), EventBound)
			defer cancel()
			sup := built.Spec.Containers[len(built.Spec.Containers)-1]
			out, err := p.Exec(ctx, "supervisor", sup.Argv[0], "status")
			if err != nil {
				t.Fatalf("status: %v\n%s", err, out)
			}
			t.Logf("status:\n%s", out)
			for _, want := range []string{"containers, by their Kubernetes names:", "app: waited for", "sidecar: stopped after the apps",
				"other: left alone, named neither among the apps nor the sidecars", "supervisor, running: waiting for app app (pid "} {
				if !strings.Contains(string(out), want) {
					t.Errorf("status lacks %q", want)
				}
			}
			releaseApps(t, p, built, d.Apps[1:])
			succeeded(t, p.MustWaitPhase(t, EventBound))
		})
		// Where names cannot be read (another runtime), today's rules stand,
		// and the supervisor says so once.
		t.Run(b.Name+"/without names", func(t *testing.T) {
			d := Desc{Name: "nonames", NoNames: true, Apps: []App{{Name: "app", Cued: true, UID: 1000}},
				SupervisorEnv: patient()}
			p, built := run(t, b, d)
			releaseApps(t, p, built, d.Apps)
			st := p.MustWaitPhase(t, EventBound)
			succeeded(t, st)
			msgs := Messages(ParseLog(p.Logs("supervisor")))
			if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, "container names cannot be read here") }) {
				t.Errorf("no word of the missing names: %q", msgs)
			}
		})
	}
}
