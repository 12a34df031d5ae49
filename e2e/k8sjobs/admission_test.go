package k8sjobs

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

// Issue 30 on the real cluster: deploy/admission's MutatingAdmissionPolicy,
// which the API server applies itself, adds the supervisor to Job pods
// whatever adds their sidecar: a webhook (the tests' own vault-k8s- and
// Dapr-shaped injectors, and Istio's injector serving only its own sidecar
// template), or the pod spec itself (the real cloud-sql-proxy). The policy
// runs before the webhooks and once more after them; what it adds stays.
//
// The policy is deploy/admission/policy.yaml as it is but for its name,
// and its binding selects only this run's namespaces: the cluster is
// shared. The files as shipped are created with dryRun=All, as `kubectl
// apply --dry-run=server -f deploy/admission/` creates them.

const (
	// admissionLimit bounds a Job's run here: jobLimit's, plus an init
	// container and a sidecar more to start on two loaded cores.
	admissionLimit = 5 * time.Minute
	// admissionOwner labels the policy and binding a run creates, so that
	// the next run removes those a killed one left.
	admissionOwner = "sidecar-supervisor-e2e/owner"
)

// admissionEnv is what the admission cases share besides env.
type admissionEnv struct {
	*env
	// standIns is the image of podsim's stand-ins for the Vault agent and
	// daprd; injectors, the webhook that adds them, served as hook.
	standIns  string
	injectors *sidecarInjectors
	hook      *injector.Served
	// policyLabel=policyValue selects the namespaces the policy is bound to.
	policyLabel, policyValue string
	// shipped holds the policy's files for the server's API version, as
	// they are, each with its resource and file name.
	shipped []shippedObject
}

type shippedObject struct {
	file string
	obj  *unstructured.Unstructured
	res  dynamic.ResourceInterface
}

// TestAdmission runs Jobs whose pods get the supervisor from the admission
// policy on the one-node cluster, and pods the policy must leave alone.
func TestAdmission(t *testing.T) {
	// Beside TestJobs: both spend their time waiting for the cluster.
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	a := setUpAdmission(ctx, t, setUp(ctx, t, "k8sjobs-admission"))
	t0 := time.Now()
	t.Run("deploy/admission created with dryRun=All", a.applyDryRun)
	t.Run("left alone", a.leftAlone)
	t.Run("jobs", func(t *testing.T) {
		for _, jc := range admissionJobs() {
			t.Run(jc.name, func(t *testing.T) {
				t.Parallel()
				t1 := time.Now()
				a.runJob(ctx, t, jc)
				t.Logf("case done in %s", time.Since(t1).Round(time.Second))
			})
		}
	})
	t.Logf("all admission cases done in %s", time.Since(t0).Round(time.Second))
}

// setUpAdmission builds and imports the stand-ins' image, serves the tests'
// injectors as a webhook (reinvocationPolicy IfNeeded: the API server calls
// it again after the policy's change, the worst case for what the policy
// adds) and installs the policy for this run's namespaces.
func setUpAdmission(ctx context.Context, t *testing.T, e *env) *admissionEnv {
	t.Helper()
	a := &admissionEnv{env: e}
	var err error
	if a.standIns, err = e.c.StandInsImage(ctx); err != nil {
		t.Fatal(err)
	}
	a.injectors = &sidecarInjectors{image: a.standIns}
	a.hook, err = injector.ServeWebhook(ctx, e.c.Client, a.injectors, injector.Registration{
		Owner: "k8sjobs", Name: "sidecar-injectors", ReinvocationPolicy: admissionregistrationv1.IfNeededReinvocationPolicy,
	}, log.New(testWriter{t}, "sidecar injectors: ", 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.hook.Close(); err != nil {
			t.Error(err)
		}
	})
	a.installPolicy(ctx, t)
	return a
}

