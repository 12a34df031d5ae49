package inject

import (
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"istio.io/istio/pkg/cluster"
	"istio.io/istio/pkg/kube"
	"istio.io/istio/pkg/kube/multicluster"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

// The hold: for pods with restartPolicy Always, the template makes
// `sidecar-supervisor hold` istio-proxy's preStop hook (see deploy/README.md).

// istioDrain is the preStop hook Istio's own template gives a native-sidecar
// istio-proxy: the hold must never replace it.
var istioDrain = []string{"pilot-agent", "request", "--debug-port=15020", "POST", "drain"}

// native is the shape of a pod whose istio-proxy Istio made a native
// sidecar: no supervisor, no hold, Istio's drain hook.
func native(containers ...string) podShape {
	return podShape{
		InitContainers: []string{"istio-init", proxyName},
		Containers:     containers,
		Hold:           holdShape{PreStop: istioDrain},
	}
}

// statefulSet is deployment's workload as a StatefulSet.
func statefulSet(name string, containers ...string) *appsv1.StatefulSet {
	d := deployment(name, containers...)
	return &appsv1.StatefulSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: d.ObjectMeta,
		Spec:       appsv1.StatefulSetSpec{Selector: d.Spec.Selector, Template: d.Spec.Template},
	}
}

// edit changes a workload's pod template in place and returns the workload.
func edit[T runtime.Object](obj T, change func(*corev1.PodTemplateSpec)) T {
	change(podTemplateFor(obj))
	return obj
}

// annotate adds pod annotations (name, value, ...).
func annotate[T runtime.Object](obj T, kv ...string) T {
	return edit(obj, func(p *corev1.PodTemplateSpec) { p.Annotations = setPairs(p.Annotations, kv...) })
}

func grace(seconds int64) func(*corev1.PodTemplateSpec) {
	return func(p *corev1.PodTemplateSpec) { p.Spec.TerminationGracePeriodSeconds = &seconds }
}

// customProxy returns an istio-proxy container as a pod lists it to
// customise Istio's (https://istio.io/latest/docs/setup/additional-setup/sidecar-injection/#customizing-injection).
func customProxy(lifecycle *corev1.Lifecycle) corev1.Container {
	return corev1.Container{Name: proxyName, Image: "auto", Lifecycle: lifecycle}
}

func execHook(cmd ...string) *corev1.LifecycleHandler {
	return &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: cmd}}
}

// withHold is the shape of a pod with the template's hold.
// The hold's SUPERVISOR_APPS is the pod's containers but istio-proxy, as the
// injection template fills it, unless hold says otherwise.
func withHold(inits, containers []string, hold holdShape) podShape {
	if _, ok := hold.Env["SUPERVISOR_APPS"]; !ok && hold.Env != nil {
		hold.Env = maps.Clone(hold.Env)
		hold.Env["SUPERVISOR_APPS"] = strings.Join(slices.DeleteFunc(slices.Clone(containers), func(c string) bool { return c == proxyName }), ",")
	}
	return podShape{
		InitContainers:        inits,
		Containers:            containers,
		ShareProcessNamespace: true,
		Hold:                  hold,
	}
}

// held is a one-container Deployment "web" with the template's hold of
// SUPERVISOR_HOLD_TIMEOUT timeout, after istio-init unless inits says.
func held(timeout string, inits ...string) podShape {
	if inits == nil {
		inits = []string{installName, "istio-init"}
	}
	return withHold(inits, []string{"web", proxyName}, wantHold(timeout))
}

// withPostStart is s with istio-proxy's postStart hook cmd.
func withPostStart(s podShape, cmd ...string) podShape {
	s.Hold.PostStart = cmd
	return s
}

// unheld is a one-container Deployment "web" Istio injected without the hold.
var unheld = podShape{InitContainers: []string{"istio-init"}, Containers: []string{"web", proxyName}}

