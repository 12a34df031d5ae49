package inject

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const restartPolicyAnnotation = annotationPrefix + "restart-policy"

// kustomizeBuild runs `kustomize build dir` through kustomize's Go API.
func kustomizeBuild(fs filesys.FileSystem, dir string) (map[string][]byte, error) {
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		out[r.GetKind()+"/"+r.GetName()] = b
	}
	return out, nil
}

// TestKustomizeComponent builds deploy/kustomize/example (both components)
// and checks each workload: strict decoding, the supervisor last in the Job
// and the CronJob with the pod's own restartPolicy reaching
// SUPERVISOR_RESTART_POLICY, the hold in the Deployment and only there, the
// overlay's tuning applied on top of the components. Then each goes through
// Istio's webhook, which must keep what the components added and add only
// its own containers.
func TestKustomizeComponent(t *testing.T) {
	built, err := kustomizeBuild(filesys.MakeFsOnDisk(), filepath.Join(deployDir, "kustomize", "example"))
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	// Every setting comes from its pod annotation through the downward API.
	env := map[string]string{
		"SUPERVISOR_RESTART_POLICY": "fieldRef:metadata.annotations['" + restartPolicyAnnotation + "']",
		"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
	}
	for v, key := range settingAnnotations {
		env[v] = "fieldRef:metadata.annotations['" + annotationPrefix + key + "']"
	}
	withSupervisor := supervisorLast(env, "app")
	withHold := podShape{
		InitContainers:        []string{installName},
		Containers:            []string{proxyName, "web"},
		ShareProcessNamespace: true,
		Hold:                  kustomizeHold(),
	}
	for _, tc := range []struct {
		resource string
		obj      runtime.Object
		want     podShape
		// The restart-policy annotation the pod template must carry.
		wantRestart string
		// The supervisor's (or for the hold, istio-proxy's) non-empty
		// settings once kubelet has resolved the downward API references
		// against the pod's annotations.
		wantResolved map[string]string
	}{
		{resource: "Job/migrate", obj: &batchv1.Job{}, want: withSupervisor, wantRestart: "Never",
			wantResolved: map[string]string{"SUPERVISOR_RESTART_POLICY": "Never", "SUPERVISOR_ON_SUCCESS": quitURL}},
		{resource: "CronJob/nightly-report", obj: &batchv1.CronJob{}, want: withSupervisor, wantRestart: "OnFailure",
			wantResolved: map[string]string{"SUPERVISOR_RESTART_POLICY": "OnFailure", "SUPERVISOR_ON_SUCCESS": quitURL, "SUPERVISOR_STOP_TIMEOUT": "60s"}},
		{resource: "Deployment/web", obj: &appsv1.Deployment{}, want: withHold, wantResolved: map[string]string{"SUPERVISOR_HOLD_TIMEOUT": "50s"}},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			tmpl := checkKustomized(t, built, tc.resource, tc.obj, tc.want)
			got, isSet := tmpl.Annotations[restartPolicyAnnotation]
			if tc.wantRestart == "" && isSet {
				t.Errorf("annotation %s set on a workload the component must not touch", restartPolicyAnnotation)
			}
			if got != tc.wantRestart {
				t.Errorf("annotation %s = %q, want %q", restartPolicyAnnotation, got, tc.wantRestart)
			}
			if tc.wantRestart != "" && got != string(tmpl.Spec.RestartPolicy) {
				t.Errorf("annotation %s = %q, pod restartPolicy = %q", restartPolicyAnnotation, got, tmpl.Spec.RestartPolicy)
			}
			name := supervisorName
			if tc.wantRestart == "" {
				name = proxyName
			}
			if diff := cmp.Diff(tc.wantResolved, resolveEnv(*tmpl, name)); diff != "" {
				t.Errorf("%s settings as kubelet resolves them (-want +got):\n%s", name, diff)
			}
			t.Run("through istio's webhook", func(t *testing.T) { checkKustomizedInjected(t, tc.obj, tc.want) })
		})
	}
}

// checkKustomized decodes resource of built strictly into obj and checks
// its pod template with checkSupervised: shape want, the supervisor (if
// any) after the apps.
func checkKustomized(t *testing.T, built map[string][]byte, resource string, obj runtime.Object, want podShape) *corev1.PodTemplateSpec {
	t.Helper()
	b, ok := built[resource]
	if !ok {
		t.Fatalf("kustomize output has no %s; has %v", resource, slices.Sorted(maps.Keys(built)))
	}
	decodeStrict(t, b, obj)
	tmpl := podTemplateFor(obj)
	checkSupervised(t, tmpl.Spec, want, wantBasics(false), false, "pod template", string(b))
	return tmpl
}

