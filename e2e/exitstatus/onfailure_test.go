package exitstatus

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/guestpod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// timelines are issue 19's two OnFailure Jobs whose exit statuses the
// supervisor cannot read: an app that succeeds at once, and one that fails
// twice, is restarted twice by the kubelet, then succeeds.
var timelines = []struct {
	name      string
	failFirst int
}{
	{"first try", 0},
	{"fails twice", 2},
}

// kubeletBackoff is the kubelet's wait before the n-th restart of a failed
// container (n from 1), as docs/configuration.md's SUPERVISOR_RESTART_MARGIN
// row states it: at once, then 10 s, 20 s. The supervisor waits that plus the margin for a
// restart of a run whose status is unknown. (The simulated kubelet itself
// restarts after 200ms: the restart is never late.)
var kubeletBackoff = []time.Duration{0, 0, 10 * time.Second, 20 * time.Second}

// TestOnFailureUnknown runs the timelines under restartPolicy OnFailure as
// the unprivileged supervisor (uid 1337, no capabilities) with exit
// statuses unknown: on this machine's kernel by SUPERVISOR_EXIT_STATUS=none,
// in a guest before Linux 6.15 by auto's own choice (TestKernels). After
// every run the supervisor must wait for the restart the kubelet would make
// were the run a failure, and stop istio-proxy, gracefully (outcome
// unknown, SUPERVISOR_ON_UNKNOWN's SIGTERM), only once the last run's
// would-be restart is overdue: after the back-off for that restart plus
// SUPERVISOR_RESTART_MARGIN. The same istio-proxy process lives through the
// restarts and is signalled once, after the last run's end. Each timeline
// logs "ONFAILURE <name>: ..." with what it saw, which TestKernels quotes.
// The timelines run in parallel: each spends most of its time in the
// supervisor's wait for a restart, idle.
func TestOnFailureUnknown(t *testing.T) {
	pod.NeedRoot(t)
	for _, tm := range timelines {
		t.Run(tm.name, func(t *testing.T) {
			t.Parallel()
			runOnFailure(t, tm.name, tm.failFirst)
		})
	}
}

// margin is SUPERVISOR_RESTART_MARGIN here. Each restart of a failed run
// must come within it: the simulated kubelet's 200ms, the container's
// start and the supervisor's next scan, however slowly a loaded host or a
// guest under emulation does them. So it is generous, and the test checks
// the wait it makes only from below (the supervisor's logged wait, and
// istio-proxy's signal no sooner than the wait after the last run's end),
// which slowness cannot break. The exact margin is the supervisor's own
// tests' business (supervisor/unknown_test.go).
const margin = time.Minute