func holdCases(t *testing.T) []injectCase {
	var handWritten appsv1.Deployment
	decodeStrict(t, readDeploy(t, "deployment.yaml"), &handWritten)
	handWritten.Namespace = namespace

	inits := []string{installName, "istio-init"}
	web := func() *appsv1.Deployment { return deployment("web", "web") }
	return []injectCase{
		{name: "deployment gets the hold", in: web(), want: held("20s")},
		{name: "statefulset gets the hold", in: statefulSet("db", "db"), want: withHold(inits, []string{"db", proxyName}, wantHold("20s"))},
		{name: "install container after the pod's init containers, before istio-init",
			in: edit(deployment("web", "web", "worker"), func(p *corev1.PodTemplateSpec) {
				p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "busybox:1.37"}, {Name: "warm", Image: "busybox:1.37"}}
			}),
			want: withHold([]string{"migrate", "warm", installName, "istio-init"}, []string{"web", "worker", proxyName}, wantHold("20s"))},
		{name: "terminationGracePeriodSeconds 60: hold 50s", in: edit(web(), grace(60)), want: held("50s")},
		{name: "terminationDrainDuration 7.5s (proxy.istio.io/config): hold 30-8-5 = 17s",
			in: annotate(web(), "proxy.istio.io/config", `{"terminationDrainDuration": "7.5s"}`), want: held("17s")},
		{name: "terminationGracePeriodSeconds 10 leaves no time: no hold", in: edit(web(), grace(10)), want: unheld},
		{name: "terminationGracePeriodSeconds 11: hold 1s", in: edit(web(), grace(11)), want: held("1s")},
		{name: "hold-timeout annotation wins, even over a short grace period",
			in: annotate(edit(web(), grace(10)), annotationPrefix+"hold-timeout", "3s"), want: held("3s")},
		{name: "log and ignore annotations reach istio-proxy's environment; job-only ones do not",
			in: annotate(web(), annotationPrefix+"hold-timeout", "45s", annotationPrefix+"log-level", "debug",
				annotationPrefix+"log-format", "console", annotationPrefix+"ignore-processes", "fluent-bit",
				annotationPrefix+"stop-timeout", "9s", annotationPrefix+"on-success", "SIGKILL"),
			want: withHold(inits, []string{"web", proxyName}, wantHold("45s", "SUPERVISOR_LOG_LEVEL", "debug",
				"SUPERVISOR_LOG_FORMAT", "console", "SUPERVISOR_IGNORE_PROCESSES", "fluent-bit"))},
		{name: "image annotation sets the install container's image",
			in: annotate(web(), annotationPrefix+"image", mirrorImage), image: mirrorImage, want: held("20s")},
		{name: "hold false: no hold", in: annotate(web(), annotationPrefix+"hold", "false"), want: unheld},
		{name: "supervisor opt-out annotation: no hold", in: annotate(web(), annotationPrefix+"inject", "false"), want: unheld},
		{name: "sidecar.istio.io/inject false: nothing at all", templateAlone: "hold",
			in:   edit(web(), func(p *corev1.PodTemplateSpec) { p.Labels["sidecar.istio.io/inject"] = "false" }),
			want: podShape{Containers: []string{"web"}}},
		{name: "pod selects only the sidecar template: no hold", templateAlone: "hold",
			in: annotate(web(), "inject.istio.io/templates", "sidecar"), want: unheld},
		{name: "native sidecar by pod annotation: no hold, Istio's drain hook kept",
			in: annotate(web(), "sidecar.istio.io/nativeSidecar", "true"), want: native("web")},
		{name: "native sidecar mesh-wide: no hold, Istio's drain hook kept", in: web(), nativeSidecars: true, want: native("web")},
		{name: "native sidecars mesh-wide, pod opts out: hold", nativeSidecars: true,
			in: annotate(web(), "sidecar.istio.io/nativeSidecar", "false"), want: held("20s")},
		{name: "istio-proxy customised with a preStop of its own: no hold, the user's hook kept",
			in: edit(web(), func(p *corev1.PodTemplateSpec) {
				p.Spec.Containers = append(p.Spec.Containers, customProxy(&corev1.Lifecycle{PreStop: execHook("sleep", "15")}))
			}),
			want: podShape{InitContainers: []string{"istio-init"}, Containers: []string{"web", proxyName}, Hold: holdShape{PreStop: []string{"sleep", "15"}}}},
		{name: "istio-proxy customised without a preStop: hold added, the customisation kept",
			in: edit(web(), func(p *corev1.PodTemplateSpec) {
				p.Spec.Containers = append(p.Spec.Containers, customProxy(&corev1.Lifecycle{PostStart: execHook("sleep", "1")}))
			}),
			want: withPostStart(held("20s"), "sleep", "1")},
		{name: "holdApplicationUntilProxyStarts: istio-proxy first, its postStart kept next to the hold",
			in:   annotate(web(), "proxy.istio.io/config", `{"holdApplicationUntilProxyStarts": true}`),
			want: withPostStart(withHold(inits, []string{proxyName, "web"}, wantHold("20s")), "pilot-agent", "wait")},
		{name: "istio-proxy as root (capNetBindService): hold added alike",
			in: annotate(web(), "sidecar.istio.io/capNetBindService", "true"), want: held("20s")},
		{name: "interceptionMode NONE: no istio-init, the install container alone",
			in: annotate(web(), "sidecar.istio.io/interceptionMode", "NONE"), want: held("20s", installName)},
		{name: "hand-written deploy/deployment.yaml keeps its own hold", in: &handWritten,
			want: withHold(inits, []string{"app", proxyName}, wantHold("20s"))},
	}
}

