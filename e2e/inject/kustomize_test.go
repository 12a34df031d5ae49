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
func kustomizeBuild(t *testing.T, fs filesys.FileSystem, dir string) map[string][]byte {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out := map[string][]byte{}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		out[r.GetKind()+"/"+r.GetName()] = b
	}
	return out
}

// TestKustomizeBuilds builds deploy/kustomize/example, an overlay of both
// components as users write one (a mirror in its images field, which leaves
// the hold's istio-proxy image, auto, to Istio; a patch of its own on top of
// the component's on-success), and the hold component alone (every kind it
// targets, and a Job it must leave alone). Each workload has the shape
// wanted, the restart-policy annotation and the settings the kubelet
// resolves, and keeps what the components added through Istio's webhook.
func TestKustomizeBuilds(t *testing.T) {
	const mirror = "registry.example.com/mirror/sidecar-supervisor:v0.1.1"
	pod := `
    metadata:
      labels: {app: x, sidecar.istio.io/inject: "true"}
    spec:
      containers:
      - {name: app, image: busybox:1.37}
`
	builds := map[string]map[string][]byte{
		"example": kustomizeBuild(t, filesys.MakeFsOnDisk(), filepath.Join(deployDir, "kustomize", "example")),
		"overlay": buildOverlay(t, map[string]string{
			"/app/kustomization.yaml": `resources: [jobs.yaml, nightly.yaml, deployment.yaml]
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
			"/app/jobs.yaml": jobYAML("quit") + "---\n" + jobYAML("drain"),
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
		}),
		"hold": buildOverlay(t, map[string]string{
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
` + jobYAML("once") + `---
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
		}),
	}
	// Every setting comes from its pod annotation through the downward API.
	env := map[string]string{
		"SUPERVISOR_RESTART_POLICY": annotationRef("restart-policy"),
		"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
	}
	for v, key := range settingAnnotations {
		env[v] = annotationRef(key)
	}
	job := supervisorLast(env, "app")
	// Before injection istio-proxy comes first (the strategic merge puts
	// new items first); Istio's injector moves it last.
	hold := func(inits []string, app string) podShape {
		return podShape{InitContainers: inits, Containers: []string{proxyName, app}, ShareProcessNamespace: true, Hold: kustomizeHold()}
	}
	web, install := hold([]string{installName}, "web"), []string{installName}
	onSuccess := func(restart, action string, kv ...string) map[string]string {
		return setPairs(map[string]string{"SUPERVISOR_RESTART_POLICY": restart, "SUPERVISOR_ON_SUCCESS": action}, kv...)
	}
	jobImages := []string{"busybox:1.37", mirror}
	for _, tc := range []struct {
		build, resource string
		obj             runtime.Object
		want            podShape
		// The restart-policy annotation the pod template must carry.
		restart string
		// The supervisor's (or else istio-proxy's) non-empty settings once
		// the kubelet has resolved the downward API references against
		// the pod's annotations.
		resolved map[string]string
		// images: of the init containers, then the containers; nil: not
		// checked.
		images []string
		// proxyCPU: istio-proxy's own cpu request, kept by the injection.
		proxyCPU string
	}{
		{"example", "Job/migrate", &batchv1.Job{}, job, "Never", onSuccess("Never", quitURL), nil, ""},
		{"example", "CronJob/nightly-report", &batchv1.CronJob{}, job, "OnFailure", onSuccess("OnFailure", quitURL, "SUPERVISOR_STOP_TIMEOUT", "60s"), nil, ""},
		{"example", "Deployment/web", &appsv1.Deployment{}, web, "", map[string]string{"SUPERVISOR_HOLD_TIMEOUT": "50s"}, nil, ""},
		{"overlay", "Job/quit", &batchv1.Job{}, job, "Never", onSuccess("Never", quitURL), jobImages, ""},
		{"overlay", "Job/drain", &batchv1.Job{}, job, "Never", onSuccess("Never", "SIGTERM"), jobImages, ""},
		{"overlay", "CronJob/nightly", &batchv1.CronJob{}, job, "OnFailure", onSuccess("OnFailure", quitURL), jobImages, ""},
		{"overlay", "Deployment/web", &appsv1.Deployment{}, web, "", nil, []string{mirror, "auto", "busybox:1.37"}, ""},
		{"hold", "StatefulSet/db", &appsv1.StatefulSet{}, hold(install, "app"), "", nil, nil, ""},
		{"hold", "DaemonSet/agent", &appsv1.DaemonSet{}, hold(install, "app"), "", nil, nil, ""},
		{"hold", "Deployment/web", &appsv1.Deployment{}, hold([]string{installName, "migrate"}, "app"), "", nil, nil, "200m"},
		{"hold", "Job/once", &batchv1.Job{}, podShape{Containers: []string{"app"}}, "", nil, nil, ""},
	} {
		t.Run(tc.build+"/"+tc.resource, func(t *testing.T) {
			b, ok := builds[tc.build][tc.resource]
			if !ok {
				t.Fatalf("kustomize output has no %s; has %v", tc.resource, slices.Sorted(maps.Keys(builds[tc.build])))
			}
			decodeStrict(t, b, tc.obj)
			tmpl := podTemplateFor(tc.obj)
			basics := wantBasics(false)
			if tc.build == "overlay" {
				basics.Image = mirror
			}
			checkSupervised(t, tmpl.Spec, tc.want, basics, false, "pod template", string(b))
			got, isSet := tmpl.Annotations[restartPolicyAnnotation]
			if tc.restart == "" && isSet {
				t.Errorf("annotation %s set on a workload the component must not touch", restartPolicyAnnotation)
			}
			if got != tc.restart {
				t.Errorf("annotation %s = %q, want %q", restartPolicyAnnotation, got, tc.restart)
			}
			if tc.restart != "" && got != string(tmpl.Spec.RestartPolicy) {
				t.Errorf("annotation %s = %q, pod restartPolicy = %q", restartPolicyAnnotation, got, tmpl.Spec.RestartPolicy)
			}
			name := supervisorName
			if tc.want.SupervisorEnv == nil {
				name = proxyName
			}
			if diff := cmp.Diff(tc.resolved, resolveEnv(*tmpl, name)); diff != "" {
				t.Errorf("%s settings as the kubelet resolves them (-want +got):\n%s", name, diff)
			}
			if tc.images != nil {
				var images []string
				for _, c := range append(slices.Clone(tmpl.Spec.InitContainers), tmpl.Spec.Containers...) {
					images = append(images, c.Image)
				}
				if diff := cmp.Diff(tc.images, images); diff != "" {
					t.Errorf("images, init containers then containers (-want +got):\n%s\n%s", diff, b)
				}
			}
			if tc.want.SupervisorEnv == nil && tc.want.Hold.InstallArgs == nil {
				return // the supervisor template would add its own
			}
			// Through Istio's webhook: istio-init after the pod's init
			// containers, istio-proxy moved last, the component's
			// supervisor still after the apps, without
			// SUPERVISOR_AFTER_APPS (only istio-proxy follows it).
			pod := admit(t, newWebhook(t, installs(t)[0]), podFor(tc.obj))
			want := tc.want
			want.InitContainers = append(slices.Clone(want.InitContainers), "istio-init")
			want.Containers = append(slices.DeleteFunc(slices.Clone(want.Containers), func(c string) bool { return c == proxyName }), proxyName)
			checkSupervised(t, pod.Spec, want, basics, true, "injected pod", dump(pod))
			if p := findEither(pod.Spec, proxyName); tc.proxyCPU != "" && (p == nil || p.Resources.Requests.Cpu().String() != tc.proxyCPU) {
				t.Errorf("istio-proxy's own cpu request %s lost:\n%s", tc.proxyCPU, dump(pod))
			}
		})
	}
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
	return kustomizeBuild(t, fs, "/app")
}

// resolveEnv returns a container's SUPERVISOR_* variables with the values
// kubelet gives them: literal values, or the pod annotation a fieldRef names
// ("" when the pod lacks it). Empty values are left out; nil when none is
// left.
func resolveEnv(tmpl corev1.PodTemplateSpec, container string) map[string]string {
	c := findContainer(tmpl.Spec, container)
	if c == nil {
		return nil
	}
	var out map[string]string
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
			out = setPairs(out, e.Name, v)
		}
	}
	return out
}

// annotationRef is a setting's value from the pod annotation key (after
// annotationPrefix), as the components write it, in shapeOf's form.
func annotationRef(key string) string {
	return "fieldRef:metadata.annotations['" + annotationPrefix + key + "']"
}

// holdVars are the SUPERVISOR_* variables the hold component gives
// istio-proxy, in its order, each from its pod annotation (hold-timeout, or
// the supervisor's own: settingAnnotations).
var holdVars = []string{"SUPERVISOR_HOLD_TIMEOUT", "SUPERVISOR_APPS", "SUPERVISOR_LOG_LEVEL", "SUPERVISOR_LOG_FORMAT", "SUPERVISOR_IGNORE_PROCESSES"}

// kustomizeHold is the hold as the hold component adds it: as the template's,
// with the settings read from the pod's annotations.
func kustomizeHold() holdShape {
	h := wantHold(annotationRef("hold-timeout"))
	for _, v := range holdVars[1:] {
		h.Env[v] = annotationRef(settingAnnotations[v])
	}
	return h
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
		{"deployment.yaml", hp, holdVars[:2]},
		{"hold.yaml", cp, holdVars},
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
