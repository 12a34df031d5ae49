package inject

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/pilot/pkg/features"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/kube/inject"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

const namespace = "jobs"

// Workloads the cases start from, as users write them.

func job(name string, restart corev1.RestartPolicy, annotations map[string]string, containers ...string) *batchv1.Job {
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       batchv1.JobSpec{Template: podTemplate(restart, annotations, containers...)},
	}
}

func cronJob(name string, restart corev1.RestartPolicy, containers ...string) *batchv1.CronJob {
	return &batchv1.CronJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "CronJob"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: batchv1.CronJobSpec{
			Schedule: "*/15 * * * *",
			JobTemplate: batchv1.JobTemplateSpec{
				Spec: batchv1.JobSpec{Template: podTemplate(restart, nil, containers...)},
			},
		},
	}
}

func deployment(name string, containers ...string) *appsv1.Deployment {
	tmpl := podTemplate("", nil, containers...) // unset: defaults to Always
	tmpl.Labels["app"] = name
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: tmpl,
		},
	}
}

// podTemplate returns busybox containers running `sleep 10`, and the label
// asking Istio for its sidecar.
func podTemplate(restart corev1.RestartPolicy, annotations map[string]string, containers ...string) corev1.PodTemplateSpec {
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels:      map[string]string{"sidecar.istio.io/inject": "true"},
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{RestartPolicy: restart},
	}
	for _, name := range containers {
		tmpl.Spec.Containers = append(tmpl.Spec.Containers, corev1.Container{
			Name:    name,
			Image:   "busybox:1.37",
			Command: []string{"sleep", "10"},
		})
	}
	return tmpl
}

// quitURL is pilot-agent's quit endpoint on Istio's default status port:
// the template's action on success unless a pod asks for another.
const quitURL = "http://127.0.0.1:15020/quitquitquit"

// supervisorEnv is the environment the template gives the supervisor when no
// annotation asks for more, where istio-proxy goes last (so with
// SUPERVISOR_AFTER_APPS; see withoutAfterApps), its state directory
// included (see handJobEnv). apps is the app containers' names,
// comma-separated, which it counts too; a number is the app-containers
// annotation's count, which replaces the names.
func supervisorEnv(restart string, apps string, extra ...string) map[string]string {
	env := map[string]string{
		"SUPERVISOR_RESTART_POLICY": restart,
		afterAppsVar:                proxyName,
		"SUPERVISOR_ON_SUCCESS":     quitURL,
		stateVar:                    stateDir,
		"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
	}
	switch _, err := strconv.Atoi(apps); {
	case apps == "":
	case err == nil:
		env["SUPERVISOR_APP_CONTAINERS"] = apps
	default:
		env["SUPERVISOR_APPS"] = apps
		env["SUPERVISOR_APP_CONTAINERS"] = strconv.Itoa(len(strings.Split(apps, ",")))
	}
	return setPairs(env, extra...)
}

// withoutAfterApps is env without SUPERVISOR_AFTER_APPS: the supervisor's
// environment where it comes after the apps (the template with
// holdApplicationUntilProxyStarts, where istio-proxy starts before them; the
// hand-written manifests).
func withoutAfterApps(env map[string]string) map[string]string {
	delete(env, afterAppsVar)
	return env
}

// supervised is the pod the template makes of apps where istio-proxy goes
// last: the supervisor first, watching before any app starts, with env.
func supervised(env map[string]string, apps ...string) podShape {
	return withInits(supervisorFirst(env, append(slices.Clone(apps), proxyName)...), "istio-init")
}

// proxyFirstJob is what a one-app Job becomes with
// holdApplicationUntilProxyStarts, asked by the pod's ProxyConfig or by
// the mesh-wide value: istio-proxy first (with its postStart), the
// supervisor last, without SUPERVISOR_AFTER_APPS.
func proxyFirstJob() podShape {
	return withPostStart(withInits(supervisorLast(withoutAfterApps(supervisorEnv("Never", "app")), proxyName, "app"), "istio-init"), "pilot-agent", "wait")
}