// checkKustomizedInjected runs obj's pod, whose template has shape want,
// through Istio's webhook and checks it with checkSupervised: istio-init
// after the pod's init containers, istio-proxy moved last, and the
// component's supervisor still after the apps, without
// SUPERVISOR_AFTER_APPS (only istio-proxy follows it).
func checkKustomizedInjected(t *testing.T, obj runtime.Object, want podShape) *corev1.Pod {
	t.Helper()
	pod := admit(t, newWebhook(t, installs(t)[0]), podFor(obj))
	want.InitContainers = append(slices.Clone(want.InitContainers), "istio-init")
	want.Containers = append(slices.DeleteFunc(slices.Clone(want.Containers), func(c string) bool { return c == proxyName }), proxyName)
	checkSupervised(t, pod.Spec, want, wantBasics(false), true, "injected pod", dump(pod))
	return pod
}

// TestKustomizePatchesAgree checks that the component's CronJob patches are
// its Job patches one level deeper: same pod settings, same container, same
// copy of the restartPolicy into the same annotation.
func TestKustomizePatchesAgree(t *testing.T) {
	dir := filepath.Join("kustomize", "supervisor")
	var j batchv1.Job
	var c batchv1.CronJob
	decodeStrict(t, readDeploy(t, filepath.Join(dir, "job-pod.yaml")), &j)
	decodeStrict(t, readDeploy(t, filepath.Join(dir, "cronjob-pod.yaml")), &c)
	if diff := cmp.Diff(j.Spec.Template, c.Spec.JobTemplate.Spec.Template); diff != "" {
		t.Errorf("job-pod.yaml and cronjob-pod.yaml differ (-job +cronjob):\n%s", diff)
	}
	wantAnnotations := map[string]string{restartPolicyAnnotation: "", annotationPrefix + "on-success": quitURL}
	if diff := cmp.Diff(wantAnnotations, j.Spec.Template.Annotations); diff != "" {
		t.Errorf("job-pod.yaml annotations (-want +got):\n%s", diff)
	}

	// The JSON patches, with each container value decoded strictly.
	type op struct {
		Op    string            `json:"op"`
		From  string            `json:"from,omitempty"`
		Path  string            `json:"path"`
		Value *corev1.Container `json:"value,omitempty"`
	}
	annotation := "/metadata/annotations/" + strings.ReplaceAll(restartPolicyAnnotation, "/", "~1")
	var container *corev1.Container
	for _, tc := range []struct{ file, root string }{
		{"job-supervisor.yaml", "/spec/template"},
		{"cronjob-supervisor.yaml", "/spec/jobTemplate/spec/template"},
	} {
		var ops []op
		decodeStrict(t, readDeploy(t, filepath.Join(dir, tc.file)), &ops)
		if len(ops) != 2 || ops[1].Value == nil {
			t.Fatalf("%s: want a copy and an add of the container, got %+v", tc.file, ops)
		}
		if container == nil {
			container = ops[1].Value
		}
		want := []op{
			{Op: "copy", From: tc.root + "/spec/restartPolicy", Path: tc.root + annotation},
			{Op: "add", Path: tc.root + "/spec/containers/-", Value: container},
		}
		if diff := cmp.Diff(want, ops); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.file, diff)
		}
	}
}

