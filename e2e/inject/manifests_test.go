package inject

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// podTemplateOf decodes a Job, CronJob or Deployment manifest strictly and
// returns its pod template.
func podTemplateOf(t *testing.T, kind string, data []byte) corev1.PodTemplateSpec {
	t.Helper()
	obj := map[string]runtime.Object{"Job": &batchv1.Job{}, "CronJob": &batchv1.CronJob{}, "Deployment": &appsv1.Deployment{}}[kind]
	if obj == nil {
		t.Fatalf("unexpected kind %q", kind)
	}
	decodeStrict(t, data, obj)
	return *podTemplateFor(obj)
}

// rootRefusals are Pod Security's verdicts (podSecurityOf) on a supervisor
// run as root with caps added (exit-status ptrace or accounting): refused
// by "baseline" for those of caps outside its list (KILL is in it;
// SYS_PTRACE and SYS_PACCT are not), hence admitted by "privileged" only.
func rootRefusals(caps []string) []string {
	quoted := func(cs []string) string {
		cs = slices.Sorted(slices.Values(cs))
		for i, c := range cs {
			cs[i] = `"` + c + `"`
		}
		return strings.Join(cs, ", ")
	}
	notBaseline := slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == "KILL" })
	return []string{
		`unrestricted capabilities: container "sidecar-supervisor" must not include ` + quoted(caps) + ` in securityContext.capabilities.add` + "\n" +
			`runAsNonRoot != true: container "sidecar-supervisor" must not set securityContext.runAsNonRoot=false` + "\n" +
			`runAsUser=0: container "sidecar-supervisor" must not set runAsUser=0`,
		`non-default capabilities: container "sidecar-supervisor" must not include ` + quoted(notBaseline) + ` in securityContext.capabilities.add`,
		"",
	}
}

// TestHandWrittenManifests checks deploy/job.yaml, cronjob.yaml,
// job-native.yaml, job-ptrace.yaml and deployment.yaml with
// checkHandWritten; and for deployment.yaml, the hold timeout following the
// template's rule from the pod's terminationGracePeriodSeconds and Istio's
// default drain, and restartPolicy left to the Deployment default (Always).
func TestHandWrittenManifests(t *testing.T) {
	for _, tc := range []struct {
		file   string
		kind   string
		ptrace bool
		want   podShape
	}{
		{
			// Written out, the others through handJobEnv and supervisorEnv.
			file: "job.yaml", kind: "Job",
			want: supervisorLast(map[string]string{
				"SUPERVISOR_RESTART_POLICY": "Never",
				"SUPERVISOR_APP_CONTAINERS": "1",
				"SUPERVISOR_APPS":           "app",
				"SUPERVISOR_ON_SUCCESS":     quitURL,
				"SUPERVISOR_ON_FAILURE":     "SIGKILL",
				"SUPERVISOR_STOP_TIMEOUT":   "30s",
				"SUPERVISOR_EXIT_STATUS":    "auto",
				"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
			}, "app"),
		},
		{file: "cronjob.yaml", kind: "CronJob", want: supervisorLast(handJobEnv("OnFailure"), "app")},
		// The native shape by hand: an init container before the app,
		// istio-proxy (added by Istio's injector) last; the template's
		// environment, with its state directory, and the Jobs'.
		{file: "job-native.yaml", kind: "Job", want: podShape{InitContainers: []string{supervisorName}, Containers: []string{"app"}, ShareProcessNamespace: true,
			SupervisorEnv: nativeEnv("Never", "app", "SUPERVISOR_STOP_TIMEOUT", "30s", "SUPERVISOR_ON_FAILURE", "SIGKILL", "SUPERVISOR_EXIT_STATUS", "auto"), SupervisorUser: "1337"}},
		// istio-proxy customised, with the state volume mounted (process
		// accounting goes through its mount).
		{
			file: "job-ptrace.yaml", kind: "Job", ptrace: true,
			want: asRoot(supervisorLast(handJobEnv("Never", "SUPERVISOR_EXIT_STATUS", "ptrace", "SUPERVISOR_ON_FAILURE", "SIGKILL", stateVar, stateDir), "app", proxyName)),
		},
		// The hold exactly as the injection template adds it.
		{file: "deployment.yaml", kind: "Deployment", want: withHold([]string{installName}, []string{"app", proxyName}, wantHold("20s"))},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tmpl := podTemplateOf(t, tc.kind, readDeploy(t, tc.file))
			checkHandWritten(t, tmpl, tc.want, tc.ptrace)
			spec := tmpl.Spec
			// With image: auto, imagePullPolicy too: the API server would
			// default it to Always (no tag), and Istio's merge keeps it (seen
			// on the cluster: ErrImagePull where the node cannot pull).
			if p := findContainer(spec, proxyName); slices.Contains(tc.want.Containers, proxyName) && (p == nil || p.Image != "auto" || p.ImagePullPolicy != corev1.PullIfNotPresent) {
				t.Errorf("istio-proxy must be a customisation with image: auto and imagePullPolicy: IfNotPresent, got %+v", p)
			}
			if tc.kind != "Deployment" {
				return
			}
			if spec.RestartPolicy != "" && spec.RestartPolicy != corev1.RestartPolicyAlways {
				t.Errorf("restartPolicy = %q, want Always (unset)", spec.RestartPolicy)
			}
			// grace - drain (Istio's default 5s) - 5s margin, as the template does.
			if spec.TerminationGracePeriodSeconds == nil {
				t.Fatal("terminationGracePeriodSeconds not set: the hold timeout is derived from it")
			}
			hold, err := time.ParseDuration(shapeOf(spec).Hold.Env["SUPERVISOR_HOLD_TIMEOUT"])
			if err != nil {
				t.Fatal(err)
			}
			if want := time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second - 5*time.Second - 5*time.Second; hold != want {
				t.Errorf("SUPERVISOR_HOLD_TIMEOUT = %v, want terminationGracePeriodSeconds - 5s drain - 5s = %v", hold, want)
			}
		})
	}
}

