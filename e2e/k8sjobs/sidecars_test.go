package k8sjobs

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Issue 21 on the real cluster: the real cloud-sql-proxy v2 (built from the
// Go module proxy, in an image laid out like Google's) next to the real
// pilot-agent that Istio's injector adds, in the pod of
// deploy/job-cloud-sql-proxy.yaml. Under restartPolicy Never a sidecar's
// own exit code decides the pod's phase as much as the app's: the pod is
// Succeeded only if cloud-sql-proxy too exits 0.

const (
	// csqlName is the example's cloud-sql-proxy container, a name the
	// supervisor and the template know (SUPERVISOR_SIDECARS' default).
	csqlName = "cloud-sql-proxy"
	// csqlQuit is its quit endpoint as the example starts it
	// (--quitquitquit, --admin-port=9091).
	csqlQuit = "http://127.0.0.1:9091/quitquitquit"
)

// cloud-sql-proxy's own log lines (cmd/root.go, v2.27.0) for the two ways
// it stops cleanly: its quit endpoint, or SIGTERM, handled.
const (
	csqlQuitLine = "/quitquitquit received request"
	csqlTermLine = "SIGTERM signal received"
)

// csqlCase is one way of running the example's pod.
type csqlCase struct {
	name string
	// template drops the example's hand-added supervisor: the injection
	// template adds its own, which knows cloud-sql-proxy's clean stop from
	// the flags on its command line.
	template bool
	// drop are the example's cloud-sql-proxy flags left out.
	drop []string
	// exit is the app's exit code.
	exit int
	// want
	complete bool             // the Job Complete (else Failed, the pod Failed)
	codes    map[string]int32 // each container's exit code
	summary  string           // the start of the supervisor's termination message
	notes    []string         // what it must also say after that, in any order
	csqlLog  string           // what cloud-sql-proxy says of its stop
	pilot    stopWay          // how pilot-agent was stopped on success
}

// cloudSQLCases are TestJobs' cases of the cloud-sql-proxy example, each
// run by cloudSQL.
func (e *env) cloudSQLCases() []jobCase {
	run := func(c csqlCase) func(context.Context, *testing.T) {
		return func(ctx context.Context, t *testing.T) { e.cloudSQL(ctx, t, c) }
	}
	return []jobCase{
		// deploy/job-cloud-sql-proxy.yaml as it is. The hand-added supervisor
		// stops cloud-sql-proxy by its quit endpoint (SUPERVISOR_SIDECAR_ACTIONS)
		// and istio-proxy by the binary's default on success, SIGTERM:
		// pilot-agent drains, then exits 0.
		{"cloud-sql-proxy example, exit 0 completes", run(csqlCase{name: "csql-example", complete: true,
			codes:   map[string]int32{"app": 0, csqlName: 0, proxyName: 0},
			summary: "success: {app} exit 0; action SIGTERM (cloud-sql-proxy: POST " + csqlQuit + "); sidecar stopped",
			csqlLog: csqlQuitLine, pilot: drain})},
		// backoffLimit 0: the pod and the Job fail. cloud-sql-proxy keeps its
		// own action (its quit, exit 0); istio-proxy gets the failure's SIGKILL.
		{"cloud-sql-proxy example, exit 3 fails", run(csqlCase{name: "csql-example-fails", exit: 3,
			codes:   map[string]int32{"app": 3, csqlName: 0, proxyName: 137},
			summary: "failure: {app} exit 3; action SIGKILL (cloud-sql-proxy: POST " + csqlQuit + "); sidecar stopped",
			csqlLog: csqlQuitLine})},
		// The example's pod without its supervisor: the template's reads
		// --quitquitquit and --admin-port on cloud-sql-proxy's command line and
		// quits it there; pilot-agent gets the template's quit.
		{"cloud-sql-proxy via the template, its quitquitquit", run(csqlCase{name: "csql-template-quit", template: true, complete: true,
			codes:   map[string]int32{"app": 0, csqlName: 0, proxyName: 0},
			summary: "success: {app} exit 0; action POST " + quitURL + " (cloud-sql-proxy: POST " + csqlQuit + "); sidecar stopped",
			csqlLog: csqlQuitLine, pilot: quit})},
		// Without --quitquitquit: SIGTERM, which --exit-zero-on-sigterm makes exit 0.
		{"cloud-sql-proxy via the template, SIGTERM with exit-zero-on-sigterm", run(csqlCase{name: "csql-template-term", template: true, complete: true,
			drop:    []string{"--quitquitquit"},
			codes:   map[string]int32{"app": 0, csqlName: 0, proxyName: 0},
			summary: "success: {app} exit 0; action POST " + quitURL + " (cloud-sql-proxy: SIGTERM); sidecar stopped",
			csqlLog: csqlTermLine, pilot: quit})},
		// With neither flag cloud-sql-proxy exits 143 on the SIGTERM, which
		// fails the pod however the app did; the summary says so and how to fix it.
		{"cloud-sql-proxy via the template, SIGTERM without it exits 143", run(csqlCase{name: "csql-template-143", template: true,
			drop:    []string{"--quitquitquit", "--exit-zero-on-sigterm"},
			codes:   map[string]int32{"app": 0, csqlName: 143, proxyName: 0},
			summary: "success: {app} exit 0; action POST " + quitURL + " (cloud-sql-proxy: SIGTERM); ",
			notes: []string{"; cloud-sql-proxy exited 143: the pod will be Failed; start it with --exit-zero-on-sigterm or --quitquitquit",
				"; sidecar stopped"},
			csqlLog: csqlTermLine, pilot: quit})},
		{"cloud-sql-proxy via the template, exit 3 fails", run(csqlCase{name: "csql-template-fails", template: true, exit: 3,
			codes:   map[string]int32{"app": 3, csqlName: 0, proxyName: 137},
			summary: "failure: {app} exit 3; action SIGKILL (cloud-sql-proxy: POST " + csqlQuit + "); sidecar stopped",
			csqlLog: csqlQuitLine})},
	}
}

// csqlJob is deploy/job-cloud-sql-proxy.yaml changed as c says, runnable
// offline.
func (e *env) csqlJob(t *testing.T, c csqlCase) *batchv1.Job {
	t.Helper()
	image, err := e.cloudSQLImage()
	if err != nil {
		t.Fatalf("cloud-sql-proxy image: %v", err)
	}
	var j batchv1.Job
	readDeploy(t, "job-cloud-sql-proxy.yaml", &j)
	j.Name = c.name
	spec := &j.Spec.Template.Spec
	csql := findContainer(*spec, csqlName)
	if csql == nil {
		t.Fatalf("deploy/job-cloud-sql-proxy.yaml has no container %s", csqlName)
	}
	// The image is imported under the example's name, at the version
	// built; the example's tag must follow CLOUD_SQL_PROXY_VERSION.
	if csql.Image != image {
		t.Fatalf("deploy/job-cloud-sql-proxy.yaml runs %s, the cluster has %s: keep its tag and CLOUD_SQL_PROXY_VERSION (e2e/versions.env) in step", csql.Image, image)
	}
	for _, f := range c.drop {
		if !slices.Contains(csql.Args, f) {
			t.Fatalf("deploy/job-cloud-sql-proxy.yaml's cloud-sql-proxy has no flag %s to leave out: %v", f, csql.Args)
		}
		csql.Args = slices.DeleteFunc(csql.Args, func(a string) bool { return a == f })
	}
	// No Google credentials here: a token stands in for the service
	// account's, and the instance is looked up only when a client
	// connects (none does). Environment variables (CSQL_PROXY_<FLAG>), so
	// that the command line the supervisor reads is the example's.
	csql.Env = append(csql.Env,
		corev1.EnvVar{Name: "CSQL_PROXY_TOKEN", Value: "e2e-stand-in"},
		corev1.EnvVar{Name: "CSQL_PROXY_LAZY_REFRESH", Value: "true"})
	if c.template {
		spec.Containers = slices.DeleteFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == supervisorName })
	}
	if c.exit != 0 || !c.complete {
		// One pod: a failure is final.
		j.Spec.BackoffLimit = ptr.To(int32(0))
	}
	if c.exit != 0 {
		app := findContainer(*spec, "app")
		app.Command = []string{"sh", "-c", "echo working; echo failing; exit " + strconv.Itoa(c.exit)}
	}
	// The app ends once the supervisor has found it (cloudSQL releases it).
	gate(t, spec, "app")
	return &j
}