// TestKustomizeOverlay builds an overlay of both components as users write
// one: its images field replaces the supervisor image both components add
// and leaves the hold's istio-proxy image (auto, Istio's) alone; every Job
// and CronJob pod gets the one setting the component gives a default of its
// own, pilot-agent's quit endpoint on success, and a patch in the overlay
// (applied after the components) gives one workload another action.
func TestKustomizeOverlay(t *testing.T) {
	const mirror = "registry.example.com/mirror/sidecar-supervisor:v0.1.1"
	out := buildOverlay(t, map[string]string{
		"/app/kustomization.yaml": `resources: [quit.yaml, drain.yaml, nightly.yaml, deployment.yaml]
components: [../supervisor, ../hold]
images:
- name: ghcr.io/sidecar-supervisor/sidecar-supervisor
  newName: registry.example.com/mirror/sidecar-supervisor
  newTag: v0.1.1
patches:
- target: {kind: Job, name: drain}
  patch: |-
    apiVersion: batch/v1
    kind: Job
    metadata: {name: drain}
    spec:
      template:
        metadata:
          annotations:
            supervisor.sidecar-supervisor.io/on-success: SIGTERM
`,
		"/app/quit.yaml":  jobYAML("quit"),
		"/app/drain.yaml": jobYAML("drain"),
		"/app/nightly.yaml": `apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: app
            image: busybox:1.37
`,
		"/app/deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: busybox:1.37
`,
	})
	jobImages := []string{"busybox:1.37", mirror}
	for _, tc := range []struct {
		resource string
		obj      runtime.Object
		// images: of the init containers, then the containers.
		images    []string
		onSuccess string
	}{
		{"Job/quit", &batchv1.Job{}, jobImages, quitURL},
		{"Job/drain", &batchv1.Job{}, jobImages, "SIGTERM"},
		{"CronJob/nightly", &batchv1.CronJob{}, jobImages, quitURL},
		{"Deployment/web", &appsv1.Deployment{}, []string{mirror, "auto", "busybox:1.37"}, ""},
	} {
		decodeStrict(t, out[tc.resource], tc.obj)
		tmpl := podTemplateFor(tc.obj)
		var images []string
		for _, c := range append(slices.Clone(tmpl.Spec.InitContainers), tmpl.Spec.Containers...) {
			images = append(images, c.Image)
		}
		if diff := cmp.Diff(tc.images, images); diff != "" {
			t.Errorf("%s images, init containers then containers (-want +got):\n%s\n%s", tc.resource, diff, out[tc.resource])
		}
		if got := resolveEnv(*tmpl, supervisorName)["SUPERVISOR_ON_SUCCESS"]; got != tc.onSuccess {
			t.Errorf("%s: SUPERVISOR_ON_SUCCESS resolves to %q, want %q\n%s", tc.resource, got, tc.onSuccess, out[tc.resource])
		}
	}
}

// jobYAML is a Job named name with one busybox container, as a user writes
// it, for an overlay's resources.
func jobYAML(name string) string {
	return `apiVersion: batch/v1
kind: Job
metadata:
  name: ` + name + `
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: app
        image: busybox:1.37
`
}

// buildOverlay builds the kustomization /app made of files (path: text),
// next to copies of the components deploy/kustomize/supervisor and
// deploy/kustomize/hold at /supervisor and /hold, all in memory.
func buildOverlay(t *testing.T, files map[string]string) map[string][]byte {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	for _, dir := range []string{"supervisor", "hold"} {
		src := filepath.Join(deployDir, "kustomize", dir)
		entries, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(src, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files[filepath.Join("/"+dir, e.Name())] = string(b)
		}
	}
	for name, text := range files {
		if err := fs.WriteFile(name, []byte(text)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := kustomizeBuild(fs, "/app")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	return out
}

// resolveEnv returns a container's SUPERVISOR_* variables with the values
// kubelet gives them: literal values, or the pod annotation a fieldRef names
// ("" when the pod lacks it). Empty values are left out.
func resolveEnv(tmpl corev1.PodTemplateSpec, container string) map[string]string {
	c := findContainer(tmpl.Spec, container)
	if c == nil {
		return nil
	}
	out := map[string]string{}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "SUPERVISOR_") {
			continue
		}
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			path := e.ValueFrom.FieldRef.FieldPath
			key, ok := strings.CutPrefix(path, "metadata.annotations['")
			key, ok2 := strings.CutSuffix(key, "']")
			if !ok || !ok2 {
				v = "unresolved:" + path
			} else {
				v = tmpl.Annotations[key]
			}
		}
		if v != "" {
			out[e.Name] = v
		}
	}
	return out
}

// kustomizeHold is the hold as the hold component adds it: as the template's,
// with the settings read from the pod's annotations.
func kustomizeHold() holdShape {
	h := wantHold("")
	h.Env = map[string]string{}
	for v, a := range holdSettings {
		h.Env[v] = "fieldRef:metadata.annotations['" + annotationPrefix + a + "']"
	}
	return h
}

// holdSettings are the SUPERVISOR_* variables the hold reads from pod
// annotations, in both the injection template and the hold component.
var holdSettings = map[string]string{
	"SUPERVISOR_HOLD_TIMEOUT":     "hold-timeout",
	"SUPERVISOR_APPS":             "apps",
	"SUPERVISOR_LOG_LEVEL":        "log-level",
	"SUPERVISOR_LOG_FORMAT":       "log-format",
	"SUPERVISOR_IGNORE_PROCESSES": "ignore-processes",
}

// TestKustomizeHoldTargets runs the hold component over every kind it
// targets and some it must not touch: a Deployment with init containers of
// its own (the install container goes first) and an istio-proxy
// customisation of its own, a StatefulSet, a DaemonSet, a Job.
func TestKustomizeHoldTargets(t *testing.T) {
	pod := `
    metadata:
      labels: {app: x, sidecar.istio.io/inject: "true"}
    spec:
      containers:
      - {name: app, image: busybox:1.37}
`
	out := buildOverlay(t, map[string]string{
		"/app/kustomization.yaml": "resources: [workloads.yaml]\ncomponents: [../hold]\n",
		"/app/workloads.yaml": `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  selector: {matchLabels: {app: x}}
  template:` + pod + `---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: x}}
  template:` + pod + `---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: app, image: busybox:1.37}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata:
      labels: {app: x, sidecar.istio.io/inject: "true"}
    spec:
      initContainers:
      - {name: migrate, image: busybox:1.37}
      containers:
      - {name: app, image: busybox:1.37}
      - name: istio-proxy
        image: auto
        resources: {requests: {cpu: 200m}}