// installPolicy creates deploy/admission's policy and binding, renamed for
// the run, the binding narrowed to the namespaces labelled with the run's
// value; they are deleted at cleanup. It takes the files of the API version
// the server serves: v1 (1.36+), else v1beta1 (1.34, 1.35 with the feature
// gate, as e2e/scripts/cluster-up.sh starts them).
func (a *admissionEnv) installPolicy(ctx context.Context, t *testing.T) {
	t.Helper()
	version, dir := a.policyVersion(t)
	dyn, err := dynamic.NewForConfig(a.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	gv := schema.GroupVersion{Group: "admissionregistration.k8s.io", Version: version}
	policies := dyn.Resource(gv.WithResource("mutatingadmissionpolicies"))
	bindings := dyn.Resource(gv.WithResource("mutatingadmissionpolicybindings"))
	sel := metav1.ListOptions{LabelSelector: admissionOwner + "=k8sjobs"}
	if err := bindings.DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Fatalf("remove old bindings: %v", err)
	}
	if err := policies.DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Fatalf("remove old policies: %v", err)
	}
	var p, b unstructured.Unstructured
	for _, f := range []struct {
		name string
		obj  *unstructured.Unstructured
	}{{"policy.yaml", &p}, {"binding.yaml", &b}} {
		raw, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(raw, &f.obj.Object); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if f.obj.GetAPIVersion() != gv.String() {
			t.Fatalf("%s is %s, want %s", f.name, f.obj.GetAPIVersion(), gv)
		}
	}
	a.shipped = []shippedObject{
		{filepath.Join(dir, "policy.yaml"), p.DeepCopy(), policies},
		{filepath.Join(dir, "binding.yaml"), b.DeepCopy(), bindings},
	}
	a.policyLabel, a.policyValue = "sidecar-supervisor-e2e/k8sjobs-policy", a.hook.Value
	name := p.GetName() + "-e2e-" + a.policyValue
	for _, o := range []*unstructured.Unstructured{&p, &b} {
		o.SetName(name)
		l := o.GetLabels()
		l[admissionOwner] = "k8sjobs"
		o.SetLabels(l)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(b.Object, "spec", "matchResources"); found {
		t.Fatalf("%s/binding.yaml narrows the policy: the test expects a binding for every namespace", dir)
	}
	if err := unstructured.SetNestedField(b.Object, name, "spec", "policyName"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedStringMap(b.Object, map[string]string{a.policyLabel: a.policyValue},
		"spec", "matchResources", "namespaceSelector", "matchLabels"); err != nil {
		t.Fatal(err)
	}
	if _, err := policies.Create(ctx, &p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the policy: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, err := range []error{
			bindings.Delete(ctx, name, metav1.DeleteOptions{}),
			policies.Delete(ctx, name, metav1.DeleteOptions{}),
		} {
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("remove the policy: %v", err)
			}
		}
	})
	if _, err := bindings.Create(ctx, &b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the binding: %v", err)
	}
	t.Logf("policy %s (%s) bound to namespaces labelled %s=%s; sidecar injectors at %s", name, gv, a.policyLabel, a.policyValue, a.hook.URL)
}

// policyVersion is the API version of MutatingAdmissionPolicy the server
// serves, and the directory of deploy/admission's files for it.
func (a *admissionEnv) policyVersion(t *testing.T) (version, dir string) {
	t.Helper()
	deploy := filepath.Join("..", "..", "deploy", "admission")
	for _, v := range []struct{ version, dir string }{{"v1", deploy}, {"v1beta1", filepath.Join(deploy, "v1beta1")}} {
		l, err := a.c.Client.Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/" + v.version)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if r.Name == "mutatingadmissionpolicies" {
				return v.version, v.dir
			}
		}
	}
	t.Fatal("the API server serves no MutatingAdmissionPolicy (Kubernetes 1.36+, or 1.34-1.35 with its feature gate and admissionregistration.k8s.io/v1beta1)")
	return "", ""
}

