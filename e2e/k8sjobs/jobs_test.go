package k8sjobs

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// An app that must be seen by the supervisor before it ends is gated
// (gate_test.go): it works until the supervisor has logged it, however
// long the kubelet takes to start the supervisor beside it on a node
// running every case at once. An app of milliseconds is a case of its own
// (millisecondApps), and so are quick apps (quickApps).
const (
	// jobLimit bounds a Job's run, and each wait for an event of it: a
	// hang guard. The expected path (image already on the node, pilot-agent's
	// 5 s drain, the kubelet's back-offs of 10 and 20 s, a 60 s restart
	// margin) takes a fraction of it on two cores shared by every case.
	jobLimit = 10 * time.Minute
	// controlWindow is how long the Job without the supervisor is watched
	// staying Running after its app has exited.
	controlWindow = 60 * time.Second
	// pilotDrain is pilot-agent's terminationDrainDuration (5 s by
	// default): on SIGTERM it drains envoy that long before it exits 0.
	pilotDrain = 5 * time.Second
	// quitURL is pilot-agent's quit endpoint on Istio's default status
	// port, the template's and deploy/'s action on success.
	quitURL = "http://127.0.0.1:15020/quitquitquit"
)

// TestJobs runs Jobs and CronJobs injected by Istio's own injector with our
// template on a real one-node Kubernetes, and checks what the Job controller
// and the kubelet make of them. The cases run in parallel, each in its own
// namespace; and beside TestAdmission's.
func TestJobs(t *testing.T) {
	t.Parallel()
	// Under test.sh's -timeout 80m, so that a hang fails here, with the
	// cases' own messages.
	ctx, cancel := context.WithTimeout(context.Background(), 70*time.Minute)
	defer cancel()
	e := setUp(ctx, t, "k8sjobs")
	t0 := time.Now()
	t.Run("cases", func(t *testing.T) {
		for _, tc := range append([]jobCase{
			{"exit 0 completes", func(ctx context.Context, t *testing.T) { e.succeed(ctx, t, "exit-zero", quit, false) }},
			{"exit 0, on-success SIGTERM: pilot-agent drains", func(ctx context.Context, t *testing.T) { e.succeed(ctx, t, "exit-zero-drain", drain, false) }},
			{"exit 0, holdApplicationUntilProxyStarts: istio-proxy first", func(ctx context.Context, t *testing.T) { e.succeed(ctx, t, "exit-zero-hold", quit, true) }},
			{"standby, OnFailure: the leader killed", func(ctx context.Context, t *testing.T) { e.standby(ctx, t, false) }},
			{"standby, native: the leader killed", func(ctx context.Context, t *testing.T) { e.standby(ctx, t, true) }},
			{"quick apps as istio-proxy starts", e.quickApps},
			{"apps of milliseconds", e.millisecondApps},
			{"native sidecar of its own", e.nativeSidecarOfItsOwn},
			{"ephemeral container left running", e.ephemeralLeftRunning},
			{"OnFailure two apps, one failing twice", e.onFailureTwoApps},
			{"hostPID and unshared pods admitted", e.notShared},
			{"OnFailure, status unknown, success on the first try", func(ctx context.Context, t *testing.T) { e.onFailureUnknown(ctx, t, "unknown-first-try", 0) }},
			{"OnFailure, status unknown, two failures", func(ctx context.Context, t *testing.T) { e.onFailureUnknown(ctx, t, "unknown-twice", 2) }},
			{"exit 3 fails, proxy killed", e.exitThree},
			{"OnFailure retry keeps the proxy", e.onFailure},
			{"two apps", e.twoApps},
			{"control: no supervisor stays Running", e.control},
			{"deploy/job.yaml", e.deployJob},
			{"deploy/job-ptrace.yaml", e.deployJobPtrace},
			{"deploy/cronjob.yaml fires", e.deployCronJob},
			{"the kubelet rewrites a running container's /etc/hosts", e.hostsRewritten},
		}, e.cloudSQLCases()...) {
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

// jobCase is one of TestJobs' cases: its name and what it runs.
type jobCase struct {
	name string
	run  func(context.Context, *testing.T)
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
	e.pinHosts(ctx, t, ns, &j.Spec.Template.Spec)
	if _, err := e.c.Client.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job %s/%s: %v", ns, j.Name, err)
	}
}

// The supervisor's log messages the cases look for.
const (
	logPidfd  = "exit statuses read with pidfd (PIDFD_INFO_EXIT)"
	logPtrace = "exit statuses read with ptrace"
	// Process accounting goes through istio-proxy's mount of the state
	// volume (exit-status ptrace: root with SYS_PTRACE).
	logAnchored = "accounting goes through the sidecar's mount of the state directory: it records the apps' ends even while no supervisor runs"
	// Discovery found istio-proxy's pilot-agent while the apps ran.
	logSidecarFound = "sidecar found"
	logFound        = "app found"
	logExited       = "app exited"
	logDecision     = "decision"
	logStopped      = "sidecar stopped"
	// The end of a wait for pilot-agent's handler (supervisor/handler.go).
	logHandled = "sidecar handles the signal now"
	logDone    = "done"
	logRetry   = "app failed under restartPolicy OnFailure: the kubelet restarts it, the sidecar stays up"
	logNewApp  = "app restarted by the kubelet: watching the new container"
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
		// Its own log says it drained. The containers' finish times are
		// not a measure of it: the runtime records an exit when it
		// handles it, late on a loaded node (a warm CI run saw 3 s for
		// the 5 s drain), so they are logged, not bounded.
		inOrderLines(t, p, proxyName, pilot, pilotDrainLine)
		t.Logf("pod %s: istio-proxy finished %s after the last app (pilot-agent drains %s on SIGTERM)", p.Name, proxy.FinishedAt.Sub(last), pilotDrain)
	}
	return e.checkSupervisor(ctx, t, p, summary, logPidfd, logFound, logExited, logDecision, logStopped, logDone)
}

// succeed runs a Job whose app exits 0, its supervisor told to stop
// istio-proxy the given way (quit: no annotation, the template's default;
// drain: on-success SIGTERM, the binary's own default, on which
// pilot-agent drains, then exits 0); with proxyFirst, under Istio's
// holdApplicationUntilProxyStarts. The Job completes.
func (e *env) succeed(ctx context.Context, t *testing.T, name string, way stopWay, proxyFirst bool) {
	ns := e.namespace(ctx, t, name)
	j := newJob(name, corev1.RestartPolicyNever, 0, app("app", "echo working; echo done"))
	gate(t, &j.Spec.Template.Spec, "app")
	annotations := map[string]string{}
	if way == drain {
		annotations["supervisor.sidecar-supervisor.io/on-success"] = "SIGTERM"
	}
	if proxyFirst {
		// The injector puts istio-proxy first, its postStart holding the
		// app until the proxy is ready, and the supervisor last.
		annotations["proxy.istio.io/config"] = `{"holdApplicationUntilProxyStarts": true}`
	}
	j.Spec.Template.Annotations = annotations
	e.createJob(ctx, t, ns, j)
	e.release(ctx, t, e.nthPod(ctx, t, ns, name, 1), "app", 1)
	e.waitComplete(ctx, t, ns, name)
	p := e.onePod(ctx, t, ns, name)
	e.checkInjected(t, p, shape{apps: []string{"app"}, supervisor: true, proxyFirst: proxyFirst,
		supervisorEnv: map[string]string{"SUPERVISOR_RESTART_POLICY": "Never", "SUPERVISOR_APP_CONTAINERS": "1",
			"SUPERVISOR_APPS": "app", "SUPERVISOR_ON_SUCCESS": way.env()}})
	if c := findContainer(p.Spec, proxyName); proxyFirst && (c == nil || c.Lifecycle == nil || c.Lifecycle.PostStart == nil ||
		c.Lifecycle.PostStart.Exec == nil || !slices.Contains(c.Lifecycle.PostStart.Exec.Command, "wait")) {
		t.Errorf("pod %s: istio-proxy has no postStart `pilot-agent wait` holding the app", p.Name)
	}
	e.checkSucceeded(ctx, t, p, []string{"app"}, "success: {app} exit 0", way)
}

// pinHosts gives each cloud-sql-proxy container of spec an /etc/hosts of
// its own, from a ConfigMap of the namespace, in place of the kubelet's.
//
// cloud-sql-proxy resolves "localhost" as it starts (its admin server,
// where /quitquitquit is served, listens on localhost:9091, a name its
// code fixes). The kubelet's /etc/hosts is one file per pod, bind-mounted
// into each container, and the kubelet writes it again, truncating it
// first (os.WriteFile in ensureHostsFile, pkg/kubelet/kubelet_pods.go), as
// it starts each container: cloud-sql-proxy, started just before
// istio-proxy and the supervisor, now and then read it empty, and Go's
// resolver asked DNS. A cluster's DNS answers "localhost"; this test
// cluster has none (the pods' resolver is the node's 127.0.0.1:53), so
// cloud-sql-proxy ended at start with "lookup localhost on 127.0.0.1:53:
// connection refused", in about 1 package run in 7. A container that
// mounts /etc/hosts itself gets no kubelet hosts file (makeMounts), so
// this one is never rewritten. The manifests under test are unchanged but
// for this mount; the pods their users run have the cluster's DNS.
func (e *env) pinHosts(ctx context.Context, t *testing.T, ns string, spec *corev1.PodSpec) {
	t.Helper()
	pinned := false
	for i := range spec.Containers {
		if strings.Contains(spec.Containers[i].Image, "cloud-sql-proxy") {
			pinHostsOf(spec, i)
			pinned = true
		}
	}
	if pinned {
		e.hostsConfigMap(ctx, t, ns)
	}
}

// hostsName names the ConfigMap, its volume and key of pinHosts.
const hostsName = "e2e-etc-hosts"

// hostsContent is the pinned /etc/hosts.
const hostsContent = "127.0.0.1\tlocalhost\n::1\tlocalhost\n"

// pinHostsOf mounts the pinned /etc/hosts into spec's i-th container.
func pinHostsOf(spec *corev1.PodSpec, i int) {
	c := &spec.Containers[i]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: hostsName, MountPath: "/etc/hosts", SubPath: "hosts", ReadOnly: true})
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == hostsName }) {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: hostsName, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: hostsName}}}})
	}
}

// hostsConfigMap creates the pinned /etc/hosts's ConfigMap in ns.
func (e *env) hostsConfigMap(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: hostsName}, Data: map[string]string{"hosts": hostsContent}}
	if _, err := e.c.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create configmap %s/%s: %v", ns, hostsName, err)
	}
}
