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

func holdCases(t *testing.T) []injectCase {
	var handWritten appsv1.Deployment
	decodeStrict(t, readDeploy(t, "deployment.yaml"), &handWritten)
	handWritten.Namespace = namespace

	inits := []string{installName, "istio-init"}
	plain := podShape{InitContainers: []string{"istio-init"}, Containers: []string{"web", proxyName}}
	return []injectCase{
		{
			name: "deployment gets the hold",
			in:   deployment("web", "web"),
			want: withHold(inits, []string{"web", proxyName}, wantHold("20s")),
		},
		{
			name: "statefulset gets the hold",
			in:   statefulSet("db", "db"),
			want: withHold(inits, []string{"db", proxyName}, wantHold("20s")),
		},
		{
			name: "install container after the pod's init containers, before istio-init",
			in: edit(deployment("web", "web", "worker"), func(p *corev1.PodTemplateSpec) {
				p.Spec.InitContainers = []corev1.Container{
					{Name: "migrate", Image: "busybox:1.37"}, {Name: "warm", Image: "busybox:1.37"},
				}
			}),
			want: withHold([]string{"migrate", "warm", installName, "istio-init"},
				[]string{"web", "worker", proxyName}, wantHold("20s")),
		},
		{
			name: "terminationGracePeriodSeconds 60: hold 50s",
			in:   edit(deployment("web", "web"), grace(60)),
			want: withHold(inits, []string{"web", proxyName}, wantHold("50s")),
		},
		{
			name: "terminationDrainDuration 7.5s (proxy.istio.io/config): hold 30-8-5 = 17s",
			in: annotate(deployment("web", "web"),
				"proxy.istio.io/config", `{"terminationDrainDuration": "7.5s"}`),
			want: withHold(inits, []string{"web", proxyName}, wantHold("17s")),
		},
		{
			name: "terminationGracePeriodSeconds 10 leaves no time: no hold",
			in:   edit(deployment("web", "web"), grace(10)),
			want: plain,
		},
		{
			name: "terminationGracePeriodSeconds 11: hold 1s",
			in:   edit(deployment("web", "web"), grace(11)),
			want: withHold(inits, []string{"web", proxyName}, wantHold("1s")),
		},
		{
			name: "hold-timeout annotation wins, even over a short grace period",
			in:   annotate(edit(deployment("web", "web"), grace(10)), annotationPrefix+"hold-timeout", "3s"),
			want: withHold(inits, []string{"web", proxyName}, wantHold("3s")),
		},
		{
			name: "log and ignore annotations reach istio-proxy's environment; job-only ones do not",
			in: annotate(deployment("web", "web"),
				annotationPrefix+"hold-timeout", "45s",
				annotationPrefix+"log-level", "debug",
				annotationPrefix+"log-format", "console",
				annotationPrefix+"ignore-processes", "fluent-bit",
				annotationPrefix+"stop-timeout", "9s",
				annotationPrefix+"on-success", "SIGKILL"),
			want: withHold(inits, []string{"web", proxyName}, wantHold("45s",
				"SUPERVISOR_LOG_LEVEL", "debug",
				"SUPERVISOR_LOG_FORMAT", "console",
				"SUPERVISOR_IGNORE_PROCESSES", "fluent-bit")),
		},
		{
			name:  "image annotation sets the install container's image",
			in:    annotate(deployment("web", "web"), annotationPrefix+"image", mirrorImage),
			image: mirrorImage,
			want:  withHold(inits, []string{"web", proxyName}, wantHold("20s")),
		},
		{
			name: "hold false: no hold",
			in:   annotate(deployment("web", "web"), annotationPrefix+"hold", "false"),
			want: plain,
		},
		{
			name: "supervisor opt-out annotation: no hold",
			in:   annotate(deployment("web", "web"), annotationPrefix+"inject", "false"),
			want: plain,
		},
		{
			name:          "sidecar.istio.io/inject false: nothing at all",
			in:            edit(deployment("web", "web"), func(p *corev1.PodTemplateSpec) { p.Labels["sidecar.istio.io/inject"] = "false" }),
			want:          podShape{Containers: []string{"web"}},
			templateAlone: "hold",
		},
		{
			name:          "pod selects only the sidecar template: no hold",
			in:            annotate(deployment("web", "web"), "inject.istio.io/templates", "sidecar"),
			want:          plain,
			templateAlone: "hold",
		},
		{
			name: "native sidecar by pod annotation: no hold, Istio's drain hook kept",
			in:   annotate(deployment("web", "web"), "sidecar.istio.io/nativeSidecar", "true"),
			want: native("web"),
		},
		{
			name:           "native sidecar mesh-wide: no hold, Istio's drain hook kept",
			in:             deployment("web", "web"),
			nativeSidecars: true,
			want:           native("web"),
		},
		{
			name:           "native sidecars mesh-wide, pod opts out: hold",
			in:             annotate(deployment("web", "web"), "sidecar.istio.io/nativeSidecar", "false"),
			nativeSidecars: true,
			want:           withHold(inits, []string{"web", proxyName}, wantHold("20s")),
		},
		{
			name: "istio-proxy customised with a preStop of its own: no hold, the user's hook kept",
			in: edit(deployment("web", "web"), func(p *corev1.PodTemplateSpec) {
				p.Spec.Containers = append(p.Spec.Containers,
					customProxy(&corev1.Lifecycle{PreStop: execHook("sleep", "15")}))
			}),
			want: podShape{
				InitContainers: []string{"istio-init"},
				Containers:     []string{"web", proxyName},
				Hold:           holdShape{PreStop: []string{"sleep", "15"}},
			},
		},
		{
			name: "istio-proxy customised without a preStop: hold added, the customisation kept",
			in: edit(deployment("web", "web"), func(p *corev1.PodTemplateSpec) {
				p.Spec.Containers = append(p.Spec.Containers,
					customProxy(&corev1.Lifecycle{PostStart: execHook("sleep", "1")}))
			}),
			want: withHold(inits, []string{"web", proxyName}, func() holdShape {
				h := wantHold("20s")
				h.PostStart = []string{"sleep", "1"}
				return h
			}()),
		},
		{
			name: "holdApplicationUntilProxyStarts: istio-proxy first, its postStart kept next to the hold",
			in: annotate(deployment("web", "web"),
				"proxy.istio.io/config", `{"holdApplicationUntilProxyStarts": true}`),
			want: withHold(inits, []string{proxyName, "web"}, func() holdShape {
				h := wantHold("20s")
				h.PostStart = []string{"pilot-agent", "wait"}
				return h
			}()),
		},
		{
			name: "istio-proxy as root (capNetBindService): hold added alike",
			in:   annotate(deployment("web", "web"), "sidecar.istio.io/capNetBindService", "true"),
			want: withHold(inits, []string{"web", proxyName}, wantHold("20s")),
		},
		{
			name: "interceptionMode NONE: no istio-init, the install container alone",
			in:   annotate(deployment("web", "web"), "sidecar.istio.io/interceptionMode", "NONE"),
			want: withHold([]string{installName}, []string{"web", proxyName}, wantHold("20s")),
		},
		{
			name: "hand-written deploy/deployment.yaml keeps its own hold",
			in:   &handWritten,
			want: withHold(inits, []string{"app", proxyName}, wantHold("20s")),
		},
	}
}

