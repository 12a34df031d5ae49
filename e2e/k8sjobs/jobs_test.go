package k8sjobs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// The apps run 10 s at least: with every case at once on two cores, the
// kubelet may take seconds between starting an app and starting the
// supervisor after it (the manifests by hand put it there), and an app of
// milliseconds is a case of its own (millisecondApps), not these.
const (
	// jobLimit bounds a Job's run: image already on the node, pilot-agent's
	// 5 s drain, the kubelet's 10 s back-off before a retry or a restart,
	// on two cores shared by every case running at once.
	jobLimit = 3 * time.Minute
	// controlWindow is how long the Job without the supervisor is watched
	// staying Running after its app has exited.
	controlWindow = 60 * time.Second
	// pilotDrain is pilot-agent's terminationDrainDuration (5 s by default):
	// on SIGTERM it drains envoy that long before it exits 0. Container
	// times have one-second resolution, hence the margin.
	pilotDrain = 4 * time.Second
	// quitURL is pilot-agent's quit endpoint on Istio's default status
	// port, the template's and deploy/'s action on success.
	quitURL = "http://127.0.0.1:15020/quitquitquit"
)

// TestJobs runs Jobs and CronJobs injected by Istio's own injector with our
// template on a real one-node Kubernetes, and checks what the Job controller
// and the kubelet make of them. The cases run in parallel, each in its own
// namespace.
func TestJobs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	e := setUp(ctx, t)
	t0 := time.Now()
	t.Run("cases", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			run  func(context.Context, *testing.T)
		}{
			{"exit 0 completes", e.exitZero},
			{"exit 0, on-success SIGTERM: pilot-agent drains", e.exitZeroDrain},
			{"quick apps as istio-proxy starts", e.quickApps},
			{"apps of milliseconds", e.millisecondApps},
			{"native sidecar of its own", e.nativeSidecarOfItsOwn},
			{"ephemeral container left running", e.ephemeralLeftRunning},
			{"OnFailure two apps, one failing twice", e.onFailureTwoApps},
			{"hostPID and unshared pods admitted", e.notShared},
			{"OnFailure, status unknown, success on the first try", e.onFailureUnknownFirstTry},
			{"OnFailure, status unknown, two failures", e.onFailureUnknownTwice},
			{"exit 3 fails, proxy killed", e.exitThree},
			{"OnFailure retry keeps the proxy", e.onFailure},
			{"two apps", e.twoApps},
			{"CronJob fires", e.cronJob},
			{"control: no supervisor stays Running", e.control},
			{"deploy/job.yaml", e.deployJob},
			{"deploy/job-ptrace.yaml", e.deployJobPtrace},
			{"deploy/cronjob.yaml fires", e.deployCronJob},
			{"cloud-sql-proxy example, exit 0 completes", e.cloudSQLExample},
			{"cloud-sql-proxy example, exit 3 fails", e.cloudSQLExampleFails},
			{"cloud-sql-proxy via the template, its quitquitquit", e.cloudSQLTemplateQuit},
			{"cloud-sql-proxy via the template, SIGTERM with exit-zero-on-sigterm", e.cloudSQLTemplateTerm},
			{"cloud-sql-proxy via the template, SIGTERM without it exits 143", e.cloudSQLTemplate143},
			{"cloud-sql-proxy via the template, exit 3 fails", e.cloudSQLTemplateFails},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				t1 := time.Now()
				tc.run(ctx, t)
				t.Logf("case done in %s", time.Since(t1).Round(time.Second))
			})
		}
	})
	t.Logf("all cases done in %s", time.Since(t0).Round(time.Second))
}

// newJob is a Job as users write one: busybox app containers, the label that
// asks Istio for its sidecar, nothing about the supervisor.
func newJob(name string, restart corev1.RestartPolicy, backoff int32, apps ...corev1.Container) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To(backoff),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"sidecar.istio.io/inject": "true"}},
				Spec: corev1.PodSpec{
					RestartPolicy: restart,
					Containers:    apps,
				},
			},
		},
	}
}

// app is a busybox container running a shell script.
func app(name, script string) corev1.Container {
	return corev1.Container{Name: name, Image: cluster.BusyboxImage, Command: []string{"sh", "-c", script}}
}

func (e *env) createJob(ctx context.Context, t *testing.T, ns string, j *batchv1.Job) {
	t.Helper()
	if _, err := e.c.Client.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job %s/%s: %v", ns, j.Name, err)
	}
}