func runOnFailure(t *testing.T, name string, failFirst int) {
	runs := failFirst + 1
	var args []string
	if failFirst > 0 {
		args = append(args, "--fail-first", strconv.Itoa(failFirst))
	}
	env := []string{"SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_MARGIN=" + margin.String()}
	if !guestpod.InGuest() {
		// This kernel reads statuses (pidfd, 6.15+): make them unknown.
		env = append(env, "SUPERVISOR_EXIT_STATUS=none")
	}
	// Cued (buildJob): every run opens the same FIFO, a restart too.
	built := buildJob(t, "onfailure-unknown", pod.OnFailure, unprivileged, args, env...)
	// Each run stamps its end; the stand-in pilot-agent stamps each signal
	// it receives.
	appStamps := filepath.Join(built.Dir, "app.stamps")
	pilotStamps := filepath.Join(built.Dir, "pilot-agent.stamps")
	app, proxy := scenarios.Container(&built.Spec, "app"), scenarios.Container(&built.Spec, "istio-proxy")
	app.Argv = append(app.Argv, "--stamps", appStamps)
	proxy.Env = append(proxy.Env, "PILOT_TIMESTAMPS="+pilotStamps)
	p := scenarios.Start(t, built)
	for run := 1; run <= runs; run++ {
		// Seen: "app found" for this run (a restart logs it again).
		waitFound(t, p, run, 2*time.Minute)
		if err := built.Release("app"); err != nil {
			t.Fatalf("release run %d: %v", run, err)
		}
	}
	// A hang guard only: the longest wait is 20s+margin after the last run.
	st := p.MustWaitPhase(t, 10*time.Minute)

	// The pod: every container's exit code, istio-proxy never restarted.
	if st.Phase != pod.Succeeded {
		t.Errorf("phase %s, want Succeeded", st.Phase)
	}
	if c := st.Container("app"); c.Restarts != failFirst || c.ExitCode != 0 {
		t.Errorf("app %+v, want %d restarts, the last run exiting 0", c, failFirst)
	}
	if c := st.Container("istio-proxy"); c.Restarts != 0 || c.ExitCode != 0 {
		t.Errorf("istio-proxy %+v, want one run, stopped gracefully (exit 0)", c)
	}
	if c := st.Container("supervisor"); c.Restarts != 0 || c.ExitCode != 0 {
		t.Errorf("supervisor %+v, want exit 0", c)
	}
	if rec := scenarios.Record(built.PilotRecord); len(rec) < 1 || !slices.Equal(rec[1:], []string{"signal SIGTERM", "exit 0"}) {
		t.Errorf("pilot-agent record %q, want one SIGTERM then exit 0", rec)
	}

	// The supervisor: statuses unknown, a wait for every run's would-be
	// restart, the outcome unknown.
	lines := scenarios.ParseLog(p.Logs("supervisor"))
	method, _ := readMethod(lines)
	var exits, waits []scenarios.LogLine
	restarts, decided := 0, false
	for _, l := range lines {
		switch l.Msg() {
		case "app exited":
			exits = append(exits, l)
		case "app status unknown under restartPolicy OnFailure: waiting for a restart before taking it as finished",
			// A run released as soon as it is found may start and end
			// within one scan of its exec, its program never seen: it may
			// as well have been a start that failed, and the wait for the
			// new start is the same (supervisor/startfailed.go).
			"app ended before its program was seen running, its status unknown: its start may have failed, and the kubelet would start it again whatever the restart policy; the sidecar stays up until then":
			waits = append(waits, l)
		case "app restarted by the kubelet: watching the new container":
			restarts++
		case "decision":
			decided = true
			if o := l.Str("outcome"); o != "unknown" || l.Str("action") != "SIGTERM" {
				t.Errorf("decision: outcome %s, action %s; want unknown, SIGTERM", o, l.Str("action"))
			}
		}
	}
	if method != "none" {
		t.Fatalf("exit-status method %q, want none (this test needs statuses unknown: a kernel before 6.15, or SUPERVISOR_EXIT_STATUS=none)", method)
	}
	if len(exits) != runs || len(waits) != runs || restarts != failFirst {
		t.Fatalf("supervisor saw %d exits, waited for %d restarts and saw %d; want %d, %d, %d:\n%s",
			len(exits), len(waits), restarts, runs, runs, failFirst, p.Logs("supervisor"))
	}
	for _, l := range exits {
		if l.Str("status") != "unknown" || l.Str("exit_code") != "" {
			t.Errorf("method none reported a status: %v", l)
		}
	}
	for i, l := range waits {
		want := kubeletBackoff[i+1] + margin
		if got := seconds(l, "wait"); got != want || l.Str("restart") != strconv.Itoa(i+1) {
			t.Errorf("run %d: the supervisor waits %s for restart %s, want %s (back-off %s + margin %s)",
				i+1, got, l.Str("restart"), want, kubeletBackoff[i+1], margin)
		}
	}
	if !decided {
		t.Errorf("supervisor log lacks its decision")
	}
	if msg := p.TerminationMessage("supervisor"); !strings.HasPrefix(msg, "unknown") {
		t.Errorf("supervisor summary %q, want it to start with unknown", msg)
	}

	// The timeline, from the pod's own stamps: istio-proxy signalled once,
	// after every run's end, and not before the last run's would-be restart
	// was overdue (the supervisor starts its wait when it sees the end,
	// after the end itself).
	ends, signals := stamps(t, appStamps, "exit"), stamps(t, pilotStamps, "signal")
	if len(ends) != runs || len(signals) != 1 {
		t.Fatalf("%d runs stamped their end, istio-proxy stamped %d signals; want %d and 1", len(ends), len(signals), runs)
	}
	last, signalled := slices.MaxFunc(ends, time.Time.Compare), signals[0]
	wait := kubeletBackoff[runs] + margin
	late := signalled.Sub(last)
	switch {
	case late < 0:
		t.Errorf("istio-proxy signalled %s before the last run's end", -late)
	case late < wait:
		t.Errorf("istio-proxy signalled %s after the last run's end, before its would-be restart was overdue (%s)", late, wait)
	case late > wait+time.Minute: // a hang guard
		t.Errorf("istio-proxy signalled %s after the last run's end, long past the wait (%s)", late, wait)
	}
	t.Logf("ONFAILURE %s: method %s, %d runs, %d restarts, istio-proxy signalled once, %s after the last run's end (wait %s = back-off %s + margin %s), summary %q",
		name, method, runs, restarts, late.Round(time.Millisecond), wait, kubeletBackoff[runs], margin, p.TerminationMessage("supervisor"))
}

// seconds reads a duration field of the supervisor's log (seconds).
func seconds(l scenarios.LogLine, key string) time.Duration {
	f, _ := l[key].(float64)
	return time.Duration(f * float64(time.Second)).Round(time.Millisecond)
}

// stamps is scenarios.Stamps, failing the test on a bad line.
func stamps(t *testing.T, path, event string) []time.Time {
	t.Helper()
	out, err := scenarios.Stamps(path, event)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
