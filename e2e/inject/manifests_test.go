package inject

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// podTemplateOf decodes a Job or CronJob manifest strictly and returns its
// pod template.
func podTemplateOf(t *testing.T, kind string, data []byte) corev1.PodTemplateSpec {
	t.Helper()
	switch kind {
	case "Job":
		var j batchv1.Job
		decodeStrict(t, data, &j)
		return j.Spec.Template
	case "CronJob":
		var c batchv1.CronJob
		decodeStrict(t, data, &c)
		return c.Spec.JobTemplate.Spec.Template
	}
	t.Fatalf("unexpected kind %q", kind)
	return corev1.PodTemplateSpec{}
}

// TestHandWrittenManifests checks deploy/job.yaml, cronjob.yaml and
// job-ptrace.yaml: strict decoding, the supervisor last with a shared PID
// namespace, and SUPERVISOR_RESTART_POLICY / SUPERVISOR_APP_CONTAINERS agreeing
// with the pod they are in.
func TestHandWrittenManifests(t *testing.T) {
	for _, tc := range []struct {
		file   string
		kind   string
		ptrace bool
		want   podShape
	}{
		{
			file: "job.yaml", kind: "Job",
			want: podShape{
				Containers:            []string{"app", supervisorName},
				ShareProcessNamespace: true,
				SupervisorEnv: map[string]string{
					"SUPERVISOR_RESTART_POLICY": "Never",
					"SUPERVISOR_APP_CONTAINERS": "1",
					"SUPERVISOR_ON_SUCCESS":     "SIGTERM",
					"SUPERVISOR_ON_FAILURE":     "SIGKILL",
					"SUPERVISOR_STOP_TIMEOUT":   "30s",
					"SUPERVISOR_EXIT_STATUS":    "auto",
					"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
				},
				SupervisorUser: "1337",
			},
		},
		{
			file: "cronjob.yaml", kind: "CronJob",
			want: podShape{
				Containers:            []string{"app", supervisorName},
				ShareProcessNamespace: true,
				SupervisorEnv: map[string]string{
					"SUPERVISOR_RESTART_POLICY": "OnFailure",
					"SUPERVISOR_APP_CONTAINERS": "1",
					"SUPERVISOR_ON_SUCCESS":     "SIGTERM",
					"SUPERVISOR_STOP_TIMEOUT":   "30s",
					"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
				},
				SupervisorUser: "1337",
			},
		},
		{
			file: "job-ptrace.yaml", kind: "Job", ptrace: true,
			want: podShape{
				Containers:            []string{"app", supervisorName},
				ShareProcessNamespace: true,
				SupervisorEnv: map[string]string{
					"SUPERVISOR_EXIT_STATUS":    "ptrace",
					"SUPERVISOR_RESTART_POLICY": "Never",
					"SUPERVISOR_APP_CONTAINERS": "1",
					"SUPERVISOR_ON_SUCCESS":     "SIGTERM",
					"SUPERVISOR_ON_FAILURE":     "SIGKILL",
					"SUPERVISOR_STOP_TIMEOUT":   "30s",
					"GOMEMLIMIT":                "resourceFieldRef:limits.memory",
				},
				SupervisorUser:    "0",
				SupervisorCapsAdd: []string{"SYS_PTRACE", "KILL"},
			},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tmpl := podTemplateOf(t, tc.kind, readDeploy(t, tc.file))
			spec := tmpl.Spec
			if diff := cmp.Diff(tc.want, shapeOf(spec)); diff != "" {
				t.Errorf("pod (-want +got):\n%s", diff)
			}
			checkOrder(t, spec, false)
			checkSupervisorBasics(t, spec, wantBasics(tc.ptrace))
			checkConsistent(t, spec)
			if got := tmpl.Labels["sidecar.istio.io/inject"]; got != "true" {
				t.Errorf(`pod label sidecar.istio.io/inject = %q, want "true"`, got)
			}
		})
	}
}

// checkConsistent checks that the settings copied by hand from the pod spec
// match it.
func checkConsistent(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	env := shapeOf(spec).SupervisorEnv
	if got, want := env["SUPERVISOR_RESTART_POLICY"], string(spec.RestartPolicy); got != want {
		t.Errorf("SUPERVISOR_RESTART_POLICY = %q, pod restartPolicy = %q", got, want)
	}
	apps := 0
	for _, c := range spec.Containers {
		if c.Name != supervisorName && c.Name != proxyName {
			apps++
		}
	}
	if got, want := env["SUPERVISOR_APP_CONTAINERS"], strconv.Itoa(apps); got != want {
		t.Errorf("SUPERVISOR_APP_CONTAINERS = %q, the pod has %s app containers", got, want)
	}
}

// TestPodSecurityLevels runs Kubernetes' own Pod Security admission checks
// (k8s.io/pod-security-admission, the code behind the PodSecurity admission
// plugin) on the supervisor container alone, as it is in each manifest: the
// regular one must pass "restricted"; the ptrace one must be refused by
// "baseline" for SYS_PTRACE (and nothing else), hence needs "privileged".
func TestPodSecurityLevels(t *testing.T) {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	levels := []psaapi.Level{psaapi.LevelRestricted, psaapi.LevelBaseline, psaapi.LevelPrivileged}
	for _, tc := range []struct {
		file, kind string
		// What each level says, in the order of levels: "" when allowed,
		// else "reason: detail" of each refusal, joined by "\n".
		want []string
	}{
		{file: "job.yaml", kind: "Job", want: []string{"", "", ""}},
		{file: "cronjob.yaml", kind: "CronJob", want: []string{"", "", ""}},
		{file: "job-ptrace.yaml", kind: "Job", want: []string{
			`unrestricted capabilities: container "sidecar-supervisor" must not include "KILL", "SYS_PTRACE" in securityContext.capabilities.add` + "\n" +
				`runAsNonRoot != true: container "sidecar-supervisor" must not set securityContext.runAsNonRoot=false` + "\n" +
				`runAsUser=0: container "sidecar-supervisor" must not set runAsUser=0`,
			// KILL is in baseline's list; SYS_PTRACE is not.
			`non-default capabilities: container "sidecar-supervisor" must not include "SYS_PTRACE" in securityContext.capabilities.add`,
			"",
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tmpl := podTemplateOf(t, tc.kind, readDeploy(t, tc.file))
			c := findContainer(tmpl.Spec, supervisorName)
			if c == nil {
				t.Fatalf("no %s container", supervisorName)
			}
			// The supervisor alone: the example app (busybox as root) is not
			// what is being judged.
			spec := *tmpl.Spec.DeepCopy()
			spec.Containers = []corev1.Container{*c}
			var got []string
			for _, lvl := range levels {
				var reasons []string
				for _, r := range eval.EvaluatePod(psaapi.LevelVersion{Level: lvl, Version: psaapi.LatestVersion()},
					&metav1.ObjectMeta{}, &spec) {
					if !r.Allowed {
						reasons = append(reasons, r.ForbiddenReason+": "+r.ForbiddenDetail)
					}
				}
				got = append(got, strings.Join(reasons, "\n"))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Pod Security verdicts for %v (-want +got):\n%s", levels, diff)
			}
		})
	}
}