// The supervisor's log messages the cases look for.
const (
	logPidfd    = "exit statuses read with pidfd (PIDFD_INFO_EXIT)"
	logPtrace   = "exit statuses read with ptrace"
	logFound    = "app found"
	logExited   = "app exited"
	logDecision = "decision"
	logStopped  = "sidecar stopped"
	logDone     = "done"
	logRetry    = "app failed under restartPolicy OnFailure: the kubelet restarts it, the sidecar stays up"
	logNewApp   = "app restarted by the kubelet: watching the new container"
)

// stopWay is how the supervisor stops istio-proxy once every app succeeded.
type stopWay int

const (
	// quit: the default, a POST to pilot-agent's /quitquitquit, on which it
	// exits 0 at once without draining.
	quit stopWay = iota
	// drain: SIGTERM (annotation on-success), on which pilot-agent drains
	// for terminationDrainDuration, then exits 0.
	drain
)

// env is the way's SUPERVISOR_ON_SUCCESS.
func (w stopWay) env() string {
	if w == drain {
		return "SIGTERM"
	}
	return quitURL
}

// action is how the supervisor's summary names the way.
func (w stopWay) action() string {
	if w == drain {
		return "SIGTERM"
	}
	return "POST " + quitURL
}

// pilot-agent's own log lines (istio.io/istio pkg/envoy/agent.go,
// pilot/cmd/pilot-agent/status/server.go) that tell the ways apart.
const (
	pilotQuit      = "handling /quitquitquit, notifying pilot-agent to exit"
	pilotNoDrain   = "Agent already drained, exiting immediately"
	pilotDrainLine = "Graceful termination period is"
)

// checkSucceeded checks a pod whose apps all exited 0: Succeeded, istio-proxy
// stopped the given way after the last app and exited 0, and the
// supervisor's summary: outcome, then the way's action.
func (e *env) checkSucceeded(ctx context.Context, t *testing.T, p corev1.Pod, apps []string, outcome string, way stopWay) string {
	t.Helper()
	summary := outcome + "; action " + way.action() + "; sidecar stopped"
	if p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod %s is %s, want Succeeded", p.Name, p.Status.Phase)
	}
	var last time.Time
	for _, a := range apps {
		if term := wantExit(t, p, a, 0); term.FinishedAt.After(last) {
			last = term.FinishedAt.Time
		}
	}
	proxy := wantExit(t, p, proxyName, 0)
	if s := status(t, p, proxyName); s.RestartCount != 0 {
		t.Errorf("pod %s: istio-proxy restarted %d times", p.Name, s.RestartCount)
	}
	pilot := e.logs(ctx, t, p, proxyName, false)
	switch way {
	case quit:
		// The POST reached pilot-agent (not the SIGTERM fallback), which
		// skipped the drain and exited.
		inOrderLines(t, p, proxyName, pilot, pilotQuit, pilotNoDrain)
		if strings.Contains(pilot, pilotDrainLine) {
			t.Errorf("pod %s: pilot-agent drained after the quit:\n%s", p.Name, pilot)
		}
	case drain:
		// SIGTERM, not a kill or a quit: pilot-agent drains before it exits.
		inOrderLines(t, p, proxyName, pilot, pilotDrainLine)
		if d := proxy.FinishedAt.Sub(last); d < pilotDrain {
			t.Errorf("pod %s: istio-proxy finished %s after the last app, want at least %s (pilot-agent's drain on SIGTERM)", p.Name, d, pilotDrain)
		}
	}
	return e.checkSupervisor(ctx, t, p, summary, logPidfd, logFound, logExited, logDecision, logStopped, logDone)
}

// exitZero: the app exits 0; the Job completes, istio-proxy exits 0 on the
// default quit.
func (e *env) exitZero(ctx context.Context, t *testing.T) {
	e.succeed(ctx, t, "exit-zero", quit)
}

// exitZeroDrain: the same with the annotation on-success: SIGTERM (the
// binary's own default): pilot-agent drains, then exits 0.
func (e *env) exitZeroDrain(ctx context.Context, t *testing.T) {
	e.succeed(ctx, t, "exit-zero-drain", drain)
}

