package k8sjobs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// readDeploy decodes a manifest under deploy/ strictly into out.
func readDeploy(t *testing.T, name string, out any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, out); err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
}

// deployJob applies the hand-written deploy/job.yaml as it is but for the
// app's gate: the injector adds istio-proxy and leaves the hand-added
// supervisor alone. The supervisor comes after the app there, so the app
// ends only once the supervisor has found it.
func (e *env) deployJob(ctx context.Context, t *testing.T) {
	p := e.completeDeployJob(ctx, t, "job.yaml", "deploy-job", nil)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_STOP_TIMEOUT": "30s", "SUPERVISOR_EXIT_STATUS": "auto"}})
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", quit)
}

// deployJobPtrace applies deploy/job-ptrace.yaml (the app gated, as in
// deployJob): the supervisor as root with SYS_PTRACE and KILL reads the exit
// status as the app's tracer, under containerd's default seccomp profile.
// istio-proxy comes last (Istio's injector moves it there, unless held):
// the supervisor's postStart hook sleeps, which holds the kubelet back
// from starting it, so that the supervisor has found the app and looks no
// more for apps when pilot-agent starts, as on a loaded node. It must find
// pilot-agent while the app runs, and anchor accounting through it.
func (e *env) deployJobPtrace(ctx context.Context, t *testing.T) {
	p := e.completeDeployJob(ctx, t, "job-ptrace.yaml", "deploy-job-ptrace", func(s *corev1.PodSpec) {
		c := findContainer(*s, supervisorName)
		if c == nil {
			t.Fatalf("deploy/job-ptrace.yaml has no %s container", supervisorName)
		}
		c.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}}
	})
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_EXIT_STATUS": "ptrace"}})
	if p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod %s is %s, want Succeeded", p.Name, p.Status.Phase)
	}
	wantExit(t, p, "app", 0)
	wantExit(t, p, proxyName, 0)
	log := e.checkSupervisor(ctx, t, p, "success: {app} exit 0; action "+quit.action()+"; sidecar stopped",
		logPtrace, logFound, logExited, logDecision, logStopped, logDone)
	// Found after the app, anchored while the app ran (release waits for
	// the anchor: anchors).
	inOrder(t, p, log, logFound, logSidecarFound, logAnchored, logExited)
}

// completeDeployJob creates the Job of deploy/file, its app gated, in a new
// namespace named after prefix, releases the app, waits for the Job to
// complete and returns its pod. edit, if not nil, changes the pod's spec
// first.
func (e *env) completeDeployJob(ctx context.Context, t *testing.T, file, prefix string, edit func(*corev1.PodSpec)) corev1.Pod {
	t.Helper()
	var j batchv1.Job
	readDeploy(t, file, &j)
	gate(t, &j.Spec.Template.Spec, "app")
	if edit != nil {
		edit(&j.Spec.Template.Spec)
	}
	ns := e.namespace(ctx, t, prefix)
	e.createJob(ctx, t, ns, &j)
	e.release(ctx, t, e.nthPod(ctx, t, ns, j.Name, 1), "app", 1)
	e.waitComplete(ctx, t, ns, j.Name)
	return e.onePod(ctx, t, ns, j.Name)
}

// deployCronJob: deploy/cronjob.yaml with its schedule changed to every
// minute and its app gated, nothing else; fires once (fireOnce).
func (e *env) deployCronJob(ctx context.Context, t *testing.T) {
	var cj batchv1.CronJob
	readDeploy(t, "cronjob.yaml", &cj)
	cj.Spec.Schedule = "* * * * *"
	gate(t, &cj.Spec.JobTemplate.Spec.Template.Spec, "app")
	ns := e.namespace(ctx, t, "deploy-cronjob")
	p := e.fireOnce(ctx, t, ns, &cj)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_RESTART_POLICY": "OnFailure"}})
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", quit)
}

// fireOnce creates the CronJob, waits for its first Job (at most a minute to
// the next minute, then the controller's sync on a busy node: bounded at 5
// min, a hang guard), suspends the CronJob so that it fires no more, waits
// for the Job to complete, its gated app released, and returns its pod.
func (e *env) fireOnce(ctx context.Context, t *testing.T, ns string, cj *batchv1.CronJob) corev1.Pod {
	t.Helper()
	cjs := e.c.Client.BatchV1().CronJobs(ns)
	created, err := cjs.Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cronjob %s/%s: %v", ns, cj.Name, err)
	}
	var job batchv1.Job
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := e.c.Client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, j := range l.Items {
			if ref := metav1.GetControllerOf(&j); ref != nil && ref.Kind == "CronJob" && ref.UID == created.UID {
				job = j
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("cronjob %s created at %s fired no Job within 5m: %v", cj.Name, created.CreationTimestamp, err)
	}
	if _, err := cjs.Patch(ctx, cj.Name, types.MergePatchType, []byte(`{"spec":{"suspend":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("suspend cronjob %s: %v", cj.Name, err)
	}
	scheduled := job.Annotations[batchv1.CronJobScheduledTimestampAnnotation]
	if scheduled == "" {
		t.Errorf("job %s lacks the %s annotation of a scheduled run", job.Name, batchv1.CronJobScheduledTimestampAnnotation)
	}
	t.Logf("cronjob %s (created %s) fired job %s scheduled at %s", cj.Name, created.CreationTimestamp.Format(time.RFC3339), job.Name, scheduled)
	if p := e.nthPod(ctx, t, ns, job.Name, 1); gated(p, "app") {
		e.release(ctx, t, p, "app", 1)
	}
	e.waitComplete(ctx, t, ns, job.Name)
	// The CronJob controller records the success.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, jobLimit, true, func(ctx context.Context) (bool, error) {
		got, err := cjs.Get(ctx, cj.Name, metav1.GetOptions{})
		return err == nil && got.Status.LastSuccessfulTime != nil, nil
	})
	if err != nil {
		t.Errorf("cronjob %s has no lastSuccessfulTime %s after its job completed: %v", cj.Name, jobLimit, err)
	}
	return e.onePod(ctx, t, ns, job.Name)
}
