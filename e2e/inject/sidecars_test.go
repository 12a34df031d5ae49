package inject

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// sidecarExample is one of deploy/'s Jobs for a sidecar whose injector has
// no template to add the supervisor: the sidecar container as its injector
// adds it (Dapr, Vault: not in the file) or as users write it
// (cloud-sql-proxy: in the file), and the supervisor configured for it with
// today's settings.
type sidecarExample struct {
	file string
	// process is the sidecar's main process name; inFile names its
	// container when the file has it.
	process, inFile string
	// stopURL derives the sidecar's HTTP stop from the pod as written: the
	// address its injector or its flags give it. It fails the test when the
	// stop is not enabled.
	stopURL func(t *testing.T, tmpl corev1.PodTemplateSpec) string
}

var sidecarExamples = []sidecarExample{
	{
		file: "job-dapr.yaml", process: "daprd",
		stopURL: func(t *testing.T, tmpl corev1.PodTemplateSpec) string {
			a := tmpl.Annotations
			if a["dapr.io/enabled"] != "true" || a["dapr.io/app-id"] == "" {
				t.Errorf("annotations %v: want dapr.io/enabled \"true\" and an app-id, or Dapr injects nothing", a)
			}
			// The supervisor sends no dapr-api-token header.
			if v, ok := a["dapr.io/api-token-secret"]; ok {
				t.Errorf("dapr.io/api-token-secret %q: the shutdown API would refuse the supervisor's POST", v)
			}
			return "http://127.0.0.1:" + cmp.Or(a["dapr.io/http-port"], "3500") + "/v1.0/shutdown"
		},
	},
	{
		file: "job-vault.yaml", process: "vault",
		stopURL: func(t *testing.T, tmpl corev1.PodTemplateSpec) string {
			a := tmpl.Annotations
			p := "vault.hashicorp.com/"
			if a[p+"agent-inject"] != "true" {
				t.Errorf("%sagent-inject %q: vault-k8s adds no agent", p, a[p+"agent-inject"])
			}
			if a[p+"agent-pre-populate-only"] == "true" {
				t.Errorf("%sagent-pre-populate-only: there is no sidecar to stop", p)
			}
			if a[p+"agent-enable-quit"] != "true" {
				t.Errorf("%sagent-enable-quit %q: /agent/v1/quit answers 404 unless \"true\"", p, a[p+"agent-enable-quit"])
			}
			return "http://127.0.0.1:" + cmp.Or(a[p+"agent-cache-listener-port"], "8200") + "/agent/v1/quit"
		},
	},
	{
		file: "job-cloud-sql-proxy.yaml", process: "cloud-sql-proxy", inFile: "cloud-sql-proxy",
		stopURL: func(t *testing.T, tmpl corev1.PodTemplateSpec) string {
			c := findContainer(tmpl.Spec, "cloud-sql-proxy")
			if c == nil {
				t.Fatal("no cloud-sql-proxy container")
			}
			args := append(append([]string{}, c.Command...), c.Args...)
			if !hasFlag(args, "quitquitquit") {
				t.Errorf("cloud-sql-proxy args %q: without --quitquitquit nothing serves /quitquitquit", args)
			}
			// Its SIGTERM (the supervisor's fallback) must not give 143.
			if !hasFlag(args, "exit-zero-on-sigterm") {
				t.Errorf("cloud-sql-proxy args %q: without --exit-zero-on-sigterm SIGTERM gives 143 and a Failed pod", args)
			}
			// The fallback signal reaches only the supervisor's own uid.
			if got, want := runAsUser(c), runAsUser(findContainer(tmpl.Spec, supervisorName)); got != want {
				t.Errorf("cloud-sql-proxy runs as %q, the supervisor as %q: its SIGTERM fallback would not be permitted", got, want)
			}
			return "http://127.0.0.1:" + cmp.Or(flagValue(args, "admin-port"), "9091") + "/quitquitquit"
		},
	},
}

// TestSidecarExamples checks deploy/'s Jobs for Dapr, Vault and
// cloud-sql-proxy: the supervisor last, as checkSupervised wants it (and the
// cloud-sql-proxy container written by hand admitted by Pod Security
// "restricted"); the sidecar named in SUPERVISOR_SIDECAR_PROCESSES and its
// HTTP stop, as the pod enables it, in SUPERVISOR_SIDECAR_ACTIONS; the
// settings copied from the pod agreeing with it (the sidecar is not an app).
func TestSidecarExamples(t *testing.T) {
	for _, ex := range sidecarExamples {
		t.Run(ex.file, func(t *testing.T) {
			tmpl := podTemplateOf(t, "Job", readDeploy(t, ex.file))
			spec := tmpl.Spec
			env := shapeOf(spec).SupervisorEnv
			// The supervisor last, after the file's containers; its
			// environment is checked below.
			containers := []string{"app"}
			if ex.inFile != "" {
				containers = append(containers, ex.inFile)
			}
			checkSupervised(t, spec, supervisorLast(env, containers...), wantBasics(false), false, "pod", "")
			checkConsistent(t, spec, ex.inFile)
			if ex.inFile != "" {
				c := findContainer(spec, ex.inFile)
				if c == nil {
					t.Fatalf("no %s container", ex.inFile)
				}
				judged := *spec.DeepCopy()
				judged.Containers, judged.InitContainers = []corev1.Container{*c}, nil
				if got := podSecurityOf(t, judged)[0]; got != "" {
					t.Errorf("%s container not admitted by Pod Security restricted:\n%s", ex.inFile, got)
				}
			}
			if got := strings.Split(env["SUPERVISOR_SIDECAR_PROCESSES"], ","); !slices.Contains(got, ex.process) {
				t.Errorf("SUPERVISOR_SIDECAR_PROCESSES = %q, want it to name %s", env["SUPERVISOR_SIDECAR_PROCESSES"], ex.process)
			}
			if got, want := env["SUPERVISOR_SIDECAR_ACTIONS"], ex.process+"="+ex.stopURL(t, tmpl); got != want {
				t.Errorf("SUPERVISOR_SIDECAR_ACTIONS = %q, want %q (the stop the pod enables)", got, want)
			}
		})
	}
}

// hasFlag reports whether args has --name (or -name), alone or =true.
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == name || a == name+"=true" {
			return true
		}
	}
	return false
}

// flagValue is --name's value (--name=v or --name v), "" when absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func runAsUser(c *corev1.Container) string {
	if c == nil || c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil {
		return ""
	}
	return strconv.FormatInt(*c.SecurityContext.RunAsUser, 10)
}