// succeed runs a Job whose app exits 0, its supervisor told to stop
// istio-proxy the given way (quit: no annotation, the template's default).
func (e *env) succeed(ctx context.Context, t *testing.T, name string, way stopWay) {
	ns := e.namespace(ctx, t, name)
	j := newJob(name, corev1.RestartPolicyNever, 0, app("app", "echo working; sleep 10; echo done"))
	if way == drain {
		j.Spec.Template.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/on-success": "SIGTERM"}
	}
	e.createJob(ctx, t, ns, j)
	if cond := e.waitJob(ctx, t, ns, name, jobLimit); cond.Type != batchv1.JobComplete {
		t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
	}
	p := e.onePod(ctx, t, ns, name)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_RESTART_POLICY": "Never", "SUPERVISOR_APP_CONTAINERS": "1",
			"SUPERVISOR_APPS": "app", "SUPERVISOR_ON_SUCCESS": way.env()}})
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", way)
}

// quickApps: issue 16. Pods whose app ends 1.0-1.9 s after it starts, six
// at a time: istio-proxy, which the injector puts after the app and the
// supervisor, starts last, and pilot-agent may be only a moment old when
// the app is done (an app quicker than this ends before the supervisor
// starts on this node). A SIGTERM before its signal.Notify kills it (143) and
// fails the Job (backoffLimit 0): the first Job asks for SIGTERM on
// success. The second has the default quit, whose POST may come before
// pilot-agent's status port listens (the supervisor then tries again).
// Every pod must succeed, istio-proxy 0.
func (e *env) quickApps(ctx context.Context, t *testing.T) {
	const parallel = 6
	ns := e.namespace(ctx, t, "quick-apps")
	jobs := []struct {
		name        string
		way         stopWay
		completions int
	}{
		{"quick-apps-term", drain, 12},
		{"quick-apps-quit", quit, 6},
	}
	// One after the other: more pods at once would slow every case's
	// supervisor start beyond what two-apps' 2 s app allows.
	for _, q := range jobs {
		j := newJob(q.name, corev1.RestartPolicyNever, 0, app("app", "sleep 1.$((RANDOM % 10)); exit 0"))
		j.Spec.Template.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/on-success": q.way.env()}
		j.Spec.Completions, j.Spec.Parallelism = ptr.To(int32(q.completions)), ptr.To(int32(parallel))
		e.createJob(ctx, t, ns, j)
		if cond := e.waitJob(ctx, t, ns, q.name, jobLimit); cond.Type != batchv1.JobComplete {
			t.Fatalf("job %s ended %s (%s: %s), want Complete", q.name, cond.Type, cond.Reason, cond.Message)
		}
		pods := e.jobPods(ctx, t, ns, q.name)
		waited := 0
		for _, p := range pods {
			if p.Status.Phase != corev1.PodSucceeded {
				t.Errorf("pod %s is %s, want Succeeded", p.Name, p.Status.Phase)
			}
			wantExit(t, p, "app", 0)
			wantExit(t, p, proxyName, 0)
			if strings.Contains(e.logs(ctx, t, p, supervisorName, false), "sidecar would die of the signal now") {
				waited++
			}
		}
		if len(pods) != q.completions {
			t.Errorf("job %s: %d pods, want %d (none failed)", q.name, len(pods), q.completions)
		}
		t.Logf("job %s: %d pods Succeeded; the supervisor waited for pilot-agent's handler in %d", q.name, len(pods), waited)
	}
}

// unnamedApp matches a summary that names the app by its cgroup's short ID.
var unnamedApp = regexp.MustCompile(`^(?:success|failure): ([0-9a-f]{12}) exit [0-9]+;`)