// checkHandWritten checks a pod template written by hand: its shape is want
// (checkSupervised, with wantBasics(ptrace)); the settings copied by hand
// from the pod agree with it (checkConsistent); it asks Istio for
// istio-proxy.
func checkHandWritten(t *testing.T, tmpl corev1.PodTemplateSpec, want podShape, ptrace bool) {
	t.Helper()
	checkSupervised(t, tmpl.Spec, want, wantBasics(ptrace), false, "pod", "")
	if want.SupervisorEnv != nil {
		checkConsistent(t, tmpl.Spec)
	}
	if got := tmpl.Labels["sidecar.istio.io/inject"]; got != "true" {
		t.Errorf(`pod label sidecar.istio.io/inject = %q, want "true"`, got)
	}
}

// handJobEnv is the supervisor's environment in deploy/'s hand-written Jobs
// that run it as a regular container: the template's for one app "app"
// (supervisorEnv) but after the app and without a state directory, with a
// 30s stop timeout and the given further variables (name, value...).
func handJobEnv(restart string, extra ...string) map[string]string {
	env := withoutAfterApps(supervisorEnv(restart, "app", append([]string{"SUPERVISOR_STOP_TIMEOUT", "30s"}, extra...)...))
	if !slices.Contains(extra, stateVar) {
		delete(env, stateVar)
	}
	return env
}

// checkConsistent checks that the settings copied by hand from the pod spec
// match it: SUPERVISOR_RESTART_POLICY, SUPERVISOR_APP_CONTAINERS and, where
// set, SUPERVISOR_APPS count and name the containers but the supervisor,
// istio-proxy and the sidecars named.
func checkConsistent(t *testing.T, spec corev1.PodSpec, sidecars ...string) {
	t.Helper()
	env := shapeOf(spec).SupervisorEnv
	if got, want := env["SUPERVISOR_RESTART_POLICY"], string(spec.RestartPolicy); got != want {
		t.Errorf("SUPERVISOR_RESTART_POLICY = %q, pod restartPolicy = %q", got, want)
	}
	var apps []string
	for _, c := range spec.Containers {
		if c.Name != supervisorName && c.Name != proxyName && !slices.Contains(sidecars, c.Name) {
			apps = append(apps, c.Name)
		}
	}
	if got, want := env["SUPERVISOR_APP_CONTAINERS"], strconv.Itoa(len(apps)); got != want {
		t.Errorf("SUPERVISOR_APP_CONTAINERS = %q, the pod has %s app containers", got, want)
	}
	if got, ok := env["SUPERVISOR_APPS"]; ok && got != strings.Join(apps, ",") {
		t.Errorf("SUPERVISOR_APPS = %q, the pod's app containers are %q", got, strings.Join(apps, ","))
	}
}

var securityLevels = []psaapi.Level{psaapi.LevelRestricted, psaapi.LevelBaseline, psaapi.LevelPrivileged}

// checkPodSecurity judges what the pod has of ours, if anything: the
// supervisor (a container or a native sidecar) and its state volume, the
// install init container and its volume, with the pod-level settings (the
// app and istio-proxy are not ours to judge). It passes Pod Security
// "restricted"; with the supervisor as root with capsAdd (exit-status
// ptrace or accounting, deploy/job-ptrace.yaml), "privileged" only, for
// rootRefusals' reasons.
func checkPodSecurity(t *testing.T, spec corev1.PodSpec, capsAdd []string) {
	t.Helper()
	ours := *spec.DeepCopy()
	ours.Containers, ours.InitContainers, ours.Volumes = nil, nil, nil
	for _, v := range spec.Volumes {
		if v.Name == holdVolume || v.Name == stateVolume {
			ours.Volumes = append(ours.Volumes, v)
		}
	}
	if c := findContainer(spec, supervisorName); c != nil {
		ours.Containers = append(ours.Containers, *c)
	}
	for _, name := range []string{supervisorName, installName} {
		if c := findInit(spec, name); c != nil {
			ours.InitContainers = append(ours.InitContainers, *c)
		}
	}
	if len(ours.Containers)+len(ours.InitContainers) == 0 {
		return
	}
	want := []string{"", "", ""}
	if len(capsAdd) > 0 {
		want = rootRefusals(capsAdd)
	}
	if diff := cmp.Diff(want, podSecurityOf(t, ours)); diff != "" {
		t.Errorf("the Pod Security verdicts on what the pod has of ours, for %v (-want +got):\n%s", securityLevels, diff)
	}
}

// podSecurityOf judges every container of spec, with the pod-level
// settings, at each of securityLevels: "" when allowed, else "reason:
// detail" of each refusal, joined by "\n".
func podSecurityOf(t *testing.T, spec corev1.PodSpec) []string {
	t.Helper()
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, lvl := range securityLevels {
		var reasons []string
		for _, r := range eval.EvaluatePod(psaapi.LevelVersion{Level: lvl, Version: psaapi.LatestVersion()},
			&metav1.ObjectMeta{}, &spec) {
			if !r.Allowed {
				reasons = append(reasons, r.ForbiddenReason+": "+r.ForbiddenDetail)
			}
		}
		got = append(got, strings.Join(reasons, "\n"))
	}
	return got
}
