package inject

import (
	"os"
	"path/filepath"
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

// TestKustomizeComponent builds deploy/kustomize/example and checks each
// workload: strict decoding, the supervisor last in the Job and the CronJob
// with the pod's own restartPolicy reaching SUPERVISOR_RESTART_POLICY, the
// overlay's tuning applied on top of the component, the Deployment untouched.
// Then the Job and CronJob go through Istio's webhook, which must keep the
// component's supervisor and add only its own containers.
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
	withSupervisor := podShape{
		Containers:            []string{"app", supervisorName},
		ShareProcessNamespace: true,
		SupervisorEnv:         env,
		SupervisorUser:        "1337",
	}
	for _, tc := range []struct {
		resource string
		obj      runtime.Object
		want     podShape
		// The restart-policy annotation the pod template must carry.
		wantRestart string
		// The supervisor's non-empty settings once kubelet has resolved the
		// downward API references against the pod's annotations.
		wantResolved map[string]string
	}{
		{
			resource: "Job/migrate", obj: &batchv1.Job{},
			want:         withSupervisor,
			wantRestart:  "Never",
			wantResolved: map[string]string{"SUPERVISOR_RESTART_POLICY": "Never"},
		},
		{
			resource: "CronJob/nightly-report", obj: &batchv1.CronJob{},
			want:        withSupervisor,
			wantRestart: "OnFailure",
			wantResolved: map[string]string{
				"SUPERVISOR_RESTART_POLICY": "OnFailure",
				"SUPERVISOR_STOP_TIMEOUT":   "60s",
			},
		},
		{
			resource: "Deployment/web", obj: &appsv1.Deployment{},
			want: podShape{Containers: []string{"web"}},
		},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			b, ok := built[tc.resource]
			if !ok {
				t.Fatalf("kustomize output has no %s; has %v", tc.resource, keys(built))
			}
			decodeStrict(t, b, tc.obj)
			tmpl := podTemplateFor(tc.obj)
			if diff := cmp.Diff(tc.want, shapeOf(tmpl.Spec)); diff != "" {
				t.Errorf("pod template (-want +got):\n%s\n%s", diff, b)
			}
			checkOrder(t, tmpl.Spec, false)
			checkSupervisorBasics(t, tmpl.Spec, wantBasics(false))
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
			if tc.wantRestart == "" {
				return
			}
			if diff := cmp.Diff(tc.wantResolved, resolveEnv(*tmpl)); diff != "" {
				t.Errorf("supervisor settings as kubelet resolves them (-want +got):\n%s", diff)
			}
			t.Run("through istio's webhook", func(t *testing.T) {
				pod := admit(t, newWebhook(t, installs(t)[0]), podFor(tc.obj))
				want := tc.want
				want.InitContainers = []string{"istio-init"}
				want.Containers = append(append([]string{}, want.Containers...), proxyName)
				if diff := cmp.Diff(want, shapeOf(pod.Spec)); diff != "" {
					t.Errorf("injected pod (-want +got):\n%s\n%s", diff, dump(pod))
				}
			})
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
	if got := j.Spec.Template.Annotations; len(got) != 1 || got[restartPolicyAnnotation] != "" {
		t.Errorf("job-pod.yaml annotations = %v, want only an empty %s", got, restartPolicyAnnotation)
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

// TestKustomizeImageOverride checks that an overlay's images field replaces
// the supervisor image the component adds.
func TestKustomizeImageOverride(t *testing.T) {
	const mirror = "registry.example.com/mirror/sidecar-supervisor"
	fs := componentInMemory(t)
	for name, text := range map[string]string{
		"/app/kustomization.yaml": `resources: [job.yaml]
components: [../supervisor]
images:
- name: ghcr.io/sidecar-supervisor/sidecar-supervisor
  newName: ` + mirror + `
  newTag: v0.1.1
`,
		"/app/job.yaml": `apiVersion: batch/v1
kind: Job
metadata:
  name: job
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: app
        image: busybox:1.37
`,
	} {
		if err := fs.WriteFile(name, []byte(text)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := kustomizeBuild(fs, "/app")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	var j batchv1.Job
	decodeStrict(t, out["Job/job"], &j)
	want := []string{"busybox:1.37", mirror + ":v0.1.1"}
	var got []string
	for _, c := range j.Spec.Template.Spec.Containers {
		got = append(got, c.Image)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("container images (-want +got):\n%s\n%s", diff, out["Job/job"])
	}
}

// componentInMemory copies deploy/kustomize/supervisor into an in-memory
// file system at /supervisor.
func componentInMemory(t *testing.T) filesys.FileSystem {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	src := filepath.Join(deployDir, "kustomize", "supervisor")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile(filepath.Join("/supervisor", e.Name()), b); err != nil {
			t.Fatal(err)
		}
	}
	return fs
}

// resolveEnv returns the supervisor's SUPERVISOR_* variables with the values
// kubelet gives them: literal values, or the pod annotation a fieldRef names
// ("" when the pod lacks it). Empty values are left out.
func resolveEnv(tmpl corev1.PodTemplateSpec) map[string]string {
	c := findContainer(tmpl.Spec, supervisorName)
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

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