// millisecondApps: issue 20.3. An app whose whole run takes milliseconds
// (sh -c 'exit N'), via the template (the supervisor first): the
// supervisor adopts the app while the runtime sets its container up (the
// kubelet's mount names it as soon as runc's init has made it), reads its
// exit status and stops istio-proxy at once: exit 0 completes the Job
// (quit), exit 3 fails it (SIGKILL), read through a pidfd, and through
// ptrace (the tracer of runc's init, which then execs the app).
//
// Adoption needs the supervisor to reach its first scan before the app's
// container is gone; with every case at once on two cores its start-up
// took up to 281 ms, as long as such an app's whole container, and 1 pod
// in 12 was missed. A missed app must then cost what it did before, and
// nothing worse: the look of SUPERVISOR_APP_START_TIMEOUT from
// istio-proxy's start, the unknown outcome's SIGTERM, and the pod's
// phase still the app's own exit code. Both are checked; the quiet-node
// rate is k8sbench's quick row.
func (e *env) millisecondApps(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "millisecond-apps")
	jobs := []struct {
		name, script, method string
	}{
		{"ms-ok", "exit 0", "auto"},
		{"ms-fail", "exit 3", "auto"},
		{"ms-ptrace", "exit 3", "ptrace"},
	}
	for _, jb := range jobs {
		j := newJob(jb.name, corev1.RestartPolicyNever, 0, app("app", jb.script))
		if jb.method != "auto" {
			j.Spec.Template.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/exit-status": jb.method}
		}
		e.createJob(ctx, t, ns, j)
	}
	missed := 0
	for _, jb := range jobs {
		cond := e.waitJob(ctx, t, ns, jb.name, jobLimit)
		p := e.onePod(ctx, t, ns, jb.name)
		e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
			supervisorEnv: map[string]string{"SUPERVISOR_APPS": "app", "SUPERVISOR_AFTER_APPS": proxyName}})
		ok := jb.script == "exit 0"
		switch {
		case ok && cond.Type != batchv1.JobComplete, !ok && cond.Type != batchv1.JobFailed:
			t.Fatalf("job %s (%s) ended %s (%s: %s)", jb.name, jb.script, cond.Type, cond.Reason, cond.Message)
		}
		code := int32(0)
		if !ok {
			code = 3
			if p.Status.Phase != corev1.PodFailed {
				t.Errorf("pod %s is %s, want Failed", p.Name, p.Status.Phase)
			}
		}
		app := wantExit(t, p, "app", code)
		if msg := status(t, p, supervisorName).State.Terminated; msg != nil && strings.Contains(msg.Message, "never seen within SUPERVISOR_APP_START_TIMEOUT") {
			// Missed: the look from istio-proxy's start, then the unknown
			// outcome's SIGTERM; pilot-agent exits 0.
			missed++
			t.Logf("pod %s: the app was missed (%s)", p.Name, msg.Message)
			wantExit(t, p, proxyName, 0)
			e.checkSupervisor(ctx, t, p, "unknown: app unknown (never seen within SUPERVISOR_APP_START_TIMEOUT); action SIGTERM",
				logDecision, logStopped, logDone)
			continue
		}
		if d := terminated(t, p, proxyName).FinishedAt.Sub(app.FinishedAt.Time); d > 5*time.Second {
			t.Errorf("pod %s: istio-proxy finished %s after the app, want at once (no look of SUPERVISOR_APP_START_TIMEOUT)", p.Name, d)
		}
		// An app adopted at its last millisecond, its mounts already gone,
		// is known by its cgroup's short ID instead of its name
		// (procscan.Pod.Name): seen once in CI, its status read all the same.
		name := "{app}"
		if msg := status(t, p, supervisorName).State.Terminated; msg != nil {
			if m := unnamedApp.FindStringSubmatch(msg.Message); m != nil {
				name = m[1]
				t.Logf("pod %s: the app was adopted at its exit, unnamed (%s)", p.Name, name)
			}
		}
		if ok {
			e.checkSucceeded(ctx, t, p, []string{"app"}, "success: "+name+" exit 0", quit)
			continue
		}
		wantExit(t, p, proxyName, 137)
		method := logPidfd
		if jb.method == "ptrace" {
			method = logPtrace
		}
		e.checkSupervisor(ctx, t, p, "failure: "+name+" exit 3; action SIGKILL",
			method, logFound, logExited, logDecision, logStopped, logDone)
	}
	t.Logf("%d of %d apps of milliseconds adopted, their statuses read", len(jobs)-missed, len(jobs))
}

// exitThree: the app exits 3 in each of the 2 pods backoffLimit 1 allows; the
// Job fails, and each pod's istio-proxy was SIGKILLed (137).
func (e *env) exitThree(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "exit-three")
	e.createJob(ctx, t, ns, newJob("exit-three", corev1.RestartPolicyNever, 1,
		app("app", "echo working; sleep 10; echo failing; exit 3")))
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
		app := wantExit(t, p, "app", 3)
		proxy := wantExit(t, p, proxyName, 137)
		// SIGKILL at once: no drain.
		if d := proxy.FinishedAt.Sub(app.FinishedAt.Time); d > 3*time.Second {
			t.Errorf("pod %s: istio-proxy killed %s after the app exited, want at once", p.Name, d)
		}
		e.checkSupervisor(ctx, t, p, "failure: {app} exit 3; action SIGKILL",
			logPidfd, logFound, logExited, logDecision, logStopped, logDone)
	}
}