// applyDryRun: the files as shipped are valid for this API server, CEL
// included (it compiles every expression when they are written), and carry
// no field it does not know: each is created as `kubectl apply
// --dry-run=server` creates it (dryRun=All, fieldValidation=Strict).
func (a *admissionEnv) applyDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range a.shipped {
		got, err := s.res.Create(ctx, s.obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		if err != nil {
			t.Errorf("%s, created with dryRun=All: %v", s.file, err)
			continue
		}
		if got.GetName() != s.obj.GetName() || got.GetKind() != s.obj.GetKind() {
			t.Errorf("%s, created with dryRun=All: the server answered with %s %s, want %s %s", s.file, got.GetKind(), got.GetName(), s.obj.GetKind(), s.obj.GetName())
		}
	}
}

// nsOpts say what a case's namespace is under.
type nsOpts struct {
	// istio: Istio's injector (with our template too, which pods turn off
	// with inject.istio.io/templates: sidecar).
	istio bool
	// policy: the admission policy; the tests' injectors always.
	policy bool
}

// namespace creates a namespace for a case under the tests' injectors, and
// under Istio's injector and the policy as o says; it returns once each
// takes effect.
func (a *admissionEnv) namespace(ctx context.Context, t *testing.T, prefix string, o nsOpts) string {
	t.Helper()
	ns := a.c.Namespace(ctx, t, prefix)
	a.c.DumpOnFailure(t, ns, "")
	if o.istio {
		if err := a.env.hook.PrepareNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	daprProbe := jobPodProbe(appContainer())
	daprProbe.Annotations = map[string]string{"dapr.io/enabled": "true", "dapr.io/app-id": "probe"}
	if err := a.hook.Select(ctx, ns, daprProbe, func(p *corev1.Pod) bool { return injector.HasContainer(p.Spec, "daprd") }); err != nil {
		t.Fatal(err)
	}
	if !o.policy {
		return ns
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, a.policyLabel, a.policyValue)
	if _, err := a.c.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label namespace %s: %v", ns, err)
	}
	// A pod with a sidecar of its own, none from Istio: its supervisor can
	// come from the policy alone.
	probe := jobPodProbe(appContainer(), corev1.Container{Name: "cloud-sql-proxy", Image: "busybox"})
	if err := injector.WaitDryRun(ctx, a.c.Client, ns, probe, func(p *corev1.Pod) bool { return injector.HasContainer(p.Spec, supervisorName) }); err != nil {
		t.Fatalf("the policy does not serve %s: %v", ns, err)
	}
	return ns
}

// jobPodProbe is a pod as the Job controller would create it (owned by a
// Job; nothing checks that it exists), kept out of Istio's injector.
func jobPodProbe(cs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "probe",
			Labels: map[string]string{"sidecar.istio.io/inject": "false"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "probe",
				UID: "0b4b3c36-5f0c-4c3e-9d1a-2a5f9a7b1c01", Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: cs},
	}
}

func appContainer() corev1.Container {
	return corev1.Container{Name: "app", Image: "busybox:1.37", Command: []string{"true"}}
}

// Sidecar shapes of the Job cases.
const (
	shapeDapr  = "daprd"                 // Dapr's injector (the tests' webhook)
	shapeVault = vaultAgent              // vault-k8s (the tests' webhook)
	shapeCSQL  = csqlName                // written into the pod (the real cloud-sql-proxy)
	shapeIstio = injector.ProxyContainer // Istio's injector, its sidecar template alone
)

// admissionJob is one Job case.
type admissionJob struct {
	name    string
	sidecar string // one of the shapes
	restart corev1.RestartPolicy
	// exit is the app's exit code under Never; under OnFailure the app
	// fails once (exit 1), then succeeds.
	exit int
	// cron: the Job comes from a CronJob.
	cron bool
}

