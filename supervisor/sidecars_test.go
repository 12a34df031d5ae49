package supervisor

import (
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

func TestKnownSidecars(t *testing.T) {
	proc := func(name string) procscan.Process { return procscan.Process{Comm: name} }
	tests := []struct {
		container, process string
		args               []string
		want, url          string // the table's name; the stop URL ("" for a signal)
	}{
		{"istio-proxy", "pilot-agent", nil, istio, ""},
		{"c1", "pilot-agent", nil, istio, ""},
		{"daprd", "daprd", []string{"/daprd", "--dapr-http-port", "3501"}, "Dapr daprd", "http://127.0.0.1:3501/v1.0/shutdown"},
		{"daprd", "daprd", []string{"/daprd"}, "Dapr daprd", "http://127.0.0.1:3500/v1.0/shutdown"},
		{"consul-dataplane", "dumb-init", []string{"dumb-init", "--", "consul-dataplane", "-graceful-port=20600"}, "Consul consul-dataplane", "http://127.0.0.1:20600/graceful_shutdown"},
		{"cloud-sql-proxy", "cloud-sql-proxy", []string{"/cloud-sql-proxy", "--quitquitquit", "--admin-port=9092", "p:r:i"}, "cloud-sql-proxy v2", "http://127.0.0.1:9092/quitquitquit"},
		{"cloud-sql-proxy", "cloud-sql-proxy", []string{"/cloud-sql-proxy", "p:r:i"}, "cloud-sql-proxy v2", ""},
		{"vault-agent", "vault", nil, "Vault agent", "http://127.0.0.1:8200/agent/v1/quit"},
		{"linkerd-proxy", "linkerd2-proxy", nil, "Linkerd linkerd2-proxy", "http://127.0.0.1:4191/shutdown"},
		{"logs", "fluent-bit", nil, "fluent-bit", ""},
		{"app", "python3", nil, "", ""},
	}
	for _, tt := range tests {
		k := knownAs(tt.container, proc(tt.process))
		name := ""
		if k != nil {
			name = k.name
		}
		if name != tt.want {
			t.Errorf("%s/%s: known as %q, want %q", tt.container, tt.process, name, tt.want)
			continue
		}
		if k == nil {
			continue
		}
		got := ""
		if u := k.stopURL(tt.args); u != nil {
			got = u.String()
		}
		if got != tt.url {
			t.Errorf("%s %v: stop URL %q, want %q", tt.container, tt.args, got, tt.url)
		}
	}
	if got := DefaultSidecars(); !strings.Contains(strings.Join(got, ","), "istio-proxy,linkerd-proxy,daprd") {
		t.Errorf("DefaultSidecars = %v", got)
	}
}

// TestSidecarExit143: cloud-sql-proxy without --quitquitquit nor
// --exit-zero-on-sigterm exits 143 on SIGTERM: after a successful app the
// pod will be Failed; the log and the summary say so, and how to fix it.
func TestSidecarExit143(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sql := container(procscan.Sidecar, "cloud-sql-proxy", 200)
		h := startWith(t, testConfig(t), func(h *harness) {
			h.pod.args = map[int][]string{200: {"/cloud-sql-proxy", "proj:region:inst"}}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100), sql)
		h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
			if sig == exitwatch.SIGTERM {
				return &exitwatch.Status{Known: true, Code: 143} // cloud-sql-proxy's own exit
			}
			return &exitwatch.Status{Known: true, Signal: sig}
		})
		h.proc(10).exit(exited(0))
		res := h.finish(Success, "SIGTERM 100", "SIGTERM 200")
		for _, want := range []string{"cloud-sql-proxy exited 143: the pod will be Failed; start it with --exit-zero-on-sigterm or --quitquitquit",
			"pilot-agent exited 143"} {
			if !strings.Contains(res.Summary, want) {
				t.Errorf("summary %q lacks %q", res.Summary, want)
			}
		}
	})
}