// onFailure: restartPolicy OnFailure, the app fails once (it leaves a marker
// in an emptyDir) and succeeds when the kubelet restarts it in place. The
// proxy must stay up through the restart and be stopped only after success.
func (e *env) onFailure(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "on-failure")
	// The second run waits for the test's go: the first run's end is read
	// meanwhile, while the pod runs (a 1.34 kubelet's status of the
	// completed pod no longer has it; 1.37's does).
	j := newJob("on-failure", corev1.RestartPolicyOnFailure, 2,
		app("app", `if [ -e /state/failed-once ]; then echo "second run: waiting"; until [ -e /state/go ]; do sleep 0.2; done
echo "second run: succeeding"; exit 0; fi
touch /state/failed-once; echo "first run: failing"; sleep 10; exit 1`))
	spec := &j.Spec.Template.Spec
	spec.Volumes = []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "state", MountPath: "/state"}}
	e.createJob(ctx, t, ns, j)
	first := e.waitRestarted(ctx, t, ns, "on-failure", "app")
	if first.ExitCode != 1 {
		t.Fatalf("app's first run exited %d (%s), want 1", first.ExitCode, first.Reason)
	}
	if out, err := e.c.Kubectl(ctx, "exec", "-n", ns, e.onePod(ctx, t, ns, "on-failure").Name, "-c", "app", "--",
		"touch", "/state/go"); err != nil {
		t.Fatalf("tell the second run to succeed: %v\n%s", err, out)
	}
	if cond := e.waitJob(ctx, t, ns, "on-failure", jobLimit); cond.Type != batchv1.JobComplete {
		t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
	}
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

// twoApps: two app containers finishing 6 s apart; istio-proxy is stopped
// only after the second.
func (e *env) twoApps(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "two-apps")
	e.createJob(ctx, t, ns, newJob("two-apps", corev1.RestartPolicyNever, 0,
		app("quick", "echo quick; sleep 10"),
		app("slow", "echo slow; sleep 16")))
	if cond := e.waitJob(ctx, t, ns, "two-apps", jobLimit); cond.Type != batchv1.JobComplete {
		t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
	}
	p := e.onePod(ctx, t, ns, "two-apps")
	e.checkInjected(t, p, shape{apps: []string{"quick", "slow"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_APP_CONTAINERS": "2"}})
	e.checkSucceeded(ctx, t, p, []string{"quick", "slow"}, "success: all 2 app containers exit 0", quit)
	quick, slow := terminated(t, p, "quick"), terminated(t, p, "slow")
	if !quick.FinishedAt.Before(&slow.FinishedAt) {
		t.Errorf("quick finished at %s, not before slow at %s", quick.FinishedAt, slow.FinishedAt)
	}
	proxy := terminated(t, p, proxyName)
	if d := proxy.FinishedAt.Sub(quick.FinishedAt.Time); d < 5*time.Second {
		t.Errorf("istio-proxy finished %s after the quick app, want it running until the slow one was done", d)
	}
}

// control: the same Job as exitZero with the supervisor opted out: istio-proxy
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
	if c := finished(jb); c != nil {
		t.Fatalf("the control Job reached %s without a supervisor", c.Type)
	}
	if jb.Status.Active != 1 {
		t.Errorf("control Job has %d active pods, want 1", jb.Status.Active)
	}
	t.Logf("control: %s after its app exited 0, pod %s is still Running with istio-proxy up and the Job not complete", controlWindow, p.Name)
}

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

// deployJob applies the hand-written deploy/job.yaml as it is: the injector
// adds istio-proxy and leaves the hand-added supervisor alone.
func (e *env) deployJob(ctx context.Context, t *testing.T) {
	var j batchv1.Job
	readDeploy(t, "job.yaml", &j)
	ns := e.namespace(ctx, t, "deploy-job")
	e.createJob(ctx, t, ns, &j)
	if cond := e.waitJob(ctx, t, ns, j.Name, jobLimit); cond.Type != batchv1.JobComplete {
		t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
	}
	p := e.onePod(ctx, t, ns, j.Name)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_STOP_TIMEOUT": "30s", "SUPERVISOR_EXIT_STATUS": "auto"}})
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", quit)
}

// deployJobPtrace applies deploy/job-ptrace.yaml: the supervisor as root with
// SYS_PTRACE and KILL reads the exit status as the app's tracer, under
// containerd's default seccomp profile.
func (e *env) deployJobPtrace(ctx context.Context, t *testing.T) {
	var j batchv1.Job
	readDeploy(t, "job-ptrace.yaml", &j)
	ns := e.namespace(ctx, t, "deploy-job-ptrace")
	e.createJob(ctx, t, ns, &j)
	if cond := e.waitJob(ctx, t, ns, j.Name, jobLimit); cond.Type != batchv1.JobComplete {
		t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
	}
	p := e.onePod(ctx, t, ns, j.Name)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_EXIT_STATUS": "ptrace"}})
	if p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod %s is %s, want Succeeded", p.Name, p.Status.Phase)
	}
	wantExit(t, p, "app", 0)
	wantExit(t, p, proxyName, 0)
	e.checkSupervisor(ctx, t, p, "success: {app} exit 0; action "+quit.action()+"; sidecar stopped",
		logPtrace, logFound, logExited, logDecision, logStopped, logDone)
}

