package scenarios

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) { pod.RunTests(m) }

// TestJobs is the core table: a Job pod (restartPolicy Never) with the
// stand-in pilot-agent, on every backend.
func TestJobs(t *testing.T) {
	tests := []struct {
		name string
		desc Desc
		// want
		phase      pod.Phase
		codes      map[string]int
		record     []string // the stand-in's record after its start line
		summary    string   // in the termination message
		supervisor []string // log messages, in order (a subsequence)
	}{
		{
			name:  "app exits 0",
			desc:  Desc{Apps: []App{{Name: "app", Cued: true, UID: 1000}}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0, "supervisor": 0},
			record:     []string{"signal SIGTERM", "exit 0"},
			summary:    "success: app exit 0; action SIGTERM; sidecar stopped",
			supervisor: []string{"starting", "app found", "app exited", "decision", "sidecar signalled", "sidecar stopped", "done"},
		},
		{
			name:  "app exits 3",
			desc:  Desc{Apps: []App{{Name: "app", Cued: true, Args: []string{"--exit", "3"}}}},
			phase: pod.Failed, codes: map[string]int{"app": 3, "istio-proxy": 137, "supervisor": 0},
			record:  []string{},
			summary: "failure: app exit 3; action SIGKILL",
		},
		{
			name:  "app killed by a signal",
			desc:  Desc{Apps: []App{{Name: "app", Cued: true, Args: []string{"--kill", "9"}}}},
			phase: pod.Failed, codes: map[string]int{"app": 137, "istio-proxy": 137, "supervisor": 0},
			record:  []string{},
			summary: "failure: app killed by SIGKILL; action SIGKILL",
		},
		{
			name: "two apps, the sidecar stops after the second",
			desc: Desc{Apps: []App{{Name: "quick", Cued: true},
				{Name: "slow", Cued: true}}},
			phase: pod.Succeeded, codes: map[string]int{"quick": 0, "slow": 0, "istio-proxy": 0},
			record:  []string{"signal SIGTERM", "exit 0"},
			summary: "success: all 2 app containers exit 0",
		},
		{
			name: "sidecar starts after the app is done",
			// istio-proxy starts once the app has ended, and the supervisor,
			// after it in the spec, later still: the look for the app ends
			// (the outcome, unknown: SIGTERM).
			desc: Desc{Apps: []App{{Name: "app"}}, ProxyStartAfter: pod.When(pod.Ended("app")),
				SupervisorEnv: []string{"SUPERVISOR_APP_START_TIMEOUT=2s"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record:  []string{"signal SIGTERM", "exit 0"},
			summary: "unknown: ",
		},
		{
			name: "sidecar ignores SIGTERM",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}},
				ProxyEnv: []string{"PILOT_IGNORE_TERM=1"}, SupervisorEnv: []string{"SUPERVISOR_STOP_TIMEOUT=1s"}},
			phase: pod.Failed, codes: map[string]int{"app": 0, "istio-proxy": 137, "supervisor": 0},
			record:     []string{"signal SIGTERM"},
			summary:    "pilot-agent did not stop within 1s, sent SIGKILL",
			supervisor: []string{"sidecar signalled", "sidecar did not stop in time: sending SIGKILL", "sidecar signalled", "sidecar stopped"},
		},
		{
			name: "HTTP action",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}},
				SupervisorEnv: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record:     []string{"drain", "quitquitquit", "exit 0 at once"},
			summary:    "action POST http://127.0.0.1:15020/quitquitquit",
			supervisor: []string{"decision", "sidecar drained ahead of its quit", "sidecar asked to stop", "sidecar stopped"},
		},
		// Istio's releases before 1.26 (the stand-in follows each one's
		// source, cmd/podsim/pilotagent.go). 1.21-1.25: the quit alone
		// would drain; here a drain would last the hour and end in the
		// SIGKILL after STOP_TIMEOUT.
		{
			name: "HTTP action, Istio 1.21-1.25: /drain first, no drain",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}}, ProxyEnv: []string{"PILOT_ISTIO=1.24", "PILOT_DRAIN=1h"},
				SupervisorEnv: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record:     []string{"drain", "quitquitquit", "exit 0 at once"},
			supervisor: []string{"decision", "sidecar drained ahead of its quit", "sidecar asked to stop", "sidecar stopped"},
		},
		{
			name: "HTTP action, Istio 1.23 with EXIT_ON_ZERO_ACTIVE_CONNECTIONS: no drain either",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}},
				ProxyEnv:      []string{"PILOT_ISTIO=1.23", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=1h"},
				SupervisorEnv: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record: []string{"drain", "quitquitquit", "exit 0 at once"},
		},
		// 1.20 has no /drain, and its quit is SIGTERM to itself: the
		// drain, then exit 0.
		{
			name: "HTTP action, Istio 1.20: the quit drains, exit 0",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}}, ProxyEnv: []string{"PILOT_ISTIO=1.20"},
				SupervisorEnv: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record:     []string{"refused POST /drain 404", "quitquitquit", "signal SIGTERM", "exit 0"},
			supervisor: []string{"decision", "sidecar has no drain endpoint: its quit will drain first", "sidecar asked to stop", "sidecar stopped"},
		},
		{
			name: "HTTP action refused falls back to SIGTERM",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}},
				SupervisorEnv: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15999/quitquitquit", "SUPERVISOR_HTTP_TIMEOUT=1s"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record:     []string{"signal SIGTERM", "exit 0"},
			supervisor: []string{"decision", "http action failed: falling back to SIGTERM", "sidecar signalled", "sidecar stopped"},
		},
		// A bad setting, and a forced exit-status method that cannot work
		// (accounting without a state directory): each is logged, named
		// in the termination message and replaced; the Job completes.
		{
			name: "bad settings run on with others in their place",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}},
				SupervisorEnv: []string{"SUPERVISOR_STOP_TIMEOUT=soon", "SUPERVISOR_EXIT_STATUS=accounting"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0, "supervisor": 0},
			record: []string{"signal SIGTERM", "exit 0"},
			summary: `bad settings, run with others in their place: SUPERVISOR_STOP_TIMEOUT="soon": want a duration such as 30s, 1m30s or 500ms ` +
				`(its default, 30s, used in its place); SUPERVISOR_EXIT_STATUS=accounting cannot work here: no state directory`,
			supervisor: []string{
				"bad setting: the supervisor runs on with the value named in its place, so that the Job still completes; fix the setting",
				"starting",
				"bad setting: the supervisor runs on with auto's method, so that the Job still completes; fix the setting",
				"sidecar stopped", "done"},
		},
		{
			name: "app held until the proxy is ready",
			desc: Desc{Apps: []App{{Name: "app", Cued: true}}, HoldApp: true,
				ProxyEnv: []string{"PILOT_READY_DELAY=500ms"}},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "istio-proxy": 0},
			record: []string{"signal SIGTERM", "exit 0"},
		},
	}
	for _, b := range Builders(t) {
		for _, tt := range tests {
			t.Run(b.Name+"/"+tt.name, func(t *testing.T) {
				d := tt.desc
				d.Name = "job"
				d.SupervisorEnv = patient(d.SupervisorEnv...)
				p, built := run(t, b, d)
				if slices.ContainsFunc(d.Apps, func(a App) bool { return a.Cued }) {
					// Signals reach a stand-in with its handlers in place.
					waitRecordStart(t, built.PilotRecord)
				}
				releaseApps(t, p, built, d.Apps)
				st := p.MustWaitPhase(t, EventBound)
				checkEnd(t, st, tt.phase, tt.codes)
				checkRecord(t, built.PilotRecord, tt.record...)
				checkSummary(t, p, tt.summary)
				checkLogOrder(t, p, tt.supervisor...)
			})
		}
	}
}