// valuesCases run on istiod's chart rendered with their values: a mesh-wide
// istio-proxy lifecycle, the mesh-wide switches and the pod's way back in,
// Istio's CNI, holdApplicationUntilProxyStarts mesh-wide.
func valuesCases() []injectCase {
	lifecycle := func(hook string, cmd ...string) map[string]any {
		return map[string]any{"global": map[string]any{"proxy": map[string]any{"lifecycle": map[string]any{
			hook: map[string]any{"exec": map[string]any{"command": cmd}}}}}}
	}
	return append([]injectCase{
		{name: "global.proxy.lifecycle with a preStop: no hold", values: lifecycle("preStop", "sleep", "5"), in: deployment("web", "web"),
			want: podShape{InitContainers: []string{"istio-init"}, Containers: []string{"web", proxyName}, Hold: holdShape{PreStop: []string{"sleep", "5"}}}},
		{name: "global.proxy.lifecycle with a postStart only: hold added next to it", values: lifecycle("postStart", "sleep", "1"),
			in: deployment("web", "web"), want: withPostStart(held("20s"), "sleep", "1")},
		{name: "pilot.cni.enabled: istio-validation first, then the pod's, then install", values: cniValues, in: edit(deployment("web", "web"), withMigrate),
			want: held("20s", "istio-validation", "migrate", installName)},
		{name: "pilot.env.SIDECAR_SUPERVISOR_HOLD false: no hold mesh-wide", values: pilotEnv("SIDECAR_SUPERVISOR_HOLD", "false"),
			in: deployment("web", "web"), want: unheld},
		{name: "pilot.env.SIDECAR_SUPERVISOR_HOLD false, pod annotated hold true: hold", values: pilotEnv("SIDECAR_SUPERVISOR_HOLD", "false"),
			in: annotate(deployment("web", "web"), annotationPrefix+"hold", "true"), want: held("20s")},
		// istio-validation in place of istio-init.
		{name: "pilot.cni.enabled, job: the supervisor and no hold", values: cniValues, in: job("sleep", corev1.RestartPolicyNever, nil, "app"),
			want: withInits(containerSupervised(), "istio-validation")},
		// The values' half of the template's test (the other half, the
		// pod's ProxyConfig, is in injectCases).
		{name: "global.proxy.holdApplicationUntilProxyStarts, job: istio-proxy first, the supervisor last",
			values: proxyFirstValues, in: job("sleep", corev1.RestartPolicyNever, nil, "app"), want: proxyFirstJob()},
		{name: "pilot.env.SIDECAR_SUPERVISOR_IMAGE: the image mesh-wide", values: pilotEnv("SIDECAR_SUPERVISOR_IMAGE", mirrorImage),
			in: job("sleep", corev1.RestartPolicyNever, nil, "app"), image: mirrorImage, want: containerSupervised()},
	}, nativeValuesCases()...)
}

// Helm values: Istio's CNI, holdApplicationUntilProxyStarts mesh-wide.
var (
	cniValues        = map[string]any{"pilot": map[string]any{"cni": map[string]any{"enabled": true}}}
	proxyFirstValues = map[string]any{"global": map[string]any{"proxy": map[string]any{"holdApplicationUntilProxyStarts": true}}}
)

// withMigrate gives a pod the init container "migrate" of its own.
func withMigrate(p *corev1.PodTemplateSpec) {
	p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "busybox:1.37"}}
}

// pilotEnv is Helm values setting istiod's environment variable name.
func pilotEnv(name, value string) map[string]any {
	return map[string]any{"pilot": map[string]any{"env": map[string]any{name: value}}}
}

// mirrorImage is the supervisor's image as a private mirror serves it.
const mirrorImage = "registry.example.com/mirror/sidecar-supervisor:v0.1.0"

// webhookWithNode starts Istio's webhook watching a fake cluster that holds
// one Node with the given kubelet version.
func webhookWithNode(t *testing.T, in istioInstall, kubelet string) http.Handler {
	t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status:     corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: kubelet}},
	}
	clusters := multicluster.NewFakeController()
	hook, err := injector.NewWebhook(in, clusters)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	client := kube.NewFakeClient(node)
	clusters.Add(cluster.ID("Kubernetes"), client, stop)
	if !client.RunAndWait(stop) {
		t.Fatal("fake cluster did not sync")
	}
	return hook
}