// cronJob: a CronJob scheduled every minute, injected like the Jobs, fires
// for real (the CronJob controller creates the Job at the minute); it is
// suspended as soon as it has, and that one Job must complete.
func (e *env) cronJob(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "cronjob")
	j := newJob("", corev1.RestartPolicyOnFailure, 2, app("app", "date; echo working; sleep 10; echo done"))
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "every-minute"},
		Spec: batchv1.CronJobSpec{
			Schedule:          "* * * * *",
			ConcurrencyPolicy: batchv1.ForbidConcurrent,
			JobTemplate:       batchv1.JobTemplateSpec{Spec: j.Spec},
		},
	}
	p := e.fireOnce(ctx, t, ns, cj)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_RESTART_POLICY": "OnFailure", "SUPERVISOR_APP_CONTAINERS": "1"}})
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", quit)
}

// deployCronJob: deploy/cronjob.yaml with its schedule changed to every
// minute, nothing else; fires once like cronJob.
func (e *env) deployCronJob(ctx context.Context, t *testing.T) {
	var cj batchv1.CronJob
	readDeploy(t, "cronjob.yaml", &cj)
	cj.Spec.Schedule = "* * * * *"
	ns := e.namespace(ctx, t, "deploy-cronjob")
	p := e.fireOnce(ctx, t, ns, &cj)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true,
		supervisorEnv: map[string]string{"SUPERVISOR_RESTART_POLICY": "OnFailure"}})
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", quit)
}

// fireOnce creates the CronJob, waits for its first Job (at most a minute to
// the next minute, plus slack), suspends the CronJob so that it fires no
// more, waits for the Job to complete, and returns its pod.
func (e *env) fireOnce(ctx context.Context, t *testing.T, ns string, cj *batchv1.CronJob) corev1.Pod {
	t.Helper()
	cjs := e.c.Client.BatchV1().CronJobs(ns)
	created, err := cjs.Create(ctx, cj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cronjob %s/%s: %v", ns, cj.Name, err)
	}
	var job batchv1.Job
	err = wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
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
		t.Fatalf("cronjob %s created at %s fired no Job within 90s: %v", cj.Name, created.CreationTimestamp, err)
	}
	if _, err := cjs.Patch(ctx, cj.Name, types.MergePatchType, []byte(`{"spec":{"suspend":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("suspend cronjob %s: %v", cj.Name, err)
	}
	scheduled := job.Annotations[batchv1.CronJobScheduledTimestampAnnotation]
	if scheduled == "" {
		t.Errorf("job %s lacks the %s annotation of a scheduled run", job.Name, batchv1.CronJobScheduledTimestampAnnotation)
	}
	t.Logf("cronjob %s (created %s) fired job %s scheduled at %s", cj.Name, created.CreationTimestamp.Format(time.RFC3339), job.Name, scheduled)
	if cond := e.waitJob(ctx, t, ns, job.Name, jobLimit); cond.Type != batchv1.JobComplete {
		t.Fatalf("job %s ended %s (%s: %s), want Complete", job.Name, cond.Type, cond.Reason, cond.Message)
	}
	// The CronJob controller records the success.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := cjs.Get(ctx, cj.Name, metav1.GetOptions{})
		return err == nil && got.Status.LastSuccessfulTime != nil, nil
	})
	if err != nil {
		t.Errorf("cronjob %s has no lastSuccessfulTime 30s after its job completed: %v", cj.Name, err)
	}
	return e.onePod(ctx, t, ns, job.Name)
}