`,
	})
	// Before injection istio-proxy comes first (the strategic merge puts
	// new items first); Istio's injector moves it last.
	hold := podShape{
		InitContainers:        []string{installName},
		Containers:            []string{proxyName, "app"},
		ShareProcessNamespace: true,
		Hold:                  kustomizeHold(),
	}
	web := hold
	web.InitContainers = []string{installName, "migrate"}
	for _, tc := range []struct {
		resource string
		obj      runtime.Object
		want     podShape
	}{
		{"StatefulSet/db", &appsv1.StatefulSet{}, hold},
		{"DaemonSet/agent", &appsv1.DaemonSet{}, hold},
		{"Deployment/web", &appsv1.Deployment{}, web},
		{"Job/once", &batchv1.Job{}, podShape{Containers: []string{"app"}}},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			checkKustomized(t, out, tc.resource, tc.obj, tc.want)
			if tc.resource == "Job/once" {
				return
			}
			// Istio's webhook merges the hold into its istio-proxy and
			// keeps the workload's own customisation.
			pod := checkKustomizedInjected(t, tc.obj, tc.want)
			if tc.resource == "Deployment/web" {
				if p := findEither(pod.Spec, proxyName); p == nil || p.Resources.Requests.Cpu().String() != "200m" {
					t.Errorf("istio-proxy's own cpu request lost:\n%s", dump(pod))
				}
			}
		})
	}
}

// TestKustomizeHoldAgrees checks that the hold component adds what
// deploy/deployment.yaml has by hand: the same install container, volume,
// istio-proxy image, hook and mount, the hold timeout (from an annotation
// rather than a literal), and the shared PID namespace.
func TestKustomizeHoldAgrees(t *testing.T) {
	var hand, comp appsv1.Deployment
	decodeStrict(t, readDeploy(t, "deployment.yaml"), &hand)
	decodeStrict(t, readDeploy(t, filepath.Join("kustomize", "hold", "hold.yaml")), &comp)
	h, c := hand.Spec.Template.Spec, comp.Spec.Template.Spec
	for what, pair := range map[string][2]any{"install container": {h.InitContainers, c.InitContainers},
		"volumes": {h.Volumes, c.Volumes}, "shareProcessNamespace": {h.ShareProcessNamespace, c.ShareProcessNamespace}} {
		if diff := cmp.Diff(pair[0], pair[1]); diff != "" {
			t.Errorf("%s (-deployment.yaml +hold.yaml):\n%s", what, diff)
		}
	}
	if len(c.Containers) != 1 {
		t.Fatalf("hold.yaml: want istio-proxy as its only container, got %d", len(c.Containers))
	}
	hp, cp := findContainer(h, proxyName), findContainer(c, proxyName)
	if hp == nil || cp == nil {
		t.Fatalf("no %s container: deployment.yaml %v, hold.yaml %v", proxyName, hp != nil, cp != nil)
	}
	// Only the hold's fields (the environment compared by name below).
	rest := *cp.DeepCopy()
	rest.Env = nil
	wantRest := corev1.Container{Name: proxyName, Image: hp.Image, Lifecycle: hp.Lifecycle, VolumeMounts: hp.VolumeMounts}
	if diff := cmp.Diff(wantRest, rest); diff != "" {
		t.Errorf("istio-proxy (-deployment.yaml +hold.yaml):\n%s", diff)
	}
	for _, f := range []struct {
		file string
		c    *corev1.Container
		want []string
	}{
		{"deployment.yaml", hp, []string{"SUPERVISOR_HOLD_TIMEOUT", "SUPERVISOR_APPS"}},
		{"hold.yaml", cp, []string{"SUPERVISOR_HOLD_TIMEOUT", "SUPERVISOR_APPS", "SUPERVISOR_LOG_LEVEL", "SUPERVISOR_LOG_FORMAT", "SUPERVISOR_IGNORE_PROCESSES"}},
	} {
		var names []string
		for _, e := range f.c.Env {
			names = append(names, e.Name)
		}
		if diff := cmp.Diff(f.want, names); diff != "" {
			t.Errorf("%s istio-proxy env names (-want +got):\n%s", f.file, diff)
		}
	}
}
