package k8sjobs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// Issue 18 on the real cluster: pods the guesswork got wrong, now known by
// the names the kubelet's termination-message mounts give every container.

const logLeftAlone = "container neither waited for nor stopped"

// runningPod waits until the job's pod runs with its container app running.
func (e *env) runningPod(ctx context.Context, t *testing.T, ns, job, app string) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(jobLimit)
	for time.Now().Before(deadline) {
		for _, p := range e.jobPods(ctx, t, ns, job) {
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == app && s.State.Running != nil {
					return p
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("job %s/%s: no pod with %s running within %s\n%s", ns, job, app, jobLimit, e.diagnose(t, ns, job))
	return corev1.Pod{}
}

// nativeSidecarOfItsOwn: (a) a Job with a native sidecar of its own (an
// init container with restartPolicy Always, as the OpenTelemetry operator,
// Linkerd or Kuma inject theirs) beside a classic istio-proxy. The kubelet
// stops the native sidecar only after every regular container, istio-proxy
// included, has exited: waiting for it would hang the Job.
func (e *env) nativeSidecarOfItsOwn(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "native-own")
	j := newJob("native-own", corev1.RestartPolicyNever, 0, app("app", "echo working; echo done"))
	tmpl := &j.Spec.Template
	tmpl.Annotations = map[string]string{"sidecar.istio.io/nativeSidecar": "false"}
	logship := app("logship", "while true; do sleep 1; done")
	logship.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	tmpl.Spec.InitContainers = []corev1.Container{logship}
	gate(t, &tmpl.Spec, "app")
	e.createJob(ctx, t, ns, j)
	e.release(ctx, t, e.nthPod(ctx, t, ns, "native-own", 1), "app", 1)
	e.waitComplete(ctx, t, ns, "native-own")
	p := e.onePod(ctx, t, ns, "native-own")
	log := e.checkSupervisor(ctx, t, p, "success: app exit 0; action "+quit.action()+"; sidecar stopped", logFound, logExited, logDecision, logStopped)
	wantExit(t, p, proxyName, 0)
	for _, name := range []string{`"container":"app"`, `"container":"istio-proxy"`, `"container":"logship"`} {
		if !strings.Contains(log, name) {
			t.Errorf("pod %s: the supervisor's log never names %s:\n%s", p.Name, name, log)
		}
	}
	inOrder(t, p, log, logLeftAlone)
}

// ephemeralLeftRunning: (b) an ephemeral container added through the API
// while the app runs, and left running: the Job completes all the same. The
// app is gated: it ends once the debug container runs.
func (e *env) ephemeralLeftRunning(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "ephemeral")
	j := newJob("ephemeral", corev1.RestartPolicyNever, 0, app("app", "echo working; echo done"))
	gate(t, &j.Spec.Template.Spec, "app")
	e.createJob(ctx, t, ns, j)
	pod := e.runningPod(ctx, t, ns, "ephemeral", "app")
	e.addDebugContainer(ctx, t, pod)
	e.waitRunning(ctx, t, pod, "debugger", 0)
	e.release(ctx, t, pod, "app", 1)
	e.waitComplete(ctx, t, ns, "ephemeral")
	p := e.onePod(ctx, t, ns, "ephemeral")
	e.checkSupervisor(ctx, t, p, "success: app exit 0; action "+quit.action()+"; sidecar stopped", logFound, logExited, logDecision, logStopped)
	wantExit(t, p, proxyName, 0)
}

// addDebugContainer adds a `kubectl debug`-style ephemeral container
// (sleep 600) to p through the API, to the pod as it is then: the kubelet
// updates its status meanwhile (a container turning ready), and an update
// of the copy read earlier is refused as a conflict (seen once in CI).
func (e *env) addDebugContainer(ctx context.Context, t *testing.T, p corev1.Pod) {
	t.Helper()
	pods := e.c.Client.CoreV1().Pods(p.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{
				Name: "debugger", Image: cluster.BusyboxImage, Command: []string{"sleep", "600"},
				ImagePullPolicy: corev1.PullIfNotPresent, TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			},
		})
		_, err = pods.UpdateEphemeralContainers(ctx, p.Name, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("add an ephemeral container to %s: %v", p.Name, err)
	}
}

