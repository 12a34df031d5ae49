package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func logAt(ms int, msg, extra string) string {
	return fmt.Sprintf(`{"level":"info","time":%q,"message":%q%s}`, at(ms).Format("2006-01-02T15:04:05.000Z07:00"), msg, extra)
}

func terminated(name string, code int32, msg string, finished time.Time) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Message: msg, FinishedAt: metav1.NewTime(finished)}}}
}

// never is a Job of one Never pod whose app a runs 0 to 3 s and exits
// code; the supervisor starts at 0.5 s and signals istio-proxy at
// signalMS. Its pod's statuses are a, the supervisor, istio-proxy.
func never(code int, summary string, proxyCode int32, signalMS int) func() (timeline, observed) {
	return func() (timeline, observed) {
		tl := timeline{restart: corev1.RestartPolicyNever, backoffLimit: 0,
			apps: []appPlan{{name: "a", steps: []step{{3 * time.Second, code}}}}}
		tl.want = tl.oracle()
		phase := corev1.PodSucceeded
		if code != 0 {
			phase = corev1.PodFailed
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", UID: "u1"}, Status: corev1.PodStatus{Phase: phase,
			ContainerStatuses: []corev1.ContainerStatus{
				terminated("a", int32(code), "", at(3000)),
				terminated(supervisorName, 0, summary, at(signalMS+5000)),
				terminated(proxyName, proxyCode, "", at(signalMS+5000)),
			}}}
		log := strings.Join([]string{
			logAt(500, "starting", ""),
			logAt(600, "app found", ""),
			logAt(signalMS, msgSignalled, `,"signal":"SIGTERM"`),
		}, "\n")
		cond := &batchv1.JobCondition{Type: tl.want.cond, Reason: tl.want.reason, Status: corev1.ConditionTrue}
		return tl, observed{cond: cond, pods: []podObs{{pod: pod, log: log}},
			inst: map[string][]instance{"a": {{app: "a", n: 1, pod: "p1", start: at(0), end: at(3000), code: code}}}}
	}
}

// success is never's Job that succeeds, istio-proxy signalled at 3.002 s.
var success = never(0, "success: a exit 0; action SIGTERM", 0, 3002)

// killedPod is success with its supervisor, a native sidecar, SIGKILLed at
// 1.5 s and carrying on from the journal at 2.5 s; the stop at 3.002 s
// comes from the instance after.
var killedPod = killedFrom(success)

// killedFailure is killedPod whose app exits 3 (Never: istio-proxy
// SIGKILLed).
var killedFailure = killedFrom(never(3, "failure: a exit 3; action SIGKILL", 137, 3002))