// everyAnnotation sets every tuning annotation, each to a value of its own,
// as everyAnnotationEnv sets their variables in env.
func everyAnnotation() map[string]string {
	a := map[string]string{}
	for v, key := range settingAnnotations {
		a[annotationPrefix+key] = "value-of-" + v
	}
	return a
}

func everyAnnotationEnv(env map[string]string) map[string]string {
	for v := range settingAnnotations {
		env[v] = "value-of-" + v
	}
	return env
}

type injectCase struct {
	name string
	in   runtime.Object
	// nativeSidecars sets istiod's ENABLE_NATIVE_SIDECARS=true for the case.
	nativeSidecars bool
	// values, merged over values-supervisor.yaml as helm would, install
	// the istiod the case runs on (the Helm installation alone).
	values map[string]any
	want   podShape
	ptrace bool
	// image overrides the expected supervisor image.
	image string
	// templateAlone: Istio does not run the supervisor template for this
	// pod at all; rendered on its own, the template would render this mode
	// ("job": the supervisor; "hold").
	templateAlone string
	// status is the supervisor.sidecar-supervisor.io/status annotation the
	// template leaves on a pod it cannot serve (hostPID, an explicit
	// shareProcessNamespace: false); "" wants none.
	status string
}

func (tc injectCase) basics() supervisorBasics {
	b := wantBasics(tc.ptrace)
	if tc.image != "" {
		b.Image = tc.image
	}
	return b
}