// admissionJobs: each sidecar under Never (success, failure) and OnFailure
// (a failed run restarted in place, then success); Istio under Never; a
// CronJob.
func admissionJobs() []admissionJob {
	var jobs []admissionJob
	for _, s := range []string{shapeDapr, shapeVault, shapeCSQL} {
		jobs = append(jobs,
			admissionJob{name: s + ", Never, exit 0", sidecar: s, restart: corev1.RestartPolicyNever},
			admissionJob{name: s + ", Never, exit 3", sidecar: s, restart: corev1.RestartPolicyNever, exit: 3},
			admissionJob{name: s + ", OnFailure, a failure then exit 0", sidecar: s, restart: corev1.RestartPolicyOnFailure})
	}
	return append(jobs,
		admissionJob{name: "istio-proxy, Never, exit 0", sidecar: shapeIstio, restart: corev1.RestartPolicyNever},
		admissionJob{name: "istio-proxy, Never, exit 3", sidecar: shapeIstio, restart: corev1.RestartPolicyNever, exit: 3},
		admissionJob{name: "daprd, CronJob, OnFailure", sidecar: shapeDapr, restart: corev1.RestartPolicyOnFailure, cron: true})
}

// slug is a case's name as Kubernetes names allow.
var notName = regexp.MustCompile(`[^a-z0-9]+`)

func slug(s string) string {
	s = strings.Trim(notName.ReplaceAllString(strings.ToLower(s), "-"), "-")
	return s[:min(len(s), 40)]
}

// job builds the case's Job: busybox's app, the sidecar asked for as users
// ask for it, nothing about the supervisor.
func (a *admissionEnv) job(t *testing.T, jc admissionJob) *batchv1.Job {
	t.Helper()
	name := slug(jc.name)
	script := "echo working; sleep 10; echo done"
	switch {
	case jc.restart == corev1.RestartPolicyOnFailure:
		script = `if [ -e /state/failed-once ]; then echo "second run: succeeding"; sleep 2; exit 0; fi
touch /state/failed-once; echo "first run: failing"; sleep 10; exit 1`
	case jc.exit != 0:
		script = fmt.Sprintf("echo working; sleep 10; echo failing; exit %d", jc.exit)
	}
	var j *batchv1.Job
	switch jc.sidecar {
	case shapeCSQL:
		// deploy/job-cloud-sql-proxy.yaml without its supervisor.
		j = a.csqlJob(t, csqlCase{name: name, template: true, complete: true})
		findContainer(j.Spec.Template.Spec, "app").Command = []string{"sh", "-c", script}
	default:
		j = newJob(name, jc.restart, 0, app("app", script))
		tmpl := &j.Spec.Template
		tmpl.Labels = nil
		tmpl.Annotations = map[string]string{}
		switch jc.sidecar {
		case shapeDapr:
			tmpl.Annotations["dapr.io/enabled"] = "true"
			tmpl.Annotations["dapr.io/app-id"] = name
			tmpl.Annotations["dapr.io/http-port"] = "3500"
		case shapeVault:
			tmpl.Annotations[vaultPrefix+"agent-inject"] = "true"
			tmpl.Annotations[vaultPrefix+"role"] = "e2e"
			tmpl.Annotations[vaultPrefix+"agent-inject-secret-db"] = "secret/data/e2e/db"
			c := &tmpl.Spec.Containers[0]
			c.Command = []string{"sh", "-c", "test -s " + vaultSecretsPath + "/db; " + script}
		case shapeIstio:
			tmpl.Labels = map[string]string{"sidecar.istio.io/inject": "true"}
			tmpl.Annotations["inject.istio.io/templates"] = "sidecar"
		}
	}
	spec := &j.Spec.Template.Spec
	spec.RestartPolicy = jc.restart
	j.Spec.BackoffLimit = ptr.To(int32(0))
	if jc.restart == corev1.RestartPolicyOnFailure {
		j.Spec.BackoffLimit = ptr.To(int32(2))
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		c := findContainer(*spec, "app")
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "state", MountPath: "/state"})
	}
	return j
}