// TestTwoAppsOrder: while the second app runs, the sidecar is untouched.
func TestTwoAppsOrder(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, built := run(t, b, Desc{Name: "two", SupervisorEnv: patient(), Apps: []App{
			// quick ends once the supervisor has found it.
			{Name: "quick", Cued: true}, {Name: "slow", Args: []string{"--sleep", "1h"}}}})
		releaseApps(t, p, built, []App{{Name: "quick", Cued: true}})
		p.MustWaitFor(t, EventBound, func(s pod.Status) bool { return pod.Ended("quick")(s) && s.Container("supervisor").Running })
		// The supervisor has taken quick's exit in and waits on for slow,
		// as its progress says (written after the step where it would have
		// gone on to decide): nothing was touched by then.
		waitLog(t, p, "app exited")
		if !eventually(func() bool {
			m := p.TerminationMessage("supervisor")
			first, _, _ := strings.Cut(m, "\n")
			return strings.HasPrefix(first, "running: waiting for app ") && !strings.Contains(first, ",") &&
				strings.Contains(m, "): exit 0") && strings.Contains(m, "): running")
		}) {
			t.Fatalf("the supervisor's progress does not say it waits for one app once quick exited 0: %q", p.TerminationMessage("supervisor"))
		}
		if rec := touched(Record(built.PilotRecord)); len(rec) != 0 || !p.Status().Container("istio-proxy").Running {
			t.Fatalf("sidecar touched while an app runs: %q", rec)
		}
		if err := p.Signal("slow", syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		st := p.MustWaitPhase(t, EventBound)
		if st.Container("istio-proxy").ExitCode != 137 || st.Phase != pod.Failed {
			t.Errorf("after slow was killed by SIGKILL: %s, want istio-proxy 137 and Failed", st)
		}
	})
}

// checkRefused: the supervisor exits code before touching anything, its
// output saying says.
func checkRefused(t *testing.T, p *pod.Pod, built Built, code int, says string) {
	t.Helper()
	st := p.MustWaitFor(t, EventBound, pod.Ended("supervisor"))
	if c := st.Container("supervisor"); c.ExitCode != code {
		t.Errorf("supervisor exit %d, want %d", c.ExitCode, code)
	}
	if logs := p.Logs("supervisor"); !strings.Contains(logs, says) {
		t.Errorf("supervisor output does not say %q:\n%s", says, logs)
	}
	if rec := touched(Record(built.PilotRecord)); len(rec) != 0 || !st.Container("app").Running || !st.Container("istio-proxy").Running {
		t.Errorf("something was touched: record %q, status %s", rec, st)
	}
}