// onFailureTwoApps: (c) OnFailure, two apps, one failing twice (a marker in
// an emptyDir counts its runs), with a debug container added meanwhile:
// each restart is the same name coming back, counted per name; istio-proxy
// lives through both restarts. Both apps are gated: flaky's first run ends
// once the debug container runs, each later run once the supervisor
// watches it; steady ends last.
func (e *env) onFailureTwoApps(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "on-failure-two")
	j := newJob("on-failure-two", corev1.RestartPolicyOnFailure, 3,
		app("flaky", `n=$(cat /state/runs 2>/dev/null || echo 0); echo $((n+1)) > /state/runs
if [ "$n" -lt 2 ]; then echo "run $((n+1)): failing"; exit 1; fi; echo "run $((n+1)): succeeding"`),
		app("steady", "echo steady"))
	spec := &j.Spec.Template.Spec
	spec.Volumes = []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "state", MountPath: "/state"}}
	gate(t, spec, "flaky", "steady")
	e.createJob(ctx, t, ns, j)
	pod := e.runningPod(ctx, t, ns, "on-failure-two", "flaky")
	e.addDebugContainer(ctx, t, pod)
	e.waitRunning(ctx, t, pod, "debugger", 0)
	for run := 1; run <= 3; run++ {
		e.release(ctx, t, pod, "flaky", run)
	}
	e.release(ctx, t, pod, "steady", 1)
	e.waitComplete(ctx, t, ns, "on-failure-two")
	p := e.onePod(ctx, t, ns, "on-failure-two")
	if s := status(t, p, "flaky"); s.RestartCount != 2 {
		t.Errorf("flaky restarted %d times, want 2", s.RestartCount)
	}
	if s := status(t, p, proxyName); s.RestartCount != 0 {
		t.Errorf("istio-proxy restarted %d times, want 0", s.RestartCount)
	}
	wantExit(t, p, proxyName, 0)
	log := e.checkSupervisor(ctx, t, p, "success: all 2 app containers exit 0; action "+quit.action()+"; sidecar stopped",
		logFound, logRetry, logNewApp, logRetry, logNewApp, logDecision, logStopped)
	if n := strings.Count(log, `"container":"flaky","replaces":"flaky"`); n != 2 {
		t.Errorf("pod %s: %d restarts of flaky taken for flaky's, want 2:\n%s", p.Name, n, log)
	}
	if strings.Contains(log, `"container":"debugger","replaces"`) {
		t.Errorf("pod %s: the debug container was taken for a restart:\n%s", p.Name, log)
	}
}

// notShared: (d, e) hostPID pods, a Job's and a Deployment's, and a Job
// with shareProcessNamespace: false are admitted (the API server refuses
// hostPID with a shared PID namespace), left without the supervisor or the
// hold, and say why in an annotation.
func (e *env) notShared(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "not-shared")
	hostPID := newJob("host-pid", corev1.RestartPolicyNever, 0, app("app", "sleep 3600"))
	hostPID.Spec.Template.Spec.HostPID = true
	unshared := newJob("unshared", corev1.RestartPolicyNever, 0, app("app", "sleep 3600"))
	unshared.Spec.Template.Spec.ShareProcessNamespace = ptr.To(false)
	e.createJob(ctx, t, ns, hostPID)
	e.createJob(ctx, t, ns, unshared)
	tmpl := newJob("x", corev1.RestartPolicyAlways, 0, app("web", "sleep 3600")).Spec.Template
	tmpl.Labels["app"] = "web"
	tmpl.Spec.HostPID = true
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "host-pid-web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Template: tmpl}}
	if _, err := e.c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	for _, tc := range []struct{ selector, status string }{
		{batchv1.JobNameLabel + "=host-pid", "not added: a hostPID pod"},
		{batchv1.JobNameLabel + "=unshared", "not added: the pod sets shareProcessNamespace: false"},
		{"app=web", "not added: a hostPID pod"},
	} {
		p := e.podBy(ctx, t, ns, tc.selector)
		if got := p.Annotations["supervisor.sidecar-supervisor.io/status"]; !strings.HasPrefix(got, tc.status) {
			t.Errorf("pod %s: status annotation %q, want %q...", p.Name, got, tc.status)
		}
		if findContainer(p.Spec, supervisorName) != nil || len(p.Spec.InitContainers) != 0 {
			t.Errorf("pod %s got the supervisor or the hold: %v %v", p.Name, containerNames(p.Spec.InitContainers), containerNames(p.Spec.Containers))
		}
		if findContainer(p.Spec, proxyName) == nil {
			t.Errorf("pod %s has no istio-proxy: the injector did not run", p.Name)
		}
	}
}

// podBy waits (bounded) for a pod matching selector in ns to be created,
// as its controller does once the API server admits it.
func (e *env) podBy(ctx context.Context, t *testing.T, ns, selector string) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		l, err := e.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil && len(l.Items) > 0 {
			return l.Items[0]
		}
		time.Sleep(200 * time.Millisecond)
	}
	ev, _ := e.c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	var b strings.Builder
	for _, x := range ev.Items {
		fmt.Fprintf(&b, "%s %s: %s\n", x.InvolvedObject.Name, x.Reason, x.Message)
	}
	t.Fatalf("no pod %s in %s within a minute (not admitted?); events:\n%s", selector, ns, b.String())
	return corev1.Pod{}
}