// cloudSQL runs the example's pod as c says and checks how it ended.
func (e *env) cloudSQL(ctx context.Context, t *testing.T, c csqlCase) {
	j := e.csqlJob(t, c)
	ns := e.namespace(ctx, t, c.name)
	// The example's pod runs as its own service account (for Workload
	// Identity); the pod is not created without it.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: j.Spec.Template.Spec.ServiceAccountName}}
	if _, err := e.c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account %s/%s: %v", ns, sa.Name, err)
	}
	e.createJob(ctx, t, ns, j)
	e.release(ctx, t, e.nthPod(ctx, t, ns, c.name, 1), "app", 1)
	cond := e.waitJob(ctx, t, ns, c.name, jobLimit)
	wantPhase := corev1.PodSucceeded
	if c.complete {
		if cond.Type != batchv1.JobComplete {
			t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
		}
	} else {
		wantPhase = corev1.PodFailed
		if cond.Type != batchv1.JobFailed || cond.Reason != batchv1.JobReasonBackoffLimitExceeded {
			t.Fatalf("job ended %s (%s: %s), want Failed (BackoffLimitExceeded)", cond.Type, cond.Reason, cond.Message)
		}
	}
	p := e.onePod(ctx, t, ns, c.name)
	// The pod's own containers come before the supervisor (the template
	// puts its own there; the example has it there by hand).
	want := shape{apps: []string{"app", csqlName}, supervisor: true}
	if c.template {
		// The template does not count cloud-sql-proxy as an app.
		want.supervisorEnv = map[string]string{"SUPERVISOR_APPS": "app", "SUPERVISOR_APP_CONTAINERS": "1", "SUPERVISOR_ON_SUCCESS": quitURL}
	}
	e.checkInjected(t, p, want)
	if p.Status.Phase != wantPhase {
		t.Errorf("pod %s is %s, want %s", p.Name, p.Status.Phase, wantPhase)
	}
	for name, code := range c.codes {
		wantExit(t, p, name, code)
		if s := status(t, p, name); s.RestartCount != 0 {
			t.Errorf("pod %s: %s restarted %d times", p.Name, name, s.RestartCount)
		}
	}
	// Stopped cleanly (the line comes from its handler: not killed by a
	// signal it had not caught yet).
	if log := e.logs(ctx, t, p, csqlName, false); !strings.Contains(log, c.csqlLog) {
		t.Errorf("pod %s: cloud-sql-proxy's log lacks %q:\n%s", p.Name, c.csqlLog, log)
	}
	if c.complete || c.exit == 0 {
		pilot := e.logs(ctx, t, p, proxyName, false)
		switch c.pilot {
		case quit:
			inOrderLines(t, p, proxyName, pilot, pilotQuit, pilotNoDrain)
		case drain:
			inOrderLines(t, p, proxyName, pilot, pilotDrainLine)
		}
	}
	e.checkSupervisor(ctx, t, p, c.summary, logPidfd, logFound, logExited, logDecision, logStopped, logDone)
	msg := terminated(t, p, supervisorName).Message
	for _, n := range c.notes {
		if !strings.Contains(msg, n) {
			t.Errorf("pod %s: supervisor termination message %q, want it to say %q", p.Name, msg, n)
		}
	}
}
