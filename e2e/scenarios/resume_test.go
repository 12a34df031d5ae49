package scenarios

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// Issue 32: the supervisor killed (SIGKILL, as an OOM kill or a node's kill
// would) is started again by the kubelet, and carries on from the journal
// in its state directory: the Job ends as it would have, the sidecar
// stopped once, exit 0.

// killSupervisor SIGKILLs the running supervisor and waits until its next
// instance says it carries on from the journal.
func killSupervisor(t *testing.T, p *pod.Pod) {
	t.Helper()
	if err := p.Signal("supervisor", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "carrying on from the journal of the supervisor before")
}

// TestSupervisorKilled: under OnFailure (a killed container is restarted)
// and in the native shape under Never (a native sidecar is restarted on any
// death), on both backends; killed while the app runs, and killed during
// the stop (after the sidecar's SIGTERM, its drain held, before its exit).
func TestSupervisorKilled(t *testing.T) {
	for _, b := range Builders(t) {
		for _, tc := range []struct {
			name   string
			policy pod.RestartPolicy
			native bool
		}{
			{name: "OnFailure", policy: pod.OnFailure},
			{name: "Never, native shape", policy: pod.Never, native: true},
		} {
			d := Desc{Name: "killed", Policy: tc.policy, Apps: []App{{Name: "app", Cued: true, UID: 1000}},
				SupervisorState: true, SupervisorNative: tc.native, SupervisorEnv: patient("SUPERVISOR_RESTART_POLICY=" + string(tc.policy))}
			t.Run(b.Name+"/"+tc.name+"/while the app runs", func(t *testing.T) {
				p, built := run(t, b, d)
				waitRecordStart(t, built.PilotRecord)
				WaitLogFor(t, p, "app found", "app")
				killSupervisor(t, p)
				releaseApps(t, p, built, d.Apps)
				checkKilledOnce(t, p, built)
			})
			t.Run(b.Name+"/"+tc.name+"/during the stop", func(t *testing.T) {
				d := d
				d.ProxyDrainCued = true
				p, built := run(t, b, d)
				waitRecordStart(t, built.PilotRecord)
				releaseApps(t, p, built, d.Apps)
				waitLog(t, p, "sidecar signalled")
				killSupervisor(t, p)
				if err := built.Release(ProxyDrainCue); err != nil {
					t.Fatal(err)
				}
				checkKilledOnce(t, p, built)
			})
		}
	}
}

// TestStandby: a second supervisor, "standby", waits while the first
// leads, and carries on from its journal the moment the first dies: no
// kubelet's restart in between (the killed one, started again, stands by
// in its turn). Not killed, the standby leads once the first has stopped
// the sidecar and exited, finds the Job done, and exits 0 too: the pod
// ends as without it.
func TestStandby(t *testing.T) {
	for _, b := range Builders(t) {
		for _, tc := range []struct {
			name   string
			policy pod.RestartPolicy
			native bool
			kill   bool
		}{
			{name: "OnFailure, the supervisor killed", policy: pod.OnFailure, kill: true},
			{name: "Never, native shape, the supervisor killed", policy: pod.Never, native: true, kill: true},
			{name: "Never, not killed", policy: pod.Never},
		} {
			t.Run(b.Name+"/"+tc.name, func(t *testing.T) {
				d := Desc{Name: "standby", Policy: tc.policy, Apps: []App{{Name: "app", Cued: true, UID: 1000}},
					SupervisorState: true, SupervisorNative: tc.native, SupervisorStandby: true,
					SupervisorEnv: patient("SUPERVISOR_RESTART_POLICY=" + string(tc.policy))}
				p, built := run(t, b, d)
				waitRecordStart(t, built.PilotRecord)
				leader, standby := whoLeads(t, p)
				waitLogOf(t, p, leader, "app found")
				if tc.kill {
					killed := time.Now()
					if err := p.Signal(leader, syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
					waitLogOf(t, p, standby, "carrying on from the journal of the supervisor before")
					t.Logf("the standby carried on %s after the kill", time.Since(killed).Round(time.Millisecond))
					// Started again by the kubelet, the killed one stands by.
					if err := AwaitLogOf(p, leader, 2, func(l LogLine) bool { return l.Msg() == standingBy || l.Msg() == "starting" }); err != nil {
						t.Fatalf("the killed %s, started again: %v\n%s", leader, err, p.Logs(leader))
					}
					waitLogOf(t, p, leader, standingBy)
				}
				// Found by the leader (above): releaseApps would look in
				// "supervisor"'s log, which may be the standby's.
				if err := built.Release("app"); err != nil {
					t.Fatal(err)
				}
				st := p.MustWaitPhase(t, EventBound)
				checkEnd(t, st, pod.Succeeded, map[string]int{"app": 0, "istio-proxy": 0, "supervisor": 0, "standby": 0})
				if rec := Record(built.PilotRecord); slices.Index(rec, "signal SIGTERM") < 0 || slices.ContainsFunc(rec, func(l string) bool {
					return strings.HasPrefix(l, "signal ") && l != "signal SIGTERM"
				}) {
					t.Errorf("pilot-agent record %q, want SIGTERM only", rec)
				}
				if n := len(LogWhere(p, Is("sidecar signalled"))) + len(LogOf(p, "standby", Is("sidecar signalled"))); n != 1 {
					t.Errorf("%d supervisors signalled the sidecar, want one:\n%s\n%s", n, p.Logs("supervisor"), p.Logs("standby"))
				}
			})
		}
	}
}

// whoLeads waits for one of the two supervisors to stand by, and says
// which leads: the first to take the lock, "supervisor" unless both start
// at once (no hook orders them: the default placement, after the apps).
func whoLeads(t *testing.T, p *pod.Pod) (leader, standby string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), EventBound)
	defer cancel()
	stands := func(c string) bool { return len(LogOf(p, c, Is(standingBy))) > 0 }
	if err := p.Await(ctx, func() bool { return stands("supervisor") || stands("standby") }); err != nil {
		t.Fatalf("neither supervisor stands by: %v", err)
	}
	if stands("supervisor") {
		return "standby", "supervisor"
	}
	return "supervisor", "standby"
}

