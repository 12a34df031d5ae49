package k8sjobs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
)

// exitThree: the app exits 3 in each of the 2 pods backoffLimit 1 allows; the
// Job fails, and each pod's istio-proxy was SIGKILLed (137).
func (e *env) exitThree(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "exit-three")
	j := newJob("exit-three", corev1.RestartPolicyNever, 1, app("app", "echo working; echo failing; exit 3"))
	gate(t, &j.Spec.Template.Spec, "app")
	e.createJob(ctx, t, ns, j)
	// Each pod's app, the second once the first has failed.
	for n := 1; n <= 2; n++ {
		e.release(ctx, t, e.nthPod(ctx, t, ns, "exit-three", n), "app", 1)
	}
	cond := e.waitJob(ctx, t, ns, "exit-three", jobLimit)
	if cond.Type != batchv1.JobFailed || cond.Reason != batchv1.JobReasonBackoffLimitExceeded {
		t.Fatalf("job ended %s (%s: %s), want Failed (BackoffLimitExceeded)", cond.Type, cond.Reason, cond.Message)
	}
	pods := e.jobPods(ctx, t, ns, "exit-three")
	if len(pods) != 2 {
		t.Fatalf("job has %d pods, want 2 (backoffLimit 1)", len(pods))
	}
	for _, p := range pods {
		e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true})
		if p.Status.Phase != corev1.PodFailed {
			t.Errorf("pod %s is %s, want Failed", p.Name, p.Status.Phase)
		}
		wantExit(t, p, "app", 3)
		// SIGKILL (137, and the summary's action), so no drain: pilot-agent
		// never began one, whatever the time it took.
		wantExit(t, p, proxyName, 137)
		if pilot := e.logs(ctx, t, p, proxyName, false); strings.Contains(pilot, pilotDrainLine) {
			t.Errorf("pod %s: pilot-agent drained before its SIGKILL:\n%s", p.Name, pilot)
		}
		e.checkSupervisor(ctx, t, p, "failure: {app} exit 3; action SIGKILL",
			logPidfd, logFound, logExited, logDecision, logStopped, logDone)
	}
}

// onFailure: restartPolicy OnFailure, the app fails once (it leaves a marker
// in an emptyDir) and succeeds when the kubelet restarts it in place. The
// proxy must stay up through the restart and be stopped only after success.
// Each run is gated: it ends once the supervisor watches it (the first,
// once istio-proxy runs too).
func (e *env) onFailure(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "on-failure")
	j := newJob("on-failure", corev1.RestartPolicyOnFailure, 2,
		app("app", `if [ -e /state/failed-once ]; then echo "second run: succeeding"; exit 0; fi
touch /state/failed-once; echo "first run: failing"; exit 1`))
	spec := &j.Spec.Template.Spec
	spec.Volumes = []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "state", MountPath: "/state"}}
	gate(t, spec, "app")
	e.createJob(ctx, t, ns, j)
	pod := e.nthPod(ctx, t, ns, "on-failure", 1)
	e.release(ctx, t, pod, "app", 1)
	// The first run's end, read while the pod runs (the second waits at its
	// gate): a 1.34 kubelet's status of the completed pod no longer has it;
	// 1.37's does.
	first := e.waitRestarted(ctx, t, ns, "on-failure", "app")
	if first.ExitCode != 1 {
		t.Fatalf("app's first run exited %d (%s), want 1", first.ExitCode, first.Reason)
	}
	e.release(ctx, t, pod, "app", 2)
	e.waitComplete(ctx, t, ns, "on-failure")
	p := e.onePod(ctx, t, ns, "on-failure")
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_RESTART_POLICY": "OnFailure"}})
	appStatus := status(t, p, "app")
	if appStatus.RestartCount != 1 {
		t.Errorf("app restarted %d times, want 1", appStatus.RestartCount)
	}
	if got := e.logs(ctx, t, p, "app", false); !strings.Contains(got, "second run: succeeding") {
		t.Errorf("app's second run logged %q", got)
	}
	// The same istio-proxy instance, started before the first run failed,
	// ended after the second succeeded.
	proxy := status(t, p, proxyName)
	if proxy.State.Terminated == nil {
		t.Fatalf("istio-proxy not terminated: %s", cluster.StateString(proxy.State))
	}
	if proxy.State.Terminated.StartedAt.After(first.FinishedAt.Time) {
		t.Errorf("istio-proxy started at %s, after the app's first run ended at %s", proxy.State.Terminated.StartedAt, first.FinishedAt)
	}
	log := e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", quit)
	// The retry was seen as such, in this order, before the stop.
	inOrder(t, p, log, logFound, logExited, logRetry, logNewApp, logExited, logDecision, logStopped)
}