// TestNotShared: without a shared PID namespace, exit 1 saying how to fix
// it, and touching nothing.
func TestNotShared(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, built := run(t, b, Desc{Name: "unshared", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}},
			SupervisorOwnPIDNS: true})
		checkRefused(t, p, built, 1, "shareProcessNamespace: true")
		checkSummary(t, p, "shareProcessNamespace")
	})
}

// TestSupervisorTerminated: SIGTERM to the supervisor mid-wait (pod
// deletion): it exits 0 at once and leaves the sidecar alone.
func TestSupervisorTerminated(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, built := run(t, b, Desc{Name: "term", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}}})
		waitLog(t, p, "app found")
		if err := p.Signal("supervisor", syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		st := p.MustWaitFor(t, EventBound, func(s pod.Status) bool { return !s.Container("supervisor").Running })
		if c := st.Container("supervisor"); c.ExitCode != 0 {
			t.Errorf("supervisor exit %d, want 0", c.ExitCode)
		}
		if rec := touched(Record(built.PilotRecord)); len(rec) != 0 || !st.Container("istio-proxy").Running {
			t.Errorf("sidecar touched: %q", rec)
		}
	})
}

// TestPodDeletion: the kubelet SIGTERMs every container at once; the app
// dies of it. That is no Job failure: the supervisor must not SIGKILL the
// draining proxy. Its own SIGTERM tells it so: SUPERVISOR_DELETION_GRACE
// (how long after an app's death by SIGTERM it may come) is long here, as
// the kubelet signals each container from a goroutine of its own, in any
// order and with any delay between them; the supervisor exits on its
// SIGTERM at once, so that costs nothing. The grace period too only bounds
// the drain.
func TestPodDeletion(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, built := run(t, b, Desc{Name: "delete", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}},
			ProxyEnv: []string{"PILOT_DRAIN=1s"}, Grace: EventBound, SupervisorEnv: []string{"SUPERVISOR_DELETION_GRACE=1m"}})
		waitLog(t, p, "app found")
		// The stand-in records its start once its signal handlers are in
		// place; a SIGTERM before that (a loaded machine) kills it: 143.
		waitRecordStart(t, built.PilotRecord)
		ctx, cancel := context.WithTimeout(context.Background(), 2*EventBound)
		defer cancel()
		st := p.Delete(ctx)
		if c := st.Container("istio-proxy"); c.ExitCode != 0 {
			t.Errorf("istio-proxy exit %d, want 0 (drained, not killed)", c.ExitCode)
		}
		checkRecord(t, built.PilotRecord, "signal SIGTERM", "exit 0") // the kubelet's SIGTERM
		if c := st.Container("supervisor"); c.ExitCode != 0 {
			t.Errorf("supervisor exit %d, want 0", c.ExitCode)
		}
	})
}

// TestControl: without the supervisor the pod never completes: once the
// app is done and istio-proxy up, it is given 3s more to (wrongly)
// complete.
func TestControl(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, _ := run(t, b, Desc{Name: "control", NoSupervisor: true, Apps: []App{{Name: "app"}}})
		checkControl(t, p)
	})
}

// TestSidecarStartingAsAppEnds: issue 16. istio-proxy starts last (as
// Istio's injector orders it), and its pilot-agent asks for SIGTERM
// (signal.Notify) only once the test lets it, as the real one asks only
// after its status server is up; the app ends as soon as the supervisor has
// found it. A SIGTERM sent then would kill pilot-agent by its Go runtime's
// default action (143: the pod Failed). The supervisor must wait until
// pilot-agent has started envoy, and only then stop it: exit 0, the pod
// Succeeded.
func TestSidecarStartingAsAppEnds(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		d := Desc{Name: "job", Apps: []App{{Name: "app", Cued: true, UID: 1000}},
			ProxyHandlerCued: true, SupervisorEnv: patient()}
		p, built := run(t, b, d)
		releaseApps(t, p, built, d.Apps) // no waitRecordStart: the point is to stop it early
		WaitLogFor(t, p, "sidecar would die of the signal now: waiting until it handles it", "istio-proxy")
		if err := built.Release(HandlerCue); err != nil {
			t.Fatal(err)
		}
		st := p.MustWaitPhase(t, EventBound)
		if st.Phase != pod.Succeeded || st.Container("istio-proxy").ExitCode != 0 {
			t.Errorf("phase %s, istio-proxy exit %d; want Succeeded and 0 (%s)", st.Phase, st.Container("istio-proxy").ExitCode, st)
		}
		if got, want := touched(Record(built.PilotRecord)), []string{"handler", "signal SIGTERM", "exit 0"}; !slices.Equal(got, want) {
			t.Errorf("pilot-agent record %q, want %q", got, want)
		}
		checkLogOrder(t, p, "decision", "sidecar would die of the signal now: waiting until it handles it",
			"sidecar handles the signal now", "sidecar signalled", "sidecar stopped")
	})
}