// standingBy is a standby's message while another supervisor leads.
const standingBy = "standby: another supervisor of the pod leads; carrying on from its journal the moment it ends"

// TestEndedUnreadBeforeKill: the app ends while the supervisor is stopped
// (SIGSTOP: alive, off the CPU, as a throttled or frozen container is),
// which is then killed before it has read the exit. With process
// accounting on (root, KILL and SYS_PACCT) the kernel recorded the exit,
// its mount still there, and the restarted supervisor finds the record: in
// the native shape under Never the failure, exit 3, kills istio-proxy; a
// record of exit 0 says only that the app ended (the kernel writes 0 too
// for a program of several threads whose main thread had not taken its
// code: supervisor/exitwatch/acct_linux.go; podsim's app is one, so its
// exit 3 may read unknown too, then SIGTERM), so under OnFailure the status
// is unknown, and the supervisor awaits the restart a failure would get
// (SUPERVISOR_RESTART_MARGIN, short here) before its SIGTERM. (An app that
// ends after the kill has no record: accounting ends with the supervisor's
// container, exitwatch's TestAccountingEndsWithItsMount.)
func TestEndedUnreadBeforeKill(t *testing.T) {
	for _, b := range Builders(t) {
		for _, tc := range []struct {
			name   string
			policy pod.RestartPolicy
			native bool
			code   int
			margin string
		}{
			{name: "OnFailure, exit 0", policy: pod.OnFailure, margin: "2s"},
			// A margin no test waits out: a status left unknown would
			// hold istio-proxy past EventBound, and fail the test.
			{name: "Never, native shape, exit 3", policy: pod.Never, native: true, code: 3, margin: "1h"},
		} {
			d := Desc{Name: "dead", Policy: tc.policy,
				Apps:            []App{{Name: "app", Cued: true, UID: 1000, Args: []string{"--exit", strconv.Itoa(tc.code)}}},
				SupervisorState: true, SupervisorAccounting: true, SupervisorNative: tc.native,
				SupervisorEnv: patient("SUPERVISOR_RESTART_POLICY="+string(tc.policy), "SUPERVISOR_RESTART_MARGIN="+tc.margin)}
			t.Run(b.Name+"/"+tc.name, func(t *testing.T) {
				p, built := run(t, b, d)
				waitRecordStart(t, built.PilotRecord)
				WaitLogFor(t, p, "app found", "app")
				if len(LogWhere(p, Is(AccountingOn))) == 0 {
					t.Fatalf("no %q in the supervisor's log:\n%s", AccountingOn, p.Logs("supervisor"))
				}
				if err := p.Signal("supervisor", syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				releaseApps(t, p, built, d.Apps)
				p.MustWaitFor(t, EventBound, pod.Ended("app"))
				killSupervisor(t, p)
				st := p.MustWaitPhase(t, EventBound)
				phase, proxy, summary := pod.Succeeded, 0, unknownZero
				if tc.code != 0 {
					phase, proxy, summary = pod.Failed, 137, "failure: app exit 3"
				}
				done := LogWhere(p, Is("done"))
				if len(done) > 0 && tc.code != 0 && strings.HasPrefix(done[len(done)-1].Str("summary"), unknownZero) {
					// podsim's app has several threads: its record may say 0.
					t.Logf("the record of the app's exit 3 says 0: status unknown, SIGTERM")
					proxy, summary = 0, unknownZero
				}
				checkEnd(t, st, phase, map[string]int{"app": tc.code, "istio-proxy": proxy})
				resumed := LogWhere(p, Is("carrying on from the journal of the supervisor before"))
				if len(resumed) != 1 || resumed[0].Str("ended_recorded") != "1" || resumed[0].Str("ended_unwatched") != "0" {
					t.Errorf("resumed %v, want the app's end read from its record", resumed)
				}
				if len(done) == 0 || !strings.HasPrefix(done[len(done)-1].Str("summary"), summary) {
					t.Errorf("the last supervisor's summary is not %s...\n%s", summary, p.Logs("supervisor"))
				}
			})
		}
	}
}

// unknownZero begins the summary of an app whose record says exit 0.
const unknownZero = "unknown: app unknown (" + AcctZero

// checkKilledOnce waits for the pod's end: Succeeded, app and istio-proxy
// exit 0; the supervisor was started twice (killed once), the sidecar got
// SIGTERM and nothing harsher (the supervisor killed during the stop sends
// it again: pilot-agent heeds the first), and exited 0 after its drain;
// the Job's outcome is the apps' success.
func checkKilledOnce(t *testing.T, p *pod.Pod, built Built) {
	t.Helper()
	st := p.MustWaitPhase(t, EventBound)
	checkEnd(t, st, pod.Succeeded, map[string]int{"app": 0, "istio-proxy": 0})
	if c := st.Container("supervisor"); c.Restarts != 1 {
		t.Errorf("supervisor %+v, want one restart", c)
	}
	rec := Record(built.PilotRecord)
	signals := slices.DeleteFunc(slices.Clone(rec), func(l string) bool { return !strings.HasPrefix(l, "signal ") })
	// The last line other than a signal is its exit: the restarted
	// supervisor's SIGTERM may reach it on its way out, recorded after
	// "exit 0" (seen in a clean-clone run).
	others := slices.DeleteFunc(slices.Clone(rec), func(l string) bool { return strings.HasPrefix(l, "signal ") })
	if len(signals) == 0 || slices.ContainsFunc(signals, func(l string) bool { return l != "signal SIGTERM" }) ||
		len(others) == 0 || others[len(others)-1] != "exit 0" {
		t.Errorf("pilot-agent record %q, want SIGTERM only, then exit 0", rec)
	}
	if l := LogWhere(p, Is("done")); len(l) == 0 || l[len(l)-1].Str("summary")[:8] != "success:" {
		t.Errorf("the last supervisor's summary is not success:\n%s", p.Logs("supervisor"))
	}
}

// TestSidecarBackAfterStop: seed 20261210, Job 126 on the cluster. The
// runtime lost istio-proxy's exit after the supervisor's SIGTERM (255,
// "Unknown"), and the kubelet started it again under OnFailure: a Job that
// never ends. Here istio-proxy's first instance exits 1 (PILOT_FIRST_EXIT)
// and the kubelet starts it again. The native supervisor, idle until the
// kubelet stops it, stops the new one too; so does a container supervisor,
// which reads the exit 1 and so waits for the restart. The pod Succeeds.
func TestSidecarBackAfterStop(t *testing.T) {
	for _, native := range []bool{true, false} {
		t.Run(map[bool]string{true: "native", false: "container"}[native], func(t *testing.T) {
			onBackends(t, func(t *testing.T, b Builder) {
				d := Desc{Name: "back", Policy: pod.OnFailure, Apps: []App{{Name: "app", Cued: true}},
					ProxyEnv: []string{"PILOT_FIRST_EXIT=1"}, SupervisorNative: native, SupervisorEnv: patient("SUPERVISOR_RESTART_POLICY=OnFailure")}
				p, built := run(t, b, d)
				waitRecordStart(t, built.PilotRecord)
				releaseApps(t, p, built, d.Apps)
				st := p.MustWaitPhase(t, EventBound)
				checkEnd(t, st, pod.Succeeded, map[string]int{"app": 0, "istio-proxy": 0})
				if c := st.Container("istio-proxy"); c.Restarts != 1 {
					t.Errorf("native %v: istio-proxy %+v, want one restart", native, c)
				}
				if rec := Record(built.PilotRecord); strings.Count(strings.Join(rec, "\n"), "signal SIGTERM") != 2 || !slices.Contains(rec, "exit 1") {
					t.Errorf("native %v: istio-proxy's record %q, want two SIGTERMs, the first instance's exit 1", native, rec)
				}
				waitLog(t, p, "a sidecar runs again after the stop (the kubelet restarted it: its exit was not 0, the runtime lost it, or its start had failed): stopping it again")
			})
		})
	}
}