// twoApps: two app containers, the slow one still working when the quick
// one has exited; istio-proxy is stopped only after the second. Both are
// gated: slow goes once the supervisor has logged quick's exit and no
// decision.
func (e *env) twoApps(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "two-apps")
	j := newJob("two-apps", corev1.RestartPolicyNever, 0, app("quick", "echo quick"), app("slow", "echo slow"))
	gate(t, &j.Spec.Template.Spec, "quick", "slow")
	e.createJob(ctx, t, ns, j)
	pod := e.nthPod(ctx, t, ns, "two-apps", 1)
	e.release(ctx, t, pod, "quick", 1)
	if log := e.waitLogged(ctx, t, pod, supervisorName, logExited, "quick", 1); strings.Contains(log, `"message":"`+logDecision+`"`) {
		t.Errorf("pod %s: the supervisor decided while slow still worked:\n%s", pod.Name, log)
	}
	e.release(ctx, t, pod, "slow", 1)
	e.waitComplete(ctx, t, ns, "two-apps")
	p := e.onePod(ctx, t, ns, "two-apps")
	e.checkInjected(t, p, shape{apps: []string{"quick", "slow"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_APP_CONTAINERS": "2"}})
	e.checkSucceeded(ctx, t, p, []string{"quick", "slow"}, "success: all 2 app containers exit 0", quit)
	// In order, to the second (the times' resolution): quick, slow, proxy.
	quick, slow, proxy := terminated(t, p, "quick"), terminated(t, p, "slow"), terminated(t, p, proxyName)
	if slow.FinishedAt.Before(&quick.FinishedAt) || proxy.FinishedAt.Before(&slow.FinishedAt) {
		t.Errorf("finished: quick %s, slow %s, istio-proxy %s; want them in this order", quick.FinishedAt, slow.FinishedAt, proxy.FinishedAt)
	}
}

// control: the same Job as exit-zero (succeed) with the supervisor opted out: istio-proxy
// alone keeps the pod Running, and the Job never completes.
func (e *env) control(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "control")
	j := newJob("control", corev1.RestartPolicyNever, 0, app("app", "echo working; sleep 3; echo done"))
	j.Spec.Template.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/inject": "false"}
	e.createJob(ctx, t, ns, j)
	var p corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, jobLimit, true, func(ctx context.Context) (bool, error) {
		pods := e.jobPods(ctx, t, ns, "control")
		if len(pods) == 0 {
			return false, nil
		}
		p = pods[0]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod %s is %s before its app finished", p.Name, p.Status.Phase)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "app" && s.State.Terminated != nil {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the control's app did not finish (bound %s): %v", jobLimit, err)
	}
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: false})
	wantExit(t, p, "app", 0)

	// Watch the pod for controlWindow: any terminal phase or istio-proxy
	// exit is a failure of the control.
	if changed := e.watchPodFor(ctx, t, p, controlWindow, func(got *corev1.Pod) string {
		if got.Status.Phase != corev1.PodRunning {
			return fmt.Sprintf("pod phase %s", got.Status.Phase)
		}
		for _, s := range got.Status.ContainerStatuses {
			if s.Name == proxyName && s.State.Running == nil {
				return "istio-proxy " + cluster.StateString(s.State)
			}
		}
		return ""
	}); changed != "" {
		t.Fatalf("without the supervisor the pod was expected to stay Running, but: %s", changed)
	}
	jb, err := e.c.Client.BatchV1().Jobs(ns).Get(ctx, "control", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := jobprog.Finished(jb); c != nil {
		t.Fatalf("the control Job reached %s without a supervisor", c.Type)
	}
	if jb.Status.Active != 1 {
		t.Errorf("control Job has %d active pods, want 1", jb.Status.Active)
	}
	t.Logf("control: %s after its app exited 0, pod %s is still Running with istio-proxy up and the Job not complete", controlWindow, p.Name)
}
