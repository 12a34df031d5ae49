package scenarios

import (
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// TestDeployExamples runs deploy/'s Jobs for Dapr, Vault and
// cloud-sql-proxy in the pod simulation, on every backend: the supervisor
// with the file's own settings, the sidecar as the file (or its injector,
// from the file's annotations) starts it: the real cloud-sql-proxy with
// the file's flags, and podsim's stand-ins for daprd and the Vault agent.
// The app succeeds: every container 0 and Succeeded; it fails: Failed, the
// sidecar still 0. (e2e/inject checks the files' structure.)
func TestDeployExamples(t *testing.T) {
	examples := []struct {
		file    string
		sidecar func(t *testing.T, tmpl corev1.PodTemplateSpec) Sidecar
	}{
		{"job-dapr.yaml", func(t *testing.T, tmpl corev1.PodTemplateSpec) Sidecar {
			port := cmp.Or(tmpl.Annotations["dapr.io/http-port"], "3500")
			return Sidecar{Program: Daprd, Injected: true, Args: []string{"--mode", "kubernetes", "--dapr-http-port", port,
				"--app-id", tmpl.Annotations["dapr.io/app-id"]}}
		}},
		{"job-vault.yaml", func(t *testing.T, tmpl corev1.PodTemplateSpec) Sidecar {
			if port := cmp.Or(tmpl.Annotations["vault.hashicorp.com/agent-cache-listener-port"], "8200"); port != "8200" {
				t.Fatalf("the test's agent configuration listens on 8200, the file asks for %s", port)
			}
			return Sidecar{Name: "vault-agent", Program: VaultAgent, Injected: true,
				VaultConfig: vaultConfig(tmpl.Annotations["vault.hashicorp.com/agent-enable-quit"] == "true")}
		}},
		{"job-cloud-sql-proxy.yaml", func(t *testing.T, tmpl corev1.PodTemplateSpec) Sidecar {
			for _, c := range tmpl.Spec.Containers {
				if c.Name != "cloud-sql-proxy" {
					continue
				}
				s := Sidecar{Program: CloudSQLProxy,
					// The pod's credentials come from its service
					// account; offline, a token stands in for them.
					Args: append([]string{"--token", "x", "--lazy-refresh"}, c.Args...)}
				if sc := c.SecurityContext; sc != nil && sc.RunAsUser != nil {
					s.UID = int(*sc.RunAsUser)
				}
				return s
			}
			t.Fatal("no cloud-sql-proxy container")
			return Sidecar{}
		}},
	}
	outcomes := []struct {
		name  string
		app   []string
		phase pod.Phase
		code  int
	}{
		{"app succeeds", nil, pod.Succeeded, 0},
		{"app fails", []string{"--exit", "3"}, pod.Failed, 3},
	}
	for _, b := range Builders(t) {
		for _, ex := range examples {
			for _, o := range outcomes {
				t.Run(b.Name+"/"+ex.file+"/"+o.name, func(t *testing.T) {
					tmpl := exampleTemplate(t, ex.file)
					s := ex.sidecar(t, tmpl)
					d := Desc{Name: "job", Proxy: NoProxy, Apps: []App{{Name: "app", Cued: true, UID: 1000, Args: o.app}},
						Sidecars: []Sidecar{s}, SupervisorEnv: supervisorEnvOf(t, tmpl)}
					p, built := run(t, b, d)
					if s.Program == CloudSQLProxy {
						waitListening(t, p, s.name(), 5432)
					} else {
						waitRecordStart(t, filepath.Join(built.Shared, s.RecordFile()))
					}
					releaseApps(t, p, built, d.Apps)
					st := p.MustWaitPhase(t, EventBound)
					if st.Phase != o.phase || st.Container("app").ExitCode != o.code ||
						st.Container(s.name()).ExitCode != 0 || st.Container("supervisor").ExitCode != 0 {
						t.Errorf("status %s, want %s with app %d and %s, supervisor 0", st, o.phase, o.code, s.name())
					}
				})
			}
		}
	}
}

// exampleTemplate decodes a Job of deploy/ and returns its pod template.
func exampleTemplate(t *testing.T, file string) corev1.PodTemplateSpec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pod.RepoDir(), "deploy", file))
	if err != nil {
		t.Fatal(err)
	}
	var j batchv1.Job
	if err := yaml.UnmarshalStrict(b, &j); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return j.Spec.Template
}

// supervisorEnvOf is the supervisor container's literal SUPERVISOR_*
// settings (those from the downward API have no meaning here).
func supervisorEnvOf(t *testing.T, tmpl corev1.PodTemplateSpec) []string {
	t.Helper()
	for _, c := range tmpl.Spec.Containers {
		if c.Name != "sidecar-supervisor" {
			continue
		}
		var env []string
		for _, e := range c.Env {
			if e.ValueFrom == nil && strings.HasPrefix(e.Name, "SUPERVISOR_") {
				env = append(env, e.Name+"="+e.Value)
			}
		}
		return env
	}
	t.Fatal("no sidecar-supervisor container")
	return nil
}