func injectCases(t *testing.T) []injectCase {
	var handWritten batchv1.Job
	decodeStrict(t, readDeploy(t, "job.yaml"), &handWritten)
	handWritten.Namespace = namespace

	quit := quitURL
	hostPID := func(p *corev1.PodTemplateSpec) { p.Spec.HostPID = true }
	unshared := func(p *corev1.PodTemplateSpec) { p.Spec.ShareProcessNamespace = ptr.To(false) }
	const (
		hostPIDStatus  = "not added: a hostPID pod cannot share its process namespace"
		unsharedStatus = "not added: the pod sets shareProcessNamespace: false"
	)
	plainJob := podShape{InitContainers: []string{"istio-init"}, Containers: []string{"app", proxyName}}
	sleep := func(annotations ...string) *batchv1.Job {
		return job("sleep", corev1.RestartPolicyNever, setPairs(nil, annotations...), "app")
	}
	oneApp := func(kv ...string) podShape { return supervised(supervisorEnv("Never", "app", kv...), "app") }
	return []injectCase{
		// The default: the supervisor first, istio-proxy last, and
		// SUPERVISOR_AFTER_APPS naming istio-proxy, whose start tells the
		// supervisor that the kubelet has passed the apps. Written out here
		// rather than through supervised and supervisorEnv.
		{name: "job busybox sleep 10", in: sleep(), want: podShape{
			InitContainers:        []string{"istio-init"},
			Containers:            []string{supervisorName, "app", proxyName},
			ShareProcessNamespace: true,
			SupervisorEnv: map[string]string{
				"SUPERVISOR_RESTART_POLICY": "Never",
				"SUPERVISOR_APP_CONTAINERS": "1",
				"SUPERVISOR_APPS":           "app",
				"SUPERVISOR_AFTER_APPS":     "istio-proxy",
				"SUPERVISOR_ON_SUCCESS":     quitURL,
				"SUPERVISOR_STATE_DIR":      "/var/run/sidecar-supervisor-state",
				"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
			},
			SupervisorUser: "1337",
		}},
		{name: "cronjob restartPolicy OnFailure", in: cronJob("nightly", corev1.RestartPolicyOnFailure, "app"),
			want: supervised(supervisorEnv("OnFailure", "app"), "app")},
		{name: "job with two app containers", in: job("pair", corev1.RestartPolicyNever, nil, "app", "uploader"),
			want: supervised(supervisorEnv("Never", "app,uploader"), "app", "uploader")},
		{name: "pod with sidecar.istio.io/inject false gets nothing", templateAlone: "job",
			in:   edit(sleep(), func(p *corev1.PodTemplateSpec) { p.Labels["sidecar.istio.io/inject"] = "false" }),
			want: podShape{Containers: []string{"app"}}},
		{name: "native sidecar by pod annotation", in: sleep("sidecar.istio.io/nativeSidecar", "true"), want: native("app")},
		{name: "native sidecar mesh-wide (ENABLE_NATIVE_SIDECARS=true)", in: sleep(), nativeSidecars: true, want: native("app")},
		{name: "annotations tune the supervisor", image: mirrorImage,
			in: sleep(annotationPrefix+"on-failure", quit, annotationPrefix+"stop-timeout", "45s", annotationPrefix+"log-level", "debug",
				annotationPrefix+"app-containers", "3", annotationPrefix+"image", mirrorImage),
			want: supervised(supervisorEnv("Never", "3", "SUPERVISOR_ON_FAILURE", quit,
				"SUPERVISOR_STOP_TIMEOUT", "45s", "SUPERVISOR_LOG_LEVEL", "debug"), "app")},
		{name: "on-success annotation replaces the quit endpoint", in: sleep(annotationPrefix+"on-success", "SIGTERM"),
			want: oneApp("SUPERVISOR_ON_SUCCESS", "SIGTERM")},
		{name: "the quit endpoint follows the pod's status port", in: sleep("status.sidecar.istio.io/port", "15099"),
			want: oneApp("SUPERVISOR_ON_SUCCESS", "http://127.0.0.1:15099/quitquitquit")},
		{name: "every tuning annotation reaches its variable", in: job("all-settings", corev1.RestartPolicyNever, everyAnnotation(), "app"),
			want: supervised(everyAnnotationEnv(supervisorEnv("Never", "")), "app")},
		{name: "supervisor opt-out annotation", in: sleep(annotationPrefix+"inject", "false"), want: plainJob},
		{name: "pod selects only the sidecar template", in: sleep("inject.istio.io/templates", "sidecar"), want: plainJob, templateAlone: "job"},
		// istio-proxy starts before the apps, so it cannot mark their end:
		// the supervisor goes after them, without SUPERVISOR_AFTER_APPS.
		{name: "holdApplicationUntilProxyStarts puts istio-proxy first, the supervisor last",
			in: sleep("proxy.istio.io/config", `{"holdApplicationUntilProxyStarts": true}`), want: proxyFirstJob()},
		{name: "istio-proxy as root (capNetBindService): quit over HTTP, not signals", in: sleep("sidecar.istio.io/capNetBindService", "true"),
			want: oneApp("SUPERVISOR_ON_SUCCESS", quit, "SUPERVISOR_ON_FAILURE", quit, "SUPERVISOR_ON_UNKNOWN", quit)},
		{name: "exit-status ptrace runs as root with SYS_PTRACE, SYS_PACCT and KILL", in: sleep(annotationPrefix+"exit-status", "ptrace"), ptrace: true, want: asRoot(oneApp("SUPERVISOR_EXIT_STATUS", "ptrace"))},
		{name: "exit-status accounting runs as root with SYS_PACCT and KILL", in: sleep(annotationPrefix+"exit-status", "accounting"), ptrace: true, want: asAccountingRoot(oneApp("SUPERVISOR_EXIT_STATUS", "accounting"))},
		// After the app, as written, without SUPERVISOR_AFTER_APPS.
		{name: "hand-written deploy/job.yaml keeps its own supervisor", in: &handWritten,
			want: podShape{InitContainers: []string{"istio-init"}, Containers: []string{"app", supervisorName, proxyName}, ShareProcessNamespace: true,
				SupervisorEnv: handJobEnv("Never", "SUPERVISOR_ON_FAILURE", "SIGKILL", "SUPERVISOR_EXIT_STATUS", "auto"), SupervisorUser: "1337"}},
		// A sidecar the supervisor knows, added as a regular container (as
		// Dapr's injector does): not an app.
		{name: "job with daprd: not an app", in: job("dapr", corev1.RestartPolicyNever, nil, "app", "daprd"),
			want: supervised(supervisorEnv("Never", "app"), "app", "daprd")},
		// A native sidecar the supervisor knows by name, beside the classic
		// istio-proxy: the kubelet stops it after the apps, so the
		// supervisor must not (it tells containers by name alone).
		{name: "native linkerd-proxy: left out of the sidecars to stop",
			in: edit(sleep(), func(p *corev1.PodTemplateSpec) {
				p.Spec.InitContainers = []corev1.Container{{Name: "linkerd-proxy", Image: "busybox:1.37", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
			}),
			want: withInits(oneApp("SUPERVISOR_SIDECARS", "istio-proxy,daprd,consul-dataplane,vault-agent,cloud-sql-proxy,otc-container,otel-collector,fluent-bit"),
				"linkerd-proxy", "istio-init")},
		// The API server refuses hostPID with shareProcessNamespace: the
		// pod must stay valid, without the supervisor or the hold.
		{name: "hostPID job: left alone, valid, and says why", in: edit(sleep(), hostPID), want: plainJob, status: hostPIDStatus},
		{name: "hostPID deployment: no hold, valid, and says why", in: edit(deployment("web", "web"), hostPID), want: unheld, status: hostPIDStatus},
		{name: "shareProcessNamespace false job: respected", in: edit(sleep(), unshared), want: plainJob, status: unsharedStatus},
		{name: "shareProcessNamespace false deployment: respected", in: edit(deployment("web", "web"), unshared), want: unheld, status: unsharedStatus},
	}
}

// checkStatus checks the status annotation: the one wanted, or none.
func checkStatus(t *testing.T, annotations map[string]string, want string) {
	t.Helper()
	got, ok := annotations[annotationPrefix+"status"]
	if want == "" && ok {
		t.Errorf("status annotation %q on a pod the template serves", got)
	}
	if want != "" && !strings.HasPrefix(got, want) {
		t.Errorf("status annotation %q, want %q...", got, want)
	}
}

// allCases are the pods TestIstioInjection and TestIstioReleases inject.
func allCases(t *testing.T) []injectCase {
	return slices.Concat(injectCases(t), nativeCases(t), holdCases(t), valuesCases())
}

// install is the installation the case runs on instead of in: in itself,
// or, for a case with values, istiod's chart rendered with them (nil when
// in is not the Helm installation).
func (tc injectCase) install(t *testing.T, in istioInstall) *istioInstall {
	t.Helper()
	if tc.values == nil {
		return &in
	}
	if in.Name != "helm" {
		return nil
	}
	in, err := injector.RenderHelm(tc.values)
	if err != nil {
		t.Fatal(err)
	}
	return &in
}

// TestIstioInjection runs each case (Jobs and CronJobs here, the
// supervisor's native shape in native_test.go, Deployments and
// StatefulSets in hold_test.go, other Helm values: valuesCases) through
// Istio's injector with the configuration of each installation method
// (cases with values: the Helm one alone), in both of the injector's
// forms: istiod's admission webhook (which runs defaultTemplates) and
// istioctl kube-inject's IntoObject (which runs only "sidecar" unless the pod
// names its templates).
func TestIstioInjection(t *testing.T) {
	for _, base := range installs(t) {
		baseHook := newWebhook(t, base)
		for _, tc := range allCases(t) {
			in, hook := tc.install(t, base), baseHook
			if in == nil {
				continue
			}
			if tc.values != nil {
				hook = newWebhook(t, *in)
			}
			t.Run(base.Name+"/"+tc.name, func(t *testing.T) {
				if tc.nativeSidecars {
					setNativeSidecarMode(t, features.NativeSidecarModeEnabled)
				}
				t.Run("template output", func(t *testing.T) {
					checkTemplateOutput(t, *in, tc)
				})
				t.Run("webhook", func(t *testing.T) {
					pod := admit(t, hook, podFor(tc.in))
					checkSupervised(t, pod.Spec, tc.want, tc.basics(), true, "injected pod", dump(pod))
					checkStatus(t, pod.Annotations, tc.status)
					// With reinvocationPolicy IfNeeded the API server sends
					// the injected pod again: nothing may change.
					again := admit(t, hook, pod)
					if diff := cmp.Diff(shapeOf(pod.Spec), shapeOf(again.Spec)); diff != "" {
						t.Errorf("re-injection changed the pod (-first +second):\n%s\n%s", diff, dump(again))
					}
					checkValid(t, again.Spec)
				})
				t.Run("kube-inject", func(t *testing.T) {
					out := kubeInject(t, *in, tc.in)
					spec := podTemplateFor(out).Spec
					checkSupervised(t, spec, tc.want, tc.basics(), true, "injected "+reflect.TypeOf(out).String(), dump(out))
					checkStatus(t, podTemplateFor(out).Annotations, tc.status)
				})
			})
		}
	}
}

// setNativeSidecarMode sets istiod's ENABLE_NATIVE_SIDECARS for one test:
// the feature flag is read once from the environment, at start-up.
func setNativeSidecarMode(t *testing.T, mode features.NativeSidecarMode) {
	old := features.EnableNativeSidecars
	features.EnableNativeSidecars = mode
	t.Cleanup(func() { features.EnableNativeSidecars = old })
}

// checkTemplateOutput renders our template alone, as istiod does (same
// parsed template, same data), and decodes what it emits strictly as a Pod:
// the injector itself would silently drop a misspelt field. It checks that
// the patch holds exactly the parts of its mode and the order directives:
// the pod's own containers in their order, the supervisor before them or
// after them as istio-proxy goes last or first, or, native, after the pod's
// own init containers; the hold's additions after them.
func checkTemplateOutput(t *testing.T, in istioInstall, tc injectCase) {
	pod := podFor(tc.in)
	data := templateData(t, in, pod, tc.nativeSidecars)
	var out bytes.Buffer
	if err := in.Config.Templates["supervisor"].Execute(&out, &data); err != nil {
		t.Fatalf("supervisor template: %v", err)
	}
	rendered := strings.TrimSpace(out.String())
	meshCfg := proxyMesh(t, in, pod)
	if tc.status != "" {
		var patch corev1.Pod
		if err := yaml.UnmarshalStrict([]byte(rendered), &patch); err != nil {
			t.Fatalf("template output: %v\n%s", err, rendered)
		}
		if got := patch.Annotations[annotationPrefix+"status"]; !strings.HasPrefix(got, tc.status) || !reflect.DeepEqual(patch.Spec, corev1.PodSpec{}) {
			t.Errorf("template output for a pod it cannot serve: want only the status annotation %q...:\n%s", tc.status, rendered)
		}
		return
	}
	mode := tc.templateAlone
	switch {
	case mode != "":
	case findEither(pod.Spec, supervisorName) != nil, findInit(pod.Spec, installName) != nil:
		// Added by hand: the template adds nothing.
	case tc.want.SupervisorEnv != nil:
		mode = "job"
	case tc.want.Hold.InstallArgs != nil:
		mode = "hold"
	}
	if mode == "" {
		if rendered != "" {
			t.Errorf("template rendered a patch for a pod it should leave alone:\n%s", rendered)
		}
		return
	}
	patch, orders := splitOrderDirectives(t, rendered)
	if patch.Spec.ShareProcessNamespace == nil || !*patch.Spec.ShareProcessNamespace {
		t.Errorf("template output lacks shareProcessNamespace: true:\n%s", rendered)
	}
	// What the patch adds or patches, by name: exactly its mode's parts.
	type parts struct{ InitContainers, Containers, Volumes []string }
	added := parts{InitContainers: shapeOf(patch.Spec).InitContainers, Containers: shapeOf(patch.Spec).Containers}
	for _, v := range patch.Spec.Volumes {
		added.Volumes = append(added.Volumes, v.Name)
	}
	var want parts
	var wantOrders map[string][]string
	switch mode {
	case "job":
		// Under exit-status ptrace (root with SYS_PTRACE), istio-proxy mounts
		// the state volume too: accounting goes through its mount.
		ptrace := tc.want.SupervisorEnv["SUPERVISOR_EXIT_STATUS"] == "ptrace"
		if ptrace {
			checkProxyStateMount(t, patch.Spec, rendered)
		}
		// The supervisor, and its standby where the case wants one.
		ours := []string{supervisorName}
		if slices.Contains(slices.Concat(tc.want.InitContainers, tc.want.Containers), standbyName) {
			ours = append(ours, standbyName)
		}
		// The native shape: the supervisor alone among the init containers,
		// after the pod's own.
		if findInit(patch.Spec, supervisorName) != nil {
			want = parts{InitContainers: ours, Volumes: []string{stateVolume}}
			wantOrders = map[string][]string{"initContainers": slices.Concat(shapeOf(pod.Spec).InitContainers, ours)}
			if ptrace {
				want.Containers = []string{proxyName}
				wantOrders["containers"] = append(withoutProxy(shapeOf(pod.Spec).Containers), proxyName)
			}
			break
		}
		want = parts{Containers: slices.Clone(ours), Volumes: []string{stateVolume}}
		if ptrace {
			want.Containers = append(want.Containers, proxyName)
		}
		// Where Istio's injector puts istio-proxy (reorderPod's own test):
		// last by default, and the supervisor then goes before the pod's
		// containers; first with holdApplicationUntilProxyStarts, and the
		// supervisor then goes after them.
		proxyFirst := meshCfg.GetDefaultConfig().GetHoldApplicationUntilProxyStarts().GetValue() ||
			in.Values.Struct().GetGlobal().GetProxy().GetHoldApplicationUntilProxyStarts().GetValue()
		order := slices.Concat(ours, shapeOf(pod.Spec).Containers)
		if proxyFirst {
			order = slices.Concat(shapeOf(pod.Spec).Containers, ours)
		}
		if ptrace && !slices.Contains(order, proxyName) {
			order = append(order, proxyName)
		}
		wantOrders = map[string][]string{"containers": order}
	case "hold":
		want = parts{InitContainers: []string{installName}, Containers: []string{proxyName}, Volumes: []string{holdVolume}}
		// istio-proxy gets only what the hold needs; Istio's own fields stay.
		if proxy := findContainer(patch.Spec, proxyName); proxy != nil {
			rest := *proxy.DeepCopy()
			rest.Env, rest.Lifecycle, rest.VolumeMounts = nil, nil, nil
			if diff := cmp.Diff(corev1.Container{Name: proxyName}, rest); diff != "" {
				t.Errorf("template output sets more of istio-proxy than env, lifecycle.preStop and volumeMounts (-want +got):\n%s\n%s", diff, rendered)
			}
			if l := proxy.Lifecycle; l == nil || l.PostStart != nil {
				t.Errorf("template output must set istio-proxy's preStop only:\n%s", rendered)
			}
		}
		wantOrders = map[string][]string{
			"containers":     append(withoutProxy(shapeOf(pod.Spec).Containers), proxyName),
			"initContainers": append(shapeOf(pod.Spec).InitContainers, installName),
		}
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	if diff := cmp.Diff(want, added); diff != "" {
		t.Errorf("template output for mode %s: what it adds or patches (-want +got):\n%s\n%s", mode, diff, rendered)
	}
	if diff := cmp.Diff(wantOrders, orders); diff != "" {
		t.Errorf("$setElementOrder directives (-want +got):\n%s\n%s", diff, rendered)
	}
}

// withoutProxy is names without istio-proxy.
func withoutProxy(names []string) []string {
	return slices.DeleteFunc(names, func(c string) bool { return c == proxyName })
}

// checkProxyStateMount: the template patches istio-proxy with the state
// volume's mount alone, writable, at the supervisor's path.
func checkProxyStateMount(t *testing.T, spec corev1.PodSpec, rendered string) {
	t.Helper()
	proxy := findContainer(spec, proxyName)
	if proxy == nil {
		t.Errorf("template output does not mount the state volume in istio-proxy:\n%s", rendered)
		return
	}
	want := corev1.Container{Name: proxyName, VolumeMounts: []corev1.VolumeMount{{Name: stateVolume, MountPath: stateDir}}}
	if diff := cmp.Diff(want, *proxy); diff != "" {
		t.Errorf("template output's istio-proxy (-want +got):\n%s\n%s", diff, rendered)
	}
}

// proxyMesh is the mesh config with the pod's ProxyConfig as its
// defaultConfig: the mesh's defaultConfig under the pod's
// proxy.istio.io/config annotation, as both injector forms compute it.
func proxyMesh(t testing.TB, in istioInstall, pod *corev1.Pod) *meshconfig.MeshConfig {
	t.Helper()
	pca, ok := pod.Annotations["proxy.istio.io/config"]
	if !ok {
		return in.Mesh
	}
	m, err := mesh.ApplyProxyConfig(pca, in.Mesh)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// templateData is what istiod hands its templates for pod (the newest
// release's SidecarTemplateData), with .NativeSidecars as given.
func templateData(t testing.TB, in istioInstall, pod *corev1.Pod, native bool) inject.SidecarTemplateData {
	t.Helper()
	return inject.SidecarTemplateData{
		ObjectMeta:     pod.ObjectMeta,
		Spec:           pod.Spec,
		ProxyConfig:    proxyMesh(t, in, pod).GetDefaultConfig(),
		MeshConfig:     in.Mesh,
		Values:         in.Values.Map(),
		NativeSidecars: native,
		ProxyUID:       1337,
		ProxyGID:       1337,
	}
}

// splitOrderDirectives decodes the template's output: the strategic merge
// directives $setElementOrder/<list> (the order each asks for, by list), and
// the rest strictly as a Pod.
func splitOrderDirectives(t *testing.T, rendered string) (corev1.Pod, map[string][]string) {
	t.Helper()
	var raw struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(rendered), &raw); err != nil {
		t.Fatalf("template output is not YAML: %v\n%s", err, rendered)
	}
	orders := map[string][]string{}
	const directive = "$setElementOrder/"
	for key, v := range raw.Spec {
		list, ok := strings.CutPrefix(key, directive)
		if !ok {
			continue
		}
		items, _ := v.([]any)
		orders[list] = []string{}
		for _, it := range items {
			m, _ := it.(map[string]any)
			name, _ := m["name"].(string)
			orders[list] = append(orders[list], name)
		}
		delete(raw.Spec, key)
	}
	rest, err := yaml.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	decodeStrict(t, rest, &pod)
	// Decoding through a map loses duplicate keys; check those on the text.
	var dup map[string]any
	if err := yaml.UnmarshalStrict([]byte(rendered), &dup); err != nil {
		t.Errorf("template output: %v\n%s", err, rendered)
	}
	return pod, orders
}

// newWebhook starts Istio's injection webhook, as istiod runs it, with the
// installation's configuration, and returns its HTTP handler.
func newWebhook(t *testing.T, in istioInstall) http.Handler {
	t.Helper()
	hook, err := injector.NewWebhook(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	return hook
}

// podFor returns the pod a controller would create from the workload, after
// the API server's defaulting of restartPolicy and
// terminationGracePeriodSeconds (admission webhooks see defaulted objects).
func podFor(obj runtime.Object) *corev1.Pod {
	tmpl := podTemplateFor(obj)
	name := obj.(metav1.Object).GetName()
	kind := reflect.TypeOf(obj).Elem().Name()
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, Controller: ptr.To(true)}
	switch kind {
	case "Job":
		owner.APIVersion = "batch/v1"
	case "CronJob":
		owner.APIVersion, owner.Kind, owner.Name = "batch/v1", "Job", name+"-29000000"
	case "Deployment":
		owner.Kind, owner.Name = "ReplicaSet", name+"-5d4f8b9c7"
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: *tmpl.ObjectMeta.DeepCopy(),
		Spec:       *tmpl.Spec.DeepCopy(),
	}
	pod.GenerateName = owner.Name + "-"
	pod.Namespace = namespace
	owner.UID = types.UID("uid-" + owner.Name)
	pod.OwnerReferences = []metav1.OwnerReference{owner}
	if pod.Spec.RestartPolicy == "" {
		pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		pod.Spec.TerminationGracePeriodSeconds = ptr.To(int64(corev1.DefaultTerminationGracePeriodSeconds))
	}
	return pod
}

// admit sends the pod to the webhook as the API server does (an
// admission.k8s.io/v1 AdmissionReview over HTTP), applies the JSON patch it
// answers with, and decodes the result strictly.
func admit(t *testing.T, hook http.Handler, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	podJSON, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	review, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "e2e-inject",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: pod.Namespace,
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: podJSON},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/inject", bytes.NewReader(review))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	hook.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("webhook answered %d: %s", rec.Code, rec.Body)
	}
	var answer admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
		t.Fatalf("webhook answer: %v\n%s", err, rec.Body)
	}
	resp := answer.Response
	if resp == nil || !resp.Allowed || (resp.Result != nil && resp.Result.Message != "") {
		t.Fatalf("webhook refused the pod: %s", rec.Body)
	}
	patched := podJSON
	if len(resp.Patch) > 0 {
		p, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatalf("webhook patch: %v\n%s", err, resp.Patch)
		}
		if patched, err = p.Apply(podJSON); err != nil {
			t.Fatalf("applying the webhook patch: %v\n%s", err, resp.Patch)
		}
	}
	var got corev1.Pod
	decodeStrict(t, patched, &got)
	return &got
}