// valuesCases run on istiod's chart rendered with their values: a mesh-wide
// istio-proxy lifecycle with a preStop keeps the pod out of the hold (and
// its hook stays); one with only a postStart is merged with the hold; the
// mesh-wide switches (the hold off, the image, the supervisor's shape:
// nativeValuesCases) and the pod's way back in; with Istio's CNI the install
// container follows the pod's init containers, after istio-validation. Jobs
// get the supervisor first, or last where the mesh-wide
// holdApplicationUntilProxyStarts puts istio-proxy first.
func valuesCases() []injectCase {
	withInit := edit(deployment("web", "web"), func(p *corev1.PodTemplateSpec) {
		p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "busybox:1.37"}}
	})
	hook := func(cmd ...string) map[string]any {
		return map[string]any{"exec": map[string]any{"command": cmd}}
	}
	return append([]injectCase{
		{
			name:   "global.proxy.lifecycle with a preStop: no hold",
			values: map[string]any{"global": map[string]any{"proxy": map[string]any{"lifecycle": map[string]any{"preStop": hook("sleep", "5")}}}},
			in:     deployment("web", "web"),
			want: podShape{
				InitContainers: []string{"istio-init"},
				Containers:     []string{"web", proxyName},
				Hold:           holdShape{PreStop: []string{"sleep", "5"}},
			},
		},
		{
			name:   "global.proxy.lifecycle with a postStart only: hold added next to it",
			values: map[string]any{"global": map[string]any{"proxy": map[string]any{"lifecycle": map[string]any{"postStart": hook("sleep", "1")}}}},
			in:     deployment("web", "web"),
			want: withHold([]string{installName, "istio-init"}, []string{"web", proxyName}, func() holdShape {
				h := wantHold("20s")
				h.PostStart = []string{"sleep", "1"}
				return h
			}()),
		},
		{
			name:   "pilot.cni.enabled: istio-validation first, then the pod's, then install",
			values: map[string]any{"pilot": map[string]any{"cni": map[string]any{"enabled": true}}},
			in:     withInit,
			want: withHold([]string{"istio-validation", "migrate", installName},
				[]string{"web", proxyName}, wantHold("20s")),
		},
		{
			name:   "pilot.env.SIDECAR_SUPERVISOR_HOLD false: no hold mesh-wide",
			values: map[string]any{"pilot": map[string]any{"env": map[string]any{"SIDECAR_SUPERVISOR_HOLD": "false"}}},
			in:     deployment("web", "web"),
			want:   podShape{InitContainers: []string{"istio-init"}, Containers: []string{"web", proxyName}},
		},
		{
			name:   "pilot.env.SIDECAR_SUPERVISOR_HOLD false, pod annotated hold true: hold",
			values: map[string]any{"pilot": map[string]any{"env": map[string]any{"SIDECAR_SUPERVISOR_HOLD": "false"}}},
			in:     annotate(deployment("web", "web"), annotationPrefix+"hold", "true"),
			want:   withHold([]string{installName, "istio-init"}, []string{"web", proxyName}, wantHold("20s")),
		},
		{
			name:   "pilot.cni.enabled, job: the supervisor and no hold",
			values: map[string]any{"pilot": map[string]any{"cni": map[string]any{"enabled": true}}},
			in:     job("sleep", corev1.RestartPolicyNever, nil, "app"),
			// istio-validation in place of istio-init.
			want: func() podShape { s := containerSupervised(); s.InitContainers = []string{"istio-validation"}; return s }(),
		},
		{
			// The values' half of the template's test (the other half, the
			// pod's ProxyConfig, is in injectCases).
			name:   "global.proxy.holdApplicationUntilProxyStarts, job: istio-proxy first, the supervisor last",
			values: map[string]any{"global": map[string]any{"proxy": map[string]any{"holdApplicationUntilProxyStarts": true}}},
			in:     job("sleep", corev1.RestartPolicyNever, nil, "app"),
			want:   proxyFirstJob(),
		},
		{
			name:   "pilot.env.SIDECAR_SUPERVISOR_IMAGE: the image mesh-wide",
			values: map[string]any{"pilot": map[string]any{"env": map[string]any{"SIDECAR_SUPERVISOR_IMAGE": mirrorImage}}},
			in:     job("sleep", corev1.RestartPolicyNever, nil, "app"),
			image:  mirrorImage,
			want:   containerSupervised(),
		},
	}, nativeValuesCases()...)
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