// sidecarLog is what each sidecar logs of its clean stop.
var sidecarLog = map[string]string{
	shapeDapr:  "stop POST /v1.0/shutdown", // podsim's record
	shapeVault: "stop POST /agent/v1/quit",
	shapeCSQL:  csqlQuitLine,
	shapeIstio: pilotQuit,
}

// sidecarStop is how the supervisor's summary names each sidecar's stop
// after the outcome's action.
var sidecarStop = map[string]string{
	shapeDapr:  " (daprd: POST http://127.0.0.1:3500/v1.0/shutdown)",
	shapeVault: " (vault-agent: POST http://127.0.0.1:8200/agent/v1/quit)",
	shapeCSQL:  " (cloud-sql-proxy: POST " + csqlQuit + ")",
	shapeIstio: "",
}

// runJob runs the case's Job in a namespace of its own and checks the end:
// the Job's condition, the pod as the policy made it, every container's
// exit, the sidecar's clean stop, the supervisor's summary, and for
// sidecars from a webhook, the API server's second call of it.
func (a *admissionEnv) runJob(ctx context.Context, t *testing.T, jc admissionJob) {
	j := a.job(t, jc)
	ns := a.namespace(ctx, t, slug(jc.name), nsOpts{istio: jc.sidecar == shapeIstio, policy: true})
	if sa := j.Spec.Template.Spec.ServiceAccountName; sa != "" {
		if _, err := a.c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create service account %s/%s: %v", ns, sa, err)
		}
	}
	ok := jc.exit == 0
	var p corev1.Pod
	if jc.cron {
		cj := &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Name: j.Name},
			Spec: batchv1.CronJobSpec{Schedule: "* * * * *", ConcurrencyPolicy: batchv1.ForbidConcurrent,
				JobTemplate: batchv1.JobTemplateSpec{Spec: j.Spec}},
		}
		p = a.fireOnce(ctx, t, ns, cj)
	} else {
		a.createJob(ctx, t, ns, j)
		cond := a.waitJob(ctx, t, ns, j.Name, admissionLimit)
		switch {
		case ok && cond.Type != batchv1.JobComplete:
			t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
		case !ok && (cond.Type != batchv1.JobFailed || cond.Reason != batchv1.JobReasonBackoffLimitExceeded):
			t.Fatalf("job ended %s (%s: %s), want Failed (BackoffLimitExceeded)", cond.Type, cond.Reason, cond.Message)
		}
		p = a.onePod(ctx, t, ns, j.Name)
	}

	// The pod as the policy made it: the supervisor first, the sidecar
	// after the app (SUPERVISOR_AFTER_APPS), a shared PID namespace.
	wantContainers := []string{supervisorName, "app", jc.sidecar}
	if got := containerNames(p.Spec.Containers); !slices.Equal(got, wantContainers) {
		t.Errorf("pod %s has containers %v, want %v", p.Name, got, wantContainers)
	}
	if p.Spec.ShareProcessNamespace == nil || !*p.Spec.ShareProcessNamespace {
		t.Errorf("pod %s does not share its PID namespace", p.Name)
	}
	sup := findContainer(p.Spec, supervisorName)
	if sup == nil {
		t.Fatalf("pod %s has no supervisor", p.Name)
	}
	if sup.Image != a.supervisorImage {
		t.Errorf("supervisor image %s, want %s", sup.Image, a.supervisorImage)
	}
	wantEnv := map[string]string{"SUPERVISOR_RESTART_POLICY": string(jc.restart), "SUPERVISOR_APP_CONTAINERS": "1",
		"SUPERVISOR_APPS": "app", "SUPERVISOR_AFTER_APPS": jc.sidecar, "SUPERVISOR_ON_SUCCESS": ""}
	if jc.sidecar == shapeIstio {
		wantEnv["SUPERVISOR_ON_SUCCESS"] = quitURL
	}
	gotEnv := map[string]string{}
	for _, v := range sup.Env {
		gotEnv[v.Name] = v.Value
	}
	for k, v := range wantEnv {
		if gotEnv[k] != v {
			t.Errorf("pod %s: supervisor %s=%q, want %q", p.Name, k, gotEnv[k], v)
		}
	}
	if jc.sidecar == shapeVault {
		if got := p.Annotations[vaultEnableQuit]; got != "true" {
			t.Errorf("pod %s: %s = %q, want \"true\", set by the policy before vault-k8s's webhook ran", p.Name, vaultEnableQuit, got)
		}
		if got := containerNames(p.Spec.InitContainers); !slices.Equal(got, []string{vaultAgentInit}) {
			t.Errorf("pod %s has init containers %v, want [%s]", p.Name, got, vaultAgentInit)
		}
	}

	// How it ended.
	wantPhase := corev1.PodSucceeded
	if !ok {
		wantPhase = corev1.PodFailed
	}
	if p.Status.Phase != wantPhase {
		t.Errorf("pod %s is %s, want %s", p.Name, p.Status.Phase, wantPhase)
	}
	wantExit(t, p, "app", int32(jc.exit))
	sidecarExit := int32(0)
	if jc.sidecar == shapeIstio && !ok {
		sidecarExit = 137 // SIGKILL, the failure's action
	}
	wantExit(t, p, jc.sidecar, sidecarExit)
	if s := status(t, p, jc.sidecar); s.RestartCount != 0 {
		t.Errorf("pod %s: %s restarted %d times", p.Name, jc.sidecar, s.RestartCount)
	}
	if jc.restart == corev1.RestartPolicyOnFailure {
		// (The kubelet of 1.34 leaves lastState empty once the pod is done:
		// the supervisor's log tells the failed run, below.)
		if s := status(t, p, "app"); s.RestartCount != 1 {
			t.Errorf("pod %s: app restarted %d times, want once", p.Name, s.RestartCount)
		}
	}
	if ok || jc.sidecar != shapeIstio {
		if log := a.logs(ctx, t, p, jc.sidecar, false); !strings.Contains(log, sidecarLog[jc.sidecar]) {
			t.Errorf("pod %s: %s's log lacks its clean stop %q:\n%s", p.Name, jc.sidecar, sidecarLog[jc.sidecar], log)
		}
	}
	summary := "success: app exit 0; action SIGTERM"
	if jc.sidecar == shapeIstio {
		summary = "success: app exit 0; action " + quit.action()
	}
	if !ok {
		summary = fmt.Sprintf("failure: app exit %d; action SIGKILL", jc.exit)
	}
	messages := []string{logPidfd, logFound, logExited, logDecision, logStopped, logDone}
	if jc.restart == corev1.RestartPolicyOnFailure {
		// The failed run seen, the sidecar kept up through the restart.
		messages = []string{logPidfd, logFound, logExited, logRetry, logNewApp, logExited, logDecision, logStopped, logDone}
	}
	a.checkSupervisor(ctx, t, p, summary+sidecarStop[jc.sidecar]+"; sidecar stopped", messages...)

	// The webhook's calls: for a sidecar it adds, the API server called it
	// before the policy's second run and again after it (IfNeeded), and the
	// second call saw the supervisor and kept it; for one in the pod spec,
	// the policy ran before it.
	calls := a.injectors.Calls(p.Labels[batchv1.ControllerUidLabel])
	switch jc.sidecar {
	case shapeDapr, shapeVault:
		want := []injectorCall{{injected: []string{jc.sidecar}}, {supervisor: true}}
		if diff := cmp.Diff(want, calls, cmp.AllowUnexported(injectorCall{})); diff != "" {
			t.Errorf("pod %s: the sidecar injectors' calls (-want +got):\n%s", p.Name, diff)
		}
	case shapeCSQL:
		if len(calls) == 0 || !calls[0].supervisor {
			t.Errorf("pod %s: the sidecar injectors' calls %+v, want the first to see the policy's supervisor", p.Name, calls)
		}
	}
}