func killedFrom(base func() (timeline, observed)) func() (timeline, observed) {
	return func() (timeline, observed) {
		tl, o := base()
		tl.native = true
		tl.kill = &killPlan{app: "a", n: 1, moment: killRun, frac: 0.5}
		p := o.pods[0].pod
		sup := p.Status.ContainerStatuses[1]
		p.Status.ContainerStatuses = slices.Delete(p.Status.ContainerStatuses, 1, 2)
		sup.RestartCount = 1
		sup.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{sup}
		o.pods[0].prevLog = strings.Join([]string{logAt(500, "starting", ""), logAt(600, "app found", "")}, "\n")
		o.pods[0].log = strings.Join([]string{
			logAt(2450, "starting", ""),
			logAt(2500, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":0,"watched":1`),
			logAt(3002, msgSignalled, `,"signal":"SIGTERM"`),
		}, "\n")
		o.kill = &killed{pod: "p1", at: at(1500), planned: at(1500)}
		return tl, o
	}
}

// cs is container name's status in o's first pod, to edit.
func cs(o *observed, name string) *corev1.ContainerStatus {
	p := o.pods[0].pod
	if s := status(p.Status.InitContainerStatuses, name); s != nil {
		return s
	}
	return status(p.Status.ContainerStatuses, name)
}

func problems(v verdict) string {
	var s []string
	for i, ps := range v.problems {
		for _, p := range ps {
			s = append(s, invariantNames[i]+": "+p)
		}
	}
	return strings.Join(s, "\n")
}

// TestCheckJob checks the verdicts on Jobs edited into the cases that soak
// runs met.
func TestCheckJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		base func() (timeline, observed) // nil: success
		edit func(tl *timeline, o *observed)
		want invariant // -1: no problem at all
		text string    // in the problems
		// anomalies and unchecked count the verdict's; note is in one.
		anomalies, unchecked int
		note                 string
		missed               string // in the kill outcome's missed
		check                func(t *testing.T, v verdict)
	}{
		{name: "success", want: -1},
		{name: "failure", base: never(3, "failure: a exit 3; action SIGKILL", 137, 3002), want: -1},
		{name: "signal in the app's last millisecond", base: never(0, "success: a exit 0; action SIGTERM", 0, 3000), want: -1},
		{name: "signal before the app's end", base: never(0, "success: a exit 0; action SIGTERM", 0, 2999), want: invOrder, text: "while a #1"},
		{name: "unknown for a seen app", base: never(0, "unknown: a unknown; action SIGTERM", 0, 3002), want: invMessage, text: `want it to start with "success:"`},
		{name: "failure not named", base: never(3, "failure: b exit 3; action SIGKILL", 137, 3002), want: invMessage, text: `does not name "a exit 3"`},
		{name: "SIGTERM on failure", base: never(3, "failure: a exit 3; action SIGKILL", 0, 3002), want: invMessage, text: "istio-proxy exited 0"},
		// An app gone 0.4 s after the supervisor's first line may be
		// unknown, not a failure.
		{name: "quick app unknown", edit: func(_ *timeline, o *observed) {
			o.inst["a"][0].end = at(900)
			cs(o, supervisorName).State.Terminated.Message = "unknown: a unknown (its main process had exited before the supervisor saw it); action SIGTERM"
		}, want: -1},
		{name: "quick app failed", edit: func(_ *timeline, o *observed) {
			o.inst["a"][0].end = at(900)
			cs(o, supervisorName).State.Terminated.Message = "failure: a exit 1; action SIGKILL"
		}, want: invMessage, text: `want it to start with "success:" or "unknown:"`},
		{name: "a second app ends after the stop", edit: func(tl *timeline, o *observed) {
			tl.apps = append(tl.apps, appPlan{name: "b", steps: []step{{4 * time.Second, 0}}})
			tl.want = tl.oracle()
			o.pods[0].pod.Status.ContainerStatuses = append(o.pods[0].pod.Status.ContainerStatuses, terminated("b", 0, "", at(4000)))
			o.inst["b"] = []instance{{app: "b", n: 1, pod: "p1", start: at(0), end: at(4000)}}
		}, want: invOrder, text: "while b #1"},
		{name: "an instance started after the stop", edit: func(_ *timeline, o *observed) {
			o.inst["a"] = append(o.inst["a"], instance{app: "a", n: 2, pod: "p1", start: at(4000)})
		}, want: invOrder, text: "before a #2"},
		// The log gone though the pod was not deleted (seed 20261205, Job
		// 127, read as containerd restarted): not checked, not broken.
		{name: "log gone", edit: func(_ *timeline, o *observed) {
			o.pods[0].log = "unable to retrieve container logs for containerd://d5907bc52bee"
		}, want: -1, unchecked: 1},
		// An instance the runtime killed as it started it, no end stamp,
		// its start never recorded (seed 20261205, Job 131: containerd
		// restarted under it), is an anomaly; one killed after it started
		// is broken.
		{name: "app killed as it started", edit: func(_ *timeline, o *observed) {
			appKilled(o, metav1.Time{})
		}, want: -1, anomalies: 1},
		{name: "app killed once started", edit: func(_ *timeline, o *observed) {
			appKilled(o, metav1.NewTime(at(100)))
		}, want: invCondition, text: "never ended"},
		// An app whose start the runtime failed as the kubelet restarted
		// (seed 123, Job 8: exit 128, StartError, "context canceled"): the
		// Job's condition is the cluster's doing, an anomaly; the
		// supervisor's own invariants are still checked.
		{name: "app's start failed", edit: appStartFailed, want: -1, anomalies: 3, note: "the runtime failed to start a"},
		// Seed 20261213, Job 62: the supervisor saw the app's init killed
		// and said failure, as the pod failed.
		{name: "app's start failed, read as a kill", edit: func(tl *timeline, o *observed) {
			appStartFailed(tl, o)
			cs(o, supervisorName).State.Terminated.Message = "failure: a killed by SIGKILL; action SIGKILL; sidecar stopped in 0.0s"
			cs(o, proxyName).State.Terminated.ExitCode = 137
		}, want: -1, anomalies: 3, note: "the runtime failed to start a"},
		{name: "app's start failed, no log", edit: func(tl *timeline, o *observed) {
			appStartFailed(tl, o)
			o.pods[0].log = ""
		}, want: invOrder, text: "no JSON line", anomalies: 3},
		// istio-proxy's start failed by the runtime (seed 123, Job 0): the
		// Job's condition is the cluster's; the supervisor must say there
		// was no sidecar, and not have stopped one.
		{name: "istio-proxy never started", base: proxyUnstarted, want: -1, anomalies: 1},
		// Seed 20261206, Job 130: istio-proxy's first start failed, and
		// the Job controller deleted the pod once the app had ended: the
		// supervisor's summary of the apps stands. Deleted before the
		// app's end, it must say so.
		{name: "istio-proxy never started, pod deleted after the app", base: proxyUnstarted, edit: func(_ *timeline, o *observed) {
			proxyDeleted(o, 3500)
		}, want: -1, anomalies: 3, note: "once its apps had ended"},
		// Seed 20261209, Job 63: the deletion came before the app's end,
		// but the app ended of itself (stamped its end) before the
		// kubelet's kill reached it: the summary of the apps stands. An
		// app the deletion killed (no end stamp) must be said.
		{name: "istio-proxy never started, pod deleted, the app ending of itself", base: proxyUnstarted, edit: func(_ *timeline, o *observed) {
			proxyDeleted(o, 2500)
		}, want: -1, anomalies: 3, note: "its apps ending of themselves after it"},
		{name: "istio-proxy never started, pod deleted, the app killed", base: proxyUnstarted, edit: func(_ *timeline, o *observed) {
			proxyDeleted(o, 2500)
			o.inst["a"][0].end = time.Time{}
		}, want: invMessage, text: "want it to say \"pod deleted\"", anomalies: 3},
		{name: "istio-proxy never started, said not", base: proxyUnstarted, edit: func(_ *timeline, o *observed) {
			cs(o, supervisorName).State.Terminated.Message = "success: a exit 0; action SIGTERM; sidecar stopped in 0.1s"
			o.pods[0].log = strings.Join([]string{logAt(500, "starting", ""), logAt(600, "app found", "")}, "\n")
		}, want: invOrder, text: "istio-proxy never started", anomalies: 1},
		// istio-proxy restarted after a first container reported
		// "Completed" with no start (seed 123, Job 6: containerd restarted
		// under it): an anomaly, not a stop of the sidecar before the apps.
		{name: "istio-proxy's first container unstarted", edit: func(_ *timeline, o *observed) {
			proxy := cs(o, proxyName)
			proxy.RestartCount = 1
			proxy.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
		}, want: -1, anomalies: 1},
		// containerd restarted as the containers ended: the kubelet has
		// exit 255, "Unknown", for each; the stamps have the real exits.
		{name: "exits the runtime lost", edit: func(_ *timeline, o *observed) {
			for _, n := range []string{"a", supervisorName, proxyName} {
				cs(o, n).State.Terminated.ExitCode, cs(o, n).State.Terminated.Reason = 255, "Unknown"
			}
		}, want: -1, anomalies: 3},
		{name: "an exit the runtime lost, the stamp another", edit: func(_ *timeline, o *observed) {
			cs(o, "a").State.Terminated.ExitCode, cs(o, "a").State.Terminated.Reason = 255, "Unknown"
			o.inst["a"][0].code = 3
		}, want: invCondition, text: "a exited 255, want 0"},
		{name: "containers left running", edit: func(_ *timeline, o *observed) {
			o.pods[0].running = []string{"abc123"}
			cs(o, proxyName).State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		}, want: invLeft, check: func(t *testing.T, v verdict) {
			if len(v.problems[invLeft]) != 2 {
				t.Errorf("running containers: %s", problems(v))
			}
		}},
		// A supervisor restarted though not killed breaks the restart
		// invariant; its pod's stop still counts among those not killed.
		{name: "restarted, not killed", edit: func(_ *timeline, o *observed) {
			s := cs(o, supervisorName)
			s.RestartCount = 1
			s.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}
		}, want: invRestart, text: "not killed, restarted 1 time(s)", check: func(t *testing.T, v verdict) {
			if len(v.problems[invRestart]) != 1 {
				t.Errorf("problems:\n%s", problems(v))
			}
			if l := v.stopLags[lagRead]; len(l) != 1 || l[0] != 2*time.Millisecond {
				t.Errorf("stop lags %v, want one of 2ms", v.stopLags)
			}
		}},
		// A supervisor whose first start failed (the kubelet counts a
		// restart, its last state not a termination: seed 20261207, Job
		// 126, under containerd's restart) had no instance to log
		// anything: an anomaly, not a missing log.
		{name: "supervisor's start failed", edit: func(_ *timeline, o *observed) {
			s := cs(o, supervisorName)
			s.RestartCount = 1
			s.LastTerminationState = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}
			o.pods[0].prevErr = errors.New("the server rejected our request for an unknown reason")
		}, want: -1, anomalies: 1, note: "never ran"},
		// Its start failed in the runtime, a termination with no start
		// (seed 20261214, Job 64: a kubelet restarted under the CRI call):
		// no supervisor died, an anomaly.
		{name: "supervisor's start failed, terminated", edit: func(_ *timeline, o *observed) {
			s := cs(o, supervisorName)
			s.RestartCount = 1
			s.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError"}}
		}, want: -1, anomalies: 1, note: "first start failed in the runtime"},

		// A killed supervisor: restarted once after exit 137, the instance
		// after carries on and stops istio-proxy at once; the checks say
		// where the kill came and how late the stop was.
		{name: "killed", base: killedPod, want: -1, check: func(t *testing.T, v verdict) {
			k := v.kill
			if k == nil || k.missed != "" || k.when != "while a #1 (1.5s in, 1.5s before its end) ran" ||
				k.delay != 2*time.Millisecond || k.bound != killBound || len(k.lost) != 0 {
				t.Errorf("kill outcome: %+v", k)
			}
			if len(v.stopLags[lagRead]) != 0 {
				t.Errorf("the killed pod counted among the pods not killed: %v", v.stopLags)
			}
		}},
		// A standby carried on (its log after the killed instance's);
		// the restarted one stood by, then found the work done.
		{name: "killed, a standby carried on", base: killedPod, edit: func(_ *timeline, o *observed) {
			p := o.pods[0].pod
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, terminated(standbyName, 0, "success: a exit 0; action SIGTERM", at(8000)))
			o.pods[0].sbLog = strings.Join([]string{
				logAt(700, "starting", ""),
				logAt(1510, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":0,"watched":1`),
				logAt(3002, msgSignalled, `,"signal":"SIGTERM"`),
			}, "\n")
			o.pods[0].log = strings.Join([]string{
				logAt(2450, "starting", ""),
				logAt(4000, msgResumed, `,"apps":1,"ended":1,"ended_unwatched":0,"watched":0`),
			}, "\n")
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; k == nil || k.resumed == nil || !k.resumed.At.Equal(at(1510)) || k.delay != 2*time.Millisecond {
				t.Errorf("kill outcome: %+v, want the standby's carrying on at 1.51 s", k)
			}
		}},
		// Seed 20261209 with -standby, Job 64: the runtime failed the
		// standby's start (the kubelet restarted under it); under Never
		// no instance of it ran: nothing to check, no log wanted.
		{name: "the standby never started", edit: func(_ *timeline, o *observed) {
			p := o.pods[0].pod
			sb := terminated(standbyName, 128, "failed to create containerd task: context canceled", at(100))
			sb.State.Terminated.Reason = "StartError"
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, sb)
		}, want: -1, anomalies: 1, note: "the standby never started"},
		{name: "the standby ran, no log", edit: func(_ *timeline, o *observed) {
			p := o.pods[0].pod
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, terminated(standbyName, 0, "success: a exit 0; action SIGTERM", at(8000)))
		}, want: invOrder, text: "the standby: no JSON line"},
		// Seed 20261206 with -standby, Job 164: istio-proxy started 4 s
		// after the app's end; the stop came once it ran.
		{name: "killed, istio-proxy started after the app's end", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].log = strings.Replace(o.pods[0].log, logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(7100, msgSignalled, `,"signal":"SIGTERM"`), 1)
			cs(o, proxyName).State.Terminated.StartedAt = metav1.NewTime(at(6000))
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; k == nil || k.delay != 100*time.Millisecond {
				t.Errorf("kill outcome: %+v, want the stop 0.1 s after istio-proxy ran", k)
			}
		}},
		{name: "killed, not restarted", base: killedPod, edit: func(_ *timeline, o *observed) {
			s := cs(o, supervisorName)
			s.RestartCount, s.LastTerminationState = 0, corev1.ContainerState{}
		}, want: invRestart, text: "restarted 0 time(s)"},
		{name: "killed, not carrying on", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].log = strings.Replace(o.pods[0].log, msgResumed, "starting over", 1)
		}, want: invRestart, text: "does not say"},
		{name: "killed, the journal ignored", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].log += "\n" + logAt(2600, msgJournal[0], `,"reason":"format 2, not 1"`)
		}, want: invRestart, text: "format 2, not 1"},
		{name: "killed, no log of the instance before", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].prevLog, o.pods[0].prevErr = "", errors.New("previous terminated container not found")
		}, want: invRestart, text: "no log of the supervisor's instance before"},
		// The kubelet removed the killed instance once the restarted one
		// had ended too (seed 20261205, Job 95): not checked, not broken.
		{name: "killed, the log of the instance before gone", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].prevLog = "unable to retrieve container logs for containerd://4bdf686e577e"
		}, want: -1, unchecked: 1, note: "before its restart gone"},
		// Seed 20261209, Job 80: killed once done (its summary written),
		// the kubelet had removed its log; the restarted one found
		// istio-proxy gone. Its summary says it acted: not checked.
		{name: "killed once done, its log gone", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].prevLog = "unable to retrieve container logs for containerd://ac8581befdfe"
			o.pods[0].log = strings.Replace(o.pods[0].log, logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(3010, "the sidecars seen before the supervisor's restart have exited: nothing left to stop", ""), 1)
			cs(o, supervisorName).LastTerminationState.Terminated.Message = "success: a exit 0; action POST http://127.0.0.1:15020/quitquitquit"
		}, want: -1, unchecked: 2, note: "the killed supervisor acted"},
		// The restarted instance's log gone too: checkPod says so, and
		// checkRestart has nothing to time (it used to index an empty
		// list).
		{name: "killed, the current log gone", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].log = "unable to retrieve container logs for containerd://4bdf686e577e"
		}, want: -1, unchecked: 1, note: "supervisor log gone"},
		// containerd's restart lost the supervisor's exit (255,
		// "Unknown"), which failed the pod (seed 20261217, Job 115): the
		// Job's course is the runtime's doing from there.
		{name: "a lost exit fails the pod", edit: func(_ *timeline, o *observed) {
			sup := cs(o, supervisorName).State.Terminated
			sup.ExitCode, sup.Reason = 255, "Unknown"
			o.pods[0].pod.Status.Phase = corev1.PodFailed
		}, want: -1, anomalies: 2, note: "the pod failed on it"},
		// The deadline passed before b's program wrote its first stamp
		// (seed 20261218, Job 7): its container was SIGTERMed unstamped.
		{name: "deadline before an app ran", edit: deadlineBeforeB, want: -1, anomalies: 1, note: "deleted before b ran its program"},
		{name: "deadline, an app that ran unstamped", edit: func(tl *timeline, o *observed) {
			deadlineBeforeB(tl, o)
			cs(o, "b").State.Terminated.ExitCode = 0
		}, want: invCondition, text: "b's first instance [], want #1"},
		// The app ended at 3 s while no supervisor ran (killed at 2.9 s,
		// back at 4 s): under Never the stop comes with the restart.
		{name: "killed, status lost, Never, in time", base: killedPod, edit: func(_ *timeline, o *observed) {
			lostStatus(o, 4000, 4001)
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; len(k.lost) != 1 || k.delay != 1001*time.Millisecond || k.bound != killBound {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed, status lost, Never, late", base: killedPod, edit: func(_ *timeline, o *observed) {
			lostStatus(o, 7000, 7001)
		}, want: invRestart, text: "4.001s after it would have"},
		// Killed 500 ms after the app's end, which it had not read (its
		// last line is at 0.6 s): the status is lost (seed 20261217, Job
		// 178). A line it logged since shows it ran after the end: that end
		// it had the time to read, as before.
		{name: "killed after an end it had not read", base: killedPod, edit: func(_ *timeline, o *observed) {
			lostStatus(o, 4000, 4001)
			o.kill.at = at(3500)
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; len(k.lost) != 1 {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed after an end it may have read", base: killedPod, edit: func(_ *timeline, o *observed) {
			lostStatus(o, 4000, 4001)
			o.kill.at = at(3500)
			o.pods[0].prevLog += "\n" + logAt(3300, "app exited", `,"container":"a"`)
		}, want: invMessage, text: `want it to start with "success:"`},
		// Under OnFailure the lost status awaits the app's restart for the
		// margin: 1 s for the restart, then 15 s more, is in bound.
		{name: "killed, status lost, OnFailure", base: killedPod, edit: func(tl *timeline, o *observed) {
			tl.restart, tl.backoffLimit = corev1.RestartPolicyOnFailure, 1
			tl.want = tl.oracle()
			lostStatus(o, 4000, 19001)
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; k.delay != 16001*time.Millisecond || k.bound != killBound+restartMargin {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		// Under ptrace, anchored before the kill, the end in the gap is
		// recorded: a failure's status is read (or, its record saying 0,
		// unknown: acct_linux.go), and the stop comes in time; a record of
		// exit 0 reads unknown, which under OnFailure awaits a restart.
		{name: "killed, ptrace, failure recorded", base: killedFailure, edit: func(tl *timeline, o *observed) {
			recordedStatus(tl, o, 4000, 4001, "failure: a exit 3; action SIGKILL")
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; len(k.lost) != 0 || len(k.recorded) != 1 || k.bound != killBound {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed, ptrace, failure recorded as 0", base: killedFailure, edit: func(tl *timeline, o *observed) {
			recordedStatus(tl, o, 4000, 4001, "unknown: a unknown (its accounting record says exit 0); action SIGTERM")
			cs(o, proxyName).State.Terminated.ExitCode = 0
		}, want: -1},
		{name: "killed, ptrace, failure recorded, late", base: killedFailure, edit: func(tl *timeline, o *observed) {
			recordedStatus(tl, o, 4000, 7001, "failure: a exit 3; action SIGKILL")
		}, want: invRestart, text: "4.001s after it would have"},
		{name: "killed, ptrace, exit 0 recorded", base: killedPod, edit: func(tl *timeline, o *observed) {
			recordedStatus(tl, o, 4000, 4001, "unknown: a unknown (its accounting record says exit 0); action SIGTERM")
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; len(k.lost) != 1 || len(k.recorded) != 0 {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed, ptrace, exit 0 recorded, OnFailure waits", base: killedPod, edit: func(tl *timeline, o *observed) {
			tl.restart, tl.backoffLimit = corev1.RestartPolicyOnFailure, 1
			tl.want = tl.oracle()
			recordedStatus(tl, o, 4000, 19001, "unknown: a unknown (its accounting record says exit 0); action SIGTERM")
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; k.delay != 16001*time.Millisecond || k.bound != killBound+restartMargin {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed, ptrace, not anchored", base: killedPod, edit: func(tl *timeline, o *observed) {
			recordedStatus(tl, o, 4000, 4001, "unknown: a unknown; action SIGTERM")
			o.pods[0].prevLog = strings.Join([]string{logAt(500, "starting", ""), logAt(600, "app found", "")}, "\n")
			cs(o, supervisorName).State.Terminated.Message = "unknown: a unknown; action SIGTERM"
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; len(k.lost) != 1 || len(k.recorded) != 0 {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		// The instance after finds gone the istio-proxy the one before
		// signalled: no failure. Gone before any signal is one.
		{name: "killed, gone after the action", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.kill.at = at(3010)
			o.pods[0].prevLog += "\n" + logAt(3002, msgSignalled, `,"signal":"SIGTERM"`)
			o.pods[0].log = strings.NewReplacer(logAt(2450, "starting", ""), logAt(3950, "starting", ""),
				logAt(2500, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":0,"watched":1`),
				logAt(4000, msgResumed, `,"apps":1,"ended":1,"ended_unwatched":0,"watched":0`),
				logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(4001, msgGone, `,"signal":"SIGTERM"`)).Replace(o.pods[0].log)
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; k.when != `during the stop: 8ms after "sidecar signalled"` || k.delay != 2*time.Millisecond {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed, gone before the action", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.pods[0].log = strings.Replace(o.pods[0].log, msgSignalled, msgGone, 1)
		}, want: invOrder, text: "had exited before the supervisor's action"},
		// A container supervisor done before the SIGKILL reached it: the
		// kill does not count, and no restart is wanted.
		{name: "killed, finished before the kill", base: killedPod, edit: func(_ *timeline, o *observed) {
			notRestarted(o, 3100, 0, logAt(3050, msgDone, ""))
		}, want: -1, missed: "had finished"},
		// Seed 20261204's soak-130: a native supervisor idles once done;
		// the SIGKILL ends it (137) in a pod the kubelet no longer
		// restarts it in. Not a failure, and the kill does not count.
		{name: "killed, native idle", base: killedPod, edit: func(_ *timeline, o *observed) {
			notRestarted(o, 3100, 137, logAt(3050, msgDone, ""))
		}, want: -1, missed: "had finished"},
		// soak-109: killed after its action, before its summary; the pod
		// ended at once, with no restart; its message is the one it wrote
		// as it acted.
		{name: "killed after the action, no restart", base: killedPod, edit: func(_ *timeline, o *observed) {
			notRestarted(o, 3010, 137)
			cs(o, supervisorName).State.Terminated.Message = "running: success (a exit 0): action SIGTERM\napp a (pid 36): exit 0\nsidecar istio-proxy (pid 45): held"
		}, want: -1, missed: "had acted", check: countsSuccess},
		{name: "killed before the action, no restart", base: killedPod, edit: func(_ *timeline, o *observed) {
			notRestarted(o, 2990, 137)
		}, want: invRestart, text: "restarted 0 time(s)"},
		// Seed 20261206, Job 150: killed during the action (after its
		// decision, before it could log the stop); istio-proxy exited 0
		// and the pod ended, with no restart.
		{name: "killed during the action, no restart", base: killedPod, edit: func(_ *timeline, o *observed) {
			notRestarted(o, 3001, 137)
			o.pods[0].log = strings.Replace(o.pods[0].log, logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(3000, msgDecision, ""), 1)
			cs(o, supervisorName).State.Terminated.Message = "running: success (a exit 0): action SIGTERM\napp a (pid 36): exit 0"
		}, want: -1, missed: "was acting", check: countsSuccess},
		// Seed 20261213, Job 84: killed 16 ms after a failure's decision,
		// its SIGKILL sent but not logged; istio-proxy exited 137 and the
		// pod ended, with no restart.
		{name: "killed during a SIGKILL action, no restart", base: killedPod, edit: func(tl *timeline, o *observed) {
			tl.apps[0].steps[0].code = 3
			tl.want = tl.oracle()
			o.cond = &batchv1.JobCondition{Type: tl.want.cond, Reason: tl.want.reason, Status: corev1.ConditionTrue}
			o.inst["a"][0].code = 3
			cs(o, "a").State.Terminated.ExitCode = 3
			o.pods[0].pod.Status.Phase = corev1.PodFailed
			notRestarted(o, 3001, 137)
			o.pods[0].log = strings.Replace(o.pods[0].log, logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(3000, msgDecision, ""), 1)
			cs(o, supervisorName).State.Terminated.Message = "running: failure (a exit 3): action SIGKILL\napp a (pid 36): exit 3"
			cs(o, proxyName).State.Terminated.ExitCode = 137
		}, want: -1, missed: "was acting"},
		{name: "killed during a SIGKILL action, istio-proxy exited 0", base: killedPod, edit: func(tl *timeline, o *observed) {
			notRestarted(o, 3001, 137)
			o.pods[0].log = strings.Replace(o.pods[0].log, logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(3000, msgDecision, ""), 1)
			cs(o, supervisorName).State.Terminated.Message = "running: success (a exit 0): action SIGKILL\napp a (pid 36): exit 0"
		}, want: invRestart, text: "restarted 0 time(s)"},
		// soak-174: the app ran wholly while no supervisor ran (killed at
		// 2.9 s, back at 3.95 s); the restarted one never saw it and looked
		// for it for SUPERVISOR_APP_START_TIMEOUT.
		{name: "killed, app never seen, looked for", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.kill.at = at(2900)
			o.pods[0].log = strings.NewReplacer(logAt(2450, "starting", ""), logAt(3950, "starting", ""),
				logAt(2500, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":0,"watched":1`),
				logAt(3960, msgResumed, `,"apps":0,"ended":0,"ended_unwatched":0,"watched":0`)+"\n"+
					logAt(33960, msgMissing, `,"expected":1,"seen":0,"missing":["a"]`),
				logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(33962, msgSignalled, `,"signal":"SIGTERM"`)).Replace(o.pods[0].log)
			cs(o, supervisorName).State.Terminated.Message = "unknown: a unknown; action SIGTERM"
		}, want: -1, check: func(t *testing.T, v verdict) {
			if k := v.kill; k.delay != 30962*time.Millisecond || k.bound != 33950*time.Millisecond {
				t.Errorf("kill outcome: %s", k)
			}
		}},
		{name: "killed, app never seen, ran after the restart", base: killedPod, edit: func(_ *timeline, o *observed) {
			o.kill.at = at(1000)
			o.pods[0].log = strings.NewReplacer(
				logAt(2500, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":0,"watched":1`),
				logAt(2500, msgResumed, `,"apps":0,"ended":0,"ended_unwatched":0,"watched":0`)+"\n"+
					logAt(32500, msgMissing, `,"expected":1,"seen":0,"missing":["a"]`)).Replace(o.pods[0].log)
		}, want: invRestart, text: "says it never saw a, which ran after its start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := tc.base
			if base == nil {
				base = success
			}
			tl, o := base()
			if tc.edit != nil {
				tc.edit(&tl, &o)
			}
			v := checkJob(tl, o)
			got := problems(v)
			if tc.want < 0 {
				if got != "" {
					t.Fatalf("problems:\n%s", got)
				}
			} else if len(v.problems[tc.want]) == 0 || !strings.Contains(got, tc.text) {
				t.Fatalf("want a %s problem with %q, got:\n%s", invariantNames[tc.want], tc.text, got)
			}
			if notes := slices.Concat(v.anomalies, v.unchecked); len(v.anomalies) != tc.anomalies || len(v.unchecked) != tc.unchecked ||
				!strings.Contains(strings.Join(notes, "\n"), tc.note) {
				t.Errorf("anomalies %q, unchecked %q; want %d and %d, one with %q", v.anomalies, v.unchecked, tc.anomalies, tc.unchecked, tc.note)
			}
			if tc.missed != "" && !strings.Contains(v.kill.missed, tc.missed) {
				t.Errorf("kill outcome: %s, want it missed for %q", v.kill, tc.missed)
			}
			if tc.check != nil {
				tc.check(t, v)
			}
		})
	}
}

func countsSuccess(t *testing.T, v verdict) {
	if v.outcomes["success"] != 1 {
		t.Errorf("outcomes %v", v.outcomes)
	}
}

// appKilled makes success's app killed with no end stamp, its start
// recorded at startedAt.
func appKilled(o *observed, startedAt metav1.Time) {
	o.inst["a"][0].end = time.Time{}
	cs(o, "a").LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, StartedAt: startedAt}}
}

// appStartFailed makes success's app never run, its start failed by the
// runtime.
func appStartFailed(_ *timeline, o *observed) {
	o.inst["a"] = nil
	cs(o, "a").State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError",
		Message: "failed to start containerd task: context canceled: unknown"}}
	o.pods[0].pod.Status.Phase = corev1.PodFailed
}

// proxyUnstarted is a Job whose istio-proxy's start the runtime failed,
// finished before the app's end (seed 123, Job 9), and whose supervisor
// said there was no sidecar.
func proxyUnstarted() (timeline, observed) {
	tl, o := never(0, "success: a exit 0; action SIGTERM; no sidecar appeared", 128, 3002)()
	proxy := cs(&o, proxyName).State.Terminated
	proxy.Reason, proxy.FinishedAt = "StartError", metav1.NewTime(at(1000))
	o.pods[0].pod.Status.Phase = corev1.PodFailed
	o.pods[0].log = strings.Join([]string{logAt(500, "starting", ""), logAt(600, "app found", ""), logAt(33000, msgNoSidecar, "")}, "\n")
	return tl, o
}

// proxyDeleted makes proxyUnstarted's pod deleted at ms, its grace period
// 30 s.
func proxyDeleted(o *observed, ms int) {
	p, grace := o.pods[0].pod, int64(30)
	del := metav1.NewTime(at(ms).Add(30 * time.Second))
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &del, &grace
}

// deadlineBeforeB makes success a Job of apps a and b whose deadline
// passed at 10 s, while a ran and before b's program had run.
func deadlineBeforeB(tl *timeline, o *observed) {
	tl.deadline, tl.deadlineHit = 10, true
	tl.apps = []appPlan{{name: "a", steps: []step{{20 * time.Second, 0}}}, {name: "b", steps: []step{{time.Second, 0}}}}
	tl.want = tl.oracle()
	o.cond = &batchv1.JobCondition{Type: batchv1.JobFailed, Reason: batchv1.JobReasonDeadlineExceeded, Status: corev1.ConditionTrue}
	p := o.pods[0].pod
	del := metav1.NewTime(at(10000))
	p.DeletionTimestamp = &del
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, terminated("b", 143, "", at(10100)))
	cs(o, "b").State.Terminated.StartedAt = metav1.NewTime(at(9000))
	cs(o, "a").State.Terminated.ExitCode = 143
	cs(o, supervisorName).State.Terminated.Message = "pod deleted before the apps finished: sidecar left to the kubelet"
	o.inst["a"][0].end = time.Time{}
	o.pods[0].log = strings.Join([]string{logAt(500, "starting", ""), logAt(600, "app found", "")}, "\n")
}

// lostStatus makes killedPod's supervisor killed at 2.9 s, before the app's
// end at 3 s, and back at backMS (its log: "starting" 50 ms before, then
// carrying on with the app ended unwatched) to signal istio-proxy at
// signalMS, its outcome unknown.
func lostStatus(o *observed, backMS, signalMS int) {
	o.kill.at = at(2900)
	o.pods[0].log = strings.NewReplacer(logAt(2450, "starting", ""), logAt(backMS-50, "starting", ""),
		logAt(2500, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":0,"watched":1`),
		logAt(backMS, msgResumed, `,"apps":1,"ended":0,"ended_unwatched":1,"watched":0`),
		logAt(3002, msgSignalled, `,"signal":"SIGTERM"`), logAt(signalMS, msgSignalled, `,"signal":"SIGTERM"`)).Replace(o.pods[0].log)
	cs(o, supervisorName).State.Terminated.Message = "unknown: a unknown; action SIGTERM"
}

// recordedStatus is lostStatus under exit-status ptrace, the killed
// instance having anchored accounting at 0.7 s, its summary summary.
func recordedStatus(tl *timeline, o *observed, backMS, signalMS int, summary string) {
	tl.ptrace = true
	lostStatus(o, backMS, signalMS)
	o.pods[0].prevLog += "\n" + logAt(700, msgAnchored, "")
	cs(o, supervisorName).State.Terminated.Message = summary
}

// notRestarted makes killedPod's supervisor one instance, never
// restarted: killed at killMS after it signalled istio-proxy at 3 s (its
// log: the first instance's, the signal, then tail), ending with code
// (137: the kill ended it).
func notRestarted(o *observed, killMS int, code int32, tail ...string) {
	o.kill.at = at(killMS)
	s := cs(o, supervisorName)
	s.RestartCount, s.LastTerminationState = 0, corev1.ContainerState{}
	if code != 0 {
		s.State.Terminated.ExitCode, s.State.Terminated.Reason = code, "Error"
	}
	o.pods[0].log = strings.Join(append([]string{o.pods[0].prevLog, logAt(3002, msgSignalled, `,"signal":"SIGTERM"`)}, tail...), "\n")
	o.pods[0].prevLog = ""
}

// TestParseLog reads logs the supervisor wrote on the cluster: a first
// instance's (soak-026 of seed 20261204) and a restarted one's that
// carries on from the journal (soak-019). Keys differ in type from one
// message to another ("apps" is a list of names in the first lines, a
// count in the journal's): the first soak of the killing code read every
// log as broken. The wait a supervisor logs for the new start of an app
// that ended as its runtime's init is read, in seconds, the longest of its
// lines (checkRestart allows it on top of killBound).
func TestParseLog(t *testing.T) {
	initEnds := `{"level":"info","time":"2026-12-05T00:00:00.000Z","message":"starting"}
{"level":"warn","container":"app1","wait":15,"time":"2026-12-05T00:00:01.000Z","message":"` + msgInitEnds[1] + `"}
{"level":"warn","container":"app2","wait":25.5,"time":"2026-12-05T00:00:02.000Z","message":"` + msgInitEnds[0] + `"}
`
	for _, c := range []struct {
		file, text string
		stops      int
		done       bool
		resumed    *resumeCounts
		initWait   time.Duration
	}{
		{file: "supervisor-first.log", stops: 1, done: true},
		{file: "supervisor-resumed.log", stops: 1, done: true, resumed: &resumeCounts{Apps: 1, Ended: 1}},
		{text: initEnds, initWait: 25500 * time.Millisecond},
	} {
		if c.file != "" {
			b, err := os.ReadFile(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			c.text = string(b)
		}
		s, err := parseSupervisorLog(c.text)
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		if len(s.stops) != c.stops || s.done.IsZero() == c.done || (s.resumed != nil) != (c.resumed != nil) || s.initWait != c.initWait {
			t.Errorf("%s: %d stops, done %v, resumed %v, init wait %s; want %d, a done line %v, resumed %v, %s",
				c.file, len(s.stops), s.done, s.resumed, s.initWait, c.stops, c.done, c.resumed != nil, c.initWait)
		}
		if s.resumed != nil && c.resumed != nil && s.resumed.counts != *c.resumed {
			t.Errorf("%s: resumed with %+v, want %+v", c.file, s.resumed.counts, *c.resumed)
		}
	}
}

// TestMessages reads the supervisor's termination messages. One killed as
// it acted wrote so (seed 20261205, Job 144, whose log the kubelet had
// removed), and so did one killed once done, in its summary (seed
// 20261209, Job 80); one killed before its decision did not. A failure decided on
// an exit 143 the supervisor read holds the decision for the deletion
// grace, killed or not (seed 20261206, Jobs 36, 100 and 135: their kills
// cost 1.3-2.0 s, flagged as 3.3-4.0 s without it); a status it never
// read holds nothing.
func TestMessages(t *testing.T) {
	for _, tc := range []struct {
		message string
		acted   bool // as the message before a restart
		grace   time.Duration
	}{
		{"running: success (all 2 app containers exit 0): action POST http://127.0.0.1:15020/quitquitquit\napp app1 (pid 34): exit 2; restarted\n", true, 0},
		{"running: failure (app1 exit 3): action SIGKILL\n", true, 0},
		{"running: waiting for app app1 (pid 81)\nsidecar istio-proxy (pid 50): held\n", false, 0},
		{"", false, 0},
		{"failure: app1 exit 143; action SIGKILL; sidecar stopped in 0.1s\n", true, deletionGrace},
		{"failure: app1 exit 3, app2 exit 143; action SIGKILL", true, deletionGrace},
		{"failure: app1 exit 1431; action SIGKILL", true, 0},
		{"failure: app1 exit 3; action SIGKILL", true, 0},
		{"success: app1 exit 0; action SIGTERM", true, 0},
		{"success: app1 exit 0; action POST http://127.0.0.1:15020/quitquitquit; sidecars exited before the supervisor's restart\n", true, 0},
		{"success: app1 exit 0; action none", false, 0},
		{"unknown: app1 unknown (it exited before the supervisor could watch it); action SIGTERM", true, 0},
	} {
		sup := terminated(supervisorName, 0, tc.message, at(5000))
		sup.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Message: tc.message}}
		if acted, grace := actedBeforeKill(&sup), graceFor(&sup); acted != tc.acted || grace != tc.grace {
			t.Errorf("%q: acted %v, grace %s; want %v, %s", tc.message, acted, grace, tc.acted, tc.grace)
		}
	}
	if acted, grace := actedBeforeKill(&corev1.ContainerStatus{}), graceFor(&corev1.ContainerStatus{}); acted || grace != 0 {
		t.Errorf("running supervisor: acted %v, grace %s", acted, grace)
	}
}