// TestSidecarOwnStop: cloud-sql-proxy started with --quitquitquit is
// stopped through it (exit 0), beside pilot-agent's SIGTERM; the summary
// names its own action.
func TestSidecarOwnStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sql := container(procscan.Sidecar, "cloud-sql-proxy", 200)
		h := startWith(t, testConfig(t), func(h *harness) {
			h.pod.args = map[int][]string{200: {"/cloud-sql-proxy", "--quitquitquit", "proj:region:inst"}}
			h.answer = func(int) (int, error) {
				go h.kernel.proc(200).exit(exited(0))
				return 200, nil
			}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100), sql)
		h.proc(10).exit(exited(0))
		res := h.finish(Success, "SIGTERM 100")
		if got := h.postsSent(); len(got) != 1 || got[0] != "http://127.0.0.1:9091/quitquitquit" {
			t.Errorf("posts %v", got)
		}
		if !strings.Contains(res.Summary, "action SIGTERM (cloud-sql-proxy: POST http://127.0.0.1:9091/quitquitquit)") {
			t.Errorf("summary %q does not name cloud-sql-proxy's own action", res.Summary)
		}
	})
}

// TestSidecarFoundInItsExec: a sidecar found in the middle of its exec
// shows its new name but no command line yet (procscan.Scanner.Args). Its
// flags are read again before its stop: cloud-sql-proxy's --quitquitquit
// is found and used. One whose command line never shows is stopped
// without its flags after argsWait, and the log says why.
func TestSidecarFoundInItsExec(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reads int // reads of its command line that find none
		post  bool
	}{
		{"command line shows by the stop", 1, true},
		{"command line shows during the stop's wait", 4, true},
		{"command line never shows", 1 << 30, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sql := container(procscan.Sidecar, "cloud-sql-proxy", 200)
				h := startWith(t, testConfig(t), func(h *harness) {
					h.pod.args = map[int][]string{200: {"/cloud-sql-proxy", "--quitquitquit", "proj:region:inst"}}
					h.pod.execing = map[int]int{200: tc.reads}
					h.answer = func(int) (int, error) {
						go h.kernel.proc(200).exit(exited(0))
						return 200, nil
					}
				}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100), sql)
				h.proc(10).exit(exited(0))
				begun := time.Now()
				if !tc.post {
					h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
						return &exitwatch.Status{Known: true, Code: 0}
					})
					res := h.finish(Success, "SIGTERM 100", "SIGTERM 200")
					if got := h.postsSent(); len(got) != 0 {
						t.Errorf("posts %v, want none: its flags are unknown", got)
					}
					if strings.Contains(res.Summary, "cloud-sql-proxy: POST") {
						t.Errorf("summary %q names a POST", res.Summary)
					}
					if waited := time.Since(begun); waited < argsWait {
						t.Errorf("stopped %v after the app, before argsWait", waited)
					}
					if !strings.Contains(h.log.String(), "command line is still empty") {
						t.Errorf("log lacks why its flags were not used:\n%s", h.log)
					}
					return
				}
				res := h.finish(Success, "SIGTERM 100")
				if got := h.postsSent(); len(got) != 1 || got[0] != "http://127.0.0.1:9091/quitquitquit" {
					t.Errorf("posts %v", got)
				}
				if !strings.Contains(res.Summary, "action SIGTERM (cloud-sql-proxy: POST http://127.0.0.1:9091/quitquitquit)") {
					t.Errorf("summary %q does not name cloud-sql-proxy's own action", res.Summary)
				}
			})
		})
	}
}

// TestDeployKnowsSidecars: the ways of installing that list the sidecars
// the supervisor knows (to leave them out of the apps, and to find the pods
// to serve) list exactly DefaultSidecars, in its order: the Istio injection
// template's default and the admission policy's "known" variable (e2e/inject
// evaluates the policy's list; this holds the text to the table).
func TestDeployKnowsSidecars(t *testing.T) {
	names := DefaultSidecars()
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = "'" + n + "'"
	}
	for _, f := range []struct{ path, want string }{
		{"../deploy/istio/supervisor.tmpl", `"` + strings.Join(names, ",") + `"`},
		{"../deploy/admission/policy.yaml", strings.Join(quoted, ",")},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		// The policy's list spans lines: compare without blanks.
		text := strings.Join(strings.Fields(string(b)), "")
		if !strings.Contains(text, f.want) {
			t.Errorf("%s does not list the known sidecars %s", f.path, f.want)
		}
	}
}