// leftAlone: pods the policy must leave as they are, created as dry runs in
// two namespaces under the same webhooks (the tests' injectors, Istio's),
// one of them under the policy: the pods the API server would store are the
// same, byte for byte (the namespace's name, the pod's UID, times and the
// service-account volume's random suffix aside). Pods the policy cannot
// serve differ only by the annotation saying why.
func (a *admissionEnv) leftAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	with := a.namespace(ctx, t, "left-alone-policy", nsOpts{istio: true, policy: true})
	without := a.namespace(ctx, t, "left-alone-none", nsOpts{istio: true})

	csql := corev1.Container{Name: csqlName, Image: "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2.27.0", Args: []string{"--quitquitquit", "p:r:i"}}
	istio := func(p *corev1.Pod, templates string) *corev1.Pod {
		p.Labels = map[string]string{"sidecar.istio.io/inject": "true"}
		if templates != "" {
			p.Annotations = map[string]string{"inject.istio.io/templates": templates}
		}
		return p
	}
	edit := func(p *corev1.Pod, f func(*corev1.Pod)) *corev1.Pod { f(p); return p }
	nativeDaprd := corev1.Container{Name: "daprd", Image: "busybox:1.37", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}
	const statusKey = "supervisor.sidecar-supervisor.io/status"

	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		// status: the annotation the policy adds, "" for none.
		status string
		// check says what the pod is, so that the comparison compares the
		// case it means to.
		check func(*corev1.Pod) string
		// served: the control, which the policy changes.
		served bool
	}{
		{name: "a Job pod without sidecars", pod: jobPodProbe(appContainer())},
		{name: "a Job pod whose daprd is a native sidecar", pod: edit(jobPodProbe(appContainer()), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{nativeDaprd}
		})},
		{name: "a bare pod with cloud-sql-proxy", pod: edit(jobPodProbe(appContainer(), csql), func(p *corev1.Pod) { p.OwnerReferences = nil })},
		{name: "a Job pod with cloud-sql-proxy, opted out by label", pod: edit(jobPodProbe(appContainer(), csql), func(p *corev1.Pod) {
			p.Labels["supervisor.sidecar-supervisor.io/inject"] = "false"
		})},
		{name: "a Job pod with cloud-sql-proxy, opted out by annotation", pod: edit(jobPodProbe(appContainer(), csql), func(p *corev1.Pod) {
			p.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/inject": "false"}
		})},
		{name: "a Job pod whose istio-proxy is native", pod: edit(istio(jobPodProbe(appContainer()), "sidecar"), func(p *corev1.Pod) {
			p.Annotations["sidecar.istio.io/nativeSidecar"] = "true"
		}), check: func(p *corev1.Pod) string {
			if c := injector.Find(p.Spec.InitContainers, proxyName); c == nil || c.RestartPolicy == nil {
				return "istio-proxy is not a native sidecar"
			}
			return ""
		}},
		// Never twice: Istio's template adds the supervisor, the policy's
		// second run finds it.
		{name: "a Job pod the Istio template serves", pod: istio(jobPodProbe(appContainer()), ""), check: func(p *corev1.Pod) string {
			if !injector.HasContainer(p.Spec, supervisorName) {
				return "the Istio template added no supervisor"
			}
			return ""
		}},
		// What the policy does not do that the Istio template does: the hold
		// for long-running pods (istio-proxy's preStop), which the template
		// adds to this pod without the annotation.
		{name: "a long-running pod with Istio's sidecar template alone: no hold", pod: edit(istio(jobPodProbe(appContainer()), "sidecar"), func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d4f8b9c7", UID: "9a1c3e5f-0000-4000-8000-000000000001", Controller: ptr.To(true)}}
			p.Labels["supervisor.sidecar-supervisor.io/inject"] = "true"
			p.Spec.RestartPolicy = corev1.RestartPolicyAlways
		}), check: func(p *corev1.Pod) string {
			if c := findContainer(p.Spec, proxyName); c == nil || (c.Lifecycle != nil && c.Lifecycle.PreStop != nil) {
				return "istio-proxy missing, or with a preStop hook"
			}
			return ""
		}},
		// The control: a pod the policy serves, so that the comparison is
		// seen to tell.
		{name: "control: a Job pod with cloud-sql-proxy, served", pod: jobPodProbe(appContainer(), csql), served: true},
		// A Windows pod: validation refuses shareProcessNamespace there.
		{name: "a Windows Job pod with cloud-sql-proxy", pod: edit(jobPodProbe(appContainer(), csql), func(p *corev1.Pod) { p.Spec.OS = &corev1.PodOS{Name: corev1.Windows} }),
			status: "not added: a Windows pod; the supervisor and the shared process namespace it needs are Linux only"},
		{name: "a hostPID Job pod with cloud-sql-proxy", pod: edit(jobPodProbe(appContainer(), csql), func(p *corev1.Pod) { p.Spec.HostPID = true }),
			status: "not added: a hostPID pod cannot share its process namespace (the API server refuses a pod with both); stop the sidecars from the app, or use native sidecars"},
		{name: "a Job pod with cloud-sql-proxy and shareProcessNamespace false", pod: edit(jobPodProbe(appContainer(), csql), func(p *corev1.Pod) { p.Spec.ShareProcessNamespace = ptr.To(false) }),
			status: "not added: the pod sets shareProcessNamespace: false, which the supervisor needs true; stop the sidecars from the app, or use native sidecars"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := dryRun(ctx, t, a.c.Client.CoreV1().Pods(with), c.pod)
			ref := dryRun(ctx, t, a.c.Client.CoreV1().Pods(without), c.pod)
			if c.check != nil {
				if why := c.check(ref); why != "" {
					t.Fatalf("not the case meant: %s\n%s", why, normalized(t, ref))
				}
			}
			if c.served {
				if !injector.HasContainer(got.Spec, supervisorName) || normalized(t, got) == normalized(t, ref) {
					t.Errorf("the control was not served: %s", normalized(t, got))
				}
				return
			}
			if got.Annotations[statusKey] != c.status {
				t.Errorf("annotation %s = %q, want %q", statusKey, got.Annotations[statusKey], c.status)
			}
			if c.status != "" {
				delete(got.Annotations, statusKey)
				if len(got.Annotations) == 0 {
					got.Annotations = nil
				}
			}
			if g, r := normalized(t, got), normalized(t, ref); g != r {
				t.Errorf("the policy changed the pod:\nwith:    %s\nwithout: %s\n%s", g, r, cmp.Diff(r, g))
			}
		})
	}
}

// podCreator is what dryRun needs of a pods client.
type podCreator interface {
	Create(context.Context, *corev1.Pod, metav1.CreateOptions) (*corev1.Pod, error)
}

// dryRun creates pod as a dry run and returns what the API server would
// store.
func dryRun(ctx context.Context, t *testing.T, pods podCreator, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := pods.Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	return got
}

var apiAccessVolume = regexp.MustCompile(`kube-api-access-[a-z0-9]+`)

// normalized is the pod's JSON without what differs between two dry runs
// of it in two namespaces: the namespace's name, UID, creation time,
// managed fields, the service-account token volume's random suffix.
func normalized(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	p = p.DeepCopy()
	ns := p.Namespace
	p.Namespace, p.UID, p.CreationTimestamp, p.ManagedFields, p.ResourceVersion = "", "", metav1.Time{}, nil, ""
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	s := apiAccessVolume.ReplaceAllString(string(b), "kube-api-access-X")
	return strings.ReplaceAll(s, ns, "NAMESPACE")
}