// kubeInject runs istioctl kube-inject's library call on the workload and
// decodes the result strictly into a new object of the same type.
//
// kube-inject does not read defaultTemplates: it runs "sidecar" only, unless
// the pod annotation inject.istio.io/templates names the templates, so it is
// added here when the case does not set it. For a CronJob, kube-inject reads
// (and writes) the metadata of spec.jobTemplate, not of the pod template.
func kubeInject(t *testing.T, in istioInstall, obj runtime.Object) runtime.Object {
	t.Helper()
	obj = obj.DeepCopyObject()
	meta := &podTemplateFor(obj).ObjectMeta
	if c, ok := obj.(*batchv1.CronJob); ok {
		meta = &c.Spec.JobTemplate.ObjectMeta
	}
	if _, ok := podTemplateFor(obj).Annotations["inject.istio.io/templates"]; !ok {
		meta.Annotations = setPairs(meta.Annotations, "inject.istio.io/templates", "sidecar,supervisor")
	}
	out, err := inject.IntoObject(nil, in.Config.Templates, in.Values, "", in.Mesh, obj, func(string) {})
	if err != nil {
		t.Fatalf("kube-inject: %v", err)
	}
	b, err := yaml.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	fresh := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(runtime.Object)
	decodeStrict(t, b, fresh)
	return fresh
}

func podTemplateFor(obj runtime.Object) *corev1.PodTemplateSpec {
	switch o := obj.(type) {
	case *batchv1.Job:
		return &o.Spec.Template
	case *batchv1.CronJob:
		return &o.Spec.JobTemplate.Spec.Template
	case *appsv1.Deployment:
		return &o.Spec.Template
	case *appsv1.StatefulSet:
		return &o.Spec.Template
	case *appsv1.DaemonSet:
		return &o.Spec.Template
	}
	panic("podTemplateFor: unexpected " + reflect.TypeOf(obj).String())
}

func dump(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return "--- got ---\n" + string(b)
}
