package main

import (
	"fmt"
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

// One Never pod whose app a runs 0 to 3 s and exits code; the supervisor
// starts at 0.5 s and signals istio-proxy at signalMS.
func neverPod(code int, summary string, proxyCode int32, signalMS int) (timeline, observed) {
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

func problems(v verdict) string {
	var s []string
	for i, ps := range v.problems {
		for _, p := range ps {
			s = append(s, invariantNames[i]+": "+p)
		}
	}
	return strings.Join(s, "\n")
}

func TestCheckJob(t *testing.T) {
	for _, tc := range []struct {
		name      string
		code      int
		summary   string
		proxyCode int32
		signalMS  int
		want      invariant // -1: none
		wantText  string
	}{
		{"success", 0, "success: a exit 0; action SIGTERM", 0, 3002, -1, ""},
		{"failure", 3, "failure: a exit 3; action SIGKILL", 137, 3002, -1, ""},
		{"signal in the app's last millisecond", 0, "success: a exit 0; action SIGTERM", 0, 3000, -1, ""},
		{"signal before the app's end", 0, "success: a exit 0; action SIGTERM", 0, 2999, invOrder, "while a #1"},
		{"unknown for a seen app", 0, "unknown: a unknown; action SIGTERM", 0, 3002, invMessage, `want it to start with "success:"`},
		{"failure not named", 3, "failure: b exit 3; action SIGKILL", 137, 3002, invMessage, `does not name "a exit 3"`},
		{"SIGTERM on failure", 3, "failure: a exit 3; action SIGKILL", 0, 3002, invMessage, "istio-proxy exited 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, o := neverPod(tc.code, tc.summary, tc.proxyCode, tc.signalMS)
			v := checkJob(tl, o)
			got := problems(v)
			if tc.want < 0 {
				if got != "" {
					t.Fatalf("problems:\n%s", got)
				}
				return
			}
			if len(v.problems[tc.want]) == 0 || !strings.Contains(got, tc.wantText) {
				t.Fatalf("want a %s problem with %q, got:\n%s", invariantNames[tc.want], tc.wantText, got)
			}
		})
	}
}

// An app gone before the supervisor looked may be unknown; a restart
// after the stop, or a container still running, is caught.
func TestCheckJobEdges(t *testing.T) {
	tl, o := neverPod(0, "unknown: a unknown (its main process had exited before the supervisor saw it); action SIGTERM", 0, 3002)
	o.inst["a"][0].end = at(900) // ended 0.4 s after the supervisor's first line
	if got := problems(checkJob(tl, o)); got != "" {
		t.Errorf("quick app taken as unknown:\n%s", got)
	}

	tl, o = neverPod(0, "success: a exit 0; action SIGTERM", 0, 3002)
	o.inst["a"] = append(o.inst["a"], instance{app: "a", n: 2, pod: "p1", start: at(4000)})
	if got := problems(checkJob(tl, o)); !strings.Contains(got, "before a #2") {
		t.Errorf("an instance started after the stop not caught:\n%s", got)
	}

	tl, o = neverPod(0, "success: a exit 0; action SIGTERM", 0, 3002)
	o.pods[0].running = []string{"abc123"}
	o.pods[0].pod.Status.ContainerStatuses[2].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	v := checkJob(tl, o)
	if len(v.problems[invLeft]) != 2 {
		t.Errorf("running containers: %s", problems(v))
	}
}
