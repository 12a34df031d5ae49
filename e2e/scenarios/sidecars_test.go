package scenarios

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// cloudSQLProxyArgs start the real cloud-sql-proxy offline: a token instead
// of credentials, and the instance's connection details fetched only when a
// client connects (--lazy-refresh), which none does.
var cloudSQLProxyArgs = []string{"--token", "x", "--lazy-refresh", "--port", "5432"}

// cloudSQLInstance is an instance connection name; nothing is asked of it.
const cloudSQLInstance = "proj:region:inst"

// TestCloudSQLProxy runs Job pods with the real cloud-sql-proxy v2 next to
// Istio's real pilot-agent, on every backend: configured by hand
// (SUPERVISOR_SIDECAR_ACTIONS for its /quitquitquit), and not (the
// supervisor knows cloud-sql-proxy's stop, and reads its flags). cloud-sql-proxy's own
// exit code decides as much as the app's: under restartPolicy Never a
// sidecar exiting 143 fails the pod whatever the app did.
func TestCloudSQLProxy(t *testing.T) {
	const quit = "cloud-sql-proxy=http://127.0.0.1:9091/quitquitquit"
	tests := []struct {
		name  string
		app   []string // the app's arguments
		flags []string // cloud-sql-proxy's, besides cloudSQLProxyArgs
		// uid runs cloud-sql-proxy as the supervisor's user (1337): a
		// signal from the supervisor, which has no capabilities, reaches
		// only processes of its own uid. 0: the image's (65532).
		uid int
		env []string // the supervisor's, besides the sidecar list
		// want
		phase   pod.Phase
		codes   map[string]int
		summary string
		// log is what cloud-sql-proxy says of its stop.
		log string
	}{
		{
			name: "success, quitquitquit: every container 0", flags: []string{"--quitquitquit"},
			env:   []string{"SUPERVISOR_SIDECAR_ACTIONS=" + quit},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "cloud-sql-proxy": 0, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM (cloud-sql-proxy: POST http://127.0.0.1:9091/quitquitquit); sidecar stopped",
			log:     "/quitquitquit received request",
		},
		{
			// No settings: the supervisor knows cloud-sql-proxy, reads
			// --quitquitquit and --admin-port on its command line, and
			// stops it there.
			name: "success, its own quitquitquit found on its command line", flags: []string{"--quitquitquit", "--admin-port", "9092"},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "cloud-sql-proxy": 0, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM (cloud-sql-proxy: POST http://127.0.0.1:9092/quitquitquit); sidecar stopped",
			log:     "/quitquitquit received request",
		},
		{
			name: "failure, quitquitquit: Failed", app: []string{"--exit", "3"}, flags: []string{"--quitquitquit"},
			env: []string{"SUPERVISOR_SIDECAR_ACTIONS=" + quit},
			// The sidecar's own action applies whatever the outcome;
			// pilot-agent gets the failure's SIGKILL.
			phase: pod.Failed, codes: map[string]int{"app": 3, "cloud-sql-proxy": 0, "istio-proxy": 137, "supervisor": 0},
			summary: "failure: app exit 3; action SIGKILL (cloud-sql-proxy: POST http://127.0.0.1:9091/quitquitquit); sidecar stopped",
			log:     "/quitquitquit received request",
		},
		{
			// Issue 21: the supervisor says so, and how to fix it.
			name: "success, SIGTERM: its 143 fails the pod", uid: ProxyUID,
			phase: pod.Failed, codes: map[string]int{"app": 0, "cloud-sql-proxy": 143, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM; cloud-sql-proxy exited 143: the pod will be Failed; start it with --exit-zero-on-sigterm or --quitquitquit",
			log:     "SIGTERM signal received",
		},
		{
			name: "success, SIGTERM with --exit-zero-on-sigterm: every container 0", uid: ProxyUID,
			flags: []string{"--exit-zero-on-sigterm"},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "cloud-sql-proxy": 0, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM; sidecar stopped",
			log:     "SIGTERM signal received",
		},
		{
			name: "failure, SIGKILL: Failed", uid: ProxyUID, app: []string{"--exit", "3"},
			phase: pod.Failed, codes: map[string]int{"app": 3, "cloud-sql-proxy": 137, "istio-proxy": 137, "supervisor": 0},
			summary: "failure: app exit 3; action SIGKILL; sidecar stopped",
		},
	}
	for _, b := range Builders(t) {
		for _, tt := range tests {
			t.Run(b.Name+"/"+tt.name, func(t *testing.T) {
				p, _ := runCloudSQLProxy(t, b, tt.app, tt.flags, tt.uid, tt.env)
				st := p.MustWaitPhase(t, EventBound)
				checkEnd(t, st, tt.phase, tt.codes)
				if c := st.Container("cloud-sql-proxy"); c.ExitCode == 143 && c.Signal != 0 {
					t.Errorf("cloud-sql-proxy was killed by %v: its handler was not in place", c.Signal)
				}
				checkSummary(t, p, tt.summary)
				if logs := p.Logs("cloud-sql-proxy"); !strings.Contains(logs, tt.log) {
					t.Errorf("cloud-sql-proxy's log does not say %q:\n%s", tt.log, logs)
				}
			})
		}
	}
}

// TestCloudSQLProxyOtherUser: cloud-sql-proxy as its image runs it (uid
// 65532) cannot be signalled by the supervisor (uid 1337, no
// capabilities): with a signal for its action the supervisor says so, and
// the pod never completes. Only its HTTP stop reaches it.
//
// The supervisor ends once pilot-agent has drained (1 s) and exited 0; it
// does not wait for cloud-sql-proxy, whose refusal lasts. STOP_TIMEOUT, 20
// s, only keeps pilot-agent from a SIGKILL on a loaded machine.
func TestCloudSQLProxyOtherUser(t *testing.T) {
	onBackends(t, func(t *testing.T, b Builder) {
		p, _ := runCloudSQLProxy(t, b, nil, nil, 0, []string{"SUPERVISOR_STOP_TIMEOUT=20s"})
		st := p.MustWaitFor(t, EventBound, pod.Ended("supervisor"))
		if st.Phase != pod.Running || !st.Container("cloud-sql-proxy").Running || st.Container("istio-proxy").ExitCode != 0 {
			t.Errorf("status %s, want Running with cloud-sql-proxy up and istio-proxy exited 0", st)
		}
		checkSummary(t, p, "not permitted to signal cloud-sql-proxy")
		// The refusal lasts: neither STOP_TIMEOUT nor a SIGKILL is waited for.
		if l := LogWhere(p, Is("sidecar did not stop in time: sending SIGKILL")); len(l) != 0 {
			t.Errorf("the supervisor waited for cloud-sql-proxy, which it may not signal:\n%s", p.Logs("supervisor"))
		}
	})
}

// runCloudSQLProxy starts a Job pod: a cued app with appArgs, the real
// cloud-sql-proxy with flags (as uid when not 0), Istio's real pilot-agent
// holding the app until ready, and the supervisor told of both sidecars
// (plus env). It returns once both sidecars are up and the app released.
func runCloudSQLProxy(t *testing.T, b Builder, appArgs, flags []string, uid int, env []string) (*pod.Pod, Built) {
	t.Helper()
	csp := Sidecar{Program: CloudSQLProxy, UID: uid,
		Args: append(append(append([]string{}, cloudSQLProxyArgs...), flags...), cloudSQLInstance)}
	d := Desc{Name: "job", Proxy: RealPilot, HoldApp: true,
		Apps:     []App{{Name: "app", Cued: true, UID: 1000, Args: appArgs}},
		Sidecars: []Sidecar{csp}}
	d.SupervisorEnv = append(patient("SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,cloud-sql-proxy"), env...)
	p, built := run(t, b, d)
	waitEnvoy(t, built)
	// cloud-sql-proxy listens once it handles SIGTERM (its signal.Notify
	// comes first): until then its Go runtime lets SIGTERM kill it,
	// whatever its flags.
	waitListening(t, p, "cloud-sql-proxy", 5432)
	releaseApps(t, p, built, d.Apps)
	return p, built
}

// waitListening waits (bounded) until the named container's main process
// has a TCP socket listening on port, as its network namespace's
// /proc/PID/net/tcp shows (the pod's, shared by every container).
func waitListening(t *testing.T, p *pod.Pod, container string, port int) {
	t.Helper()
	if !eventually(func() bool { pid := p.Status().Container(container).PID; return pid > 0 && listening(pid, port) }) {
		t.Fatalf("%s never listened on port %d within %s (%s)", container, port, EventBound, p.Status())
	}
}

// listening reports whether /proc/PID/net/tcp has a socket in state LISTEN
// (0A) on port.
func listening(pid, port int) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if n, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(n) == port {
			return true
		}
	}
	return false
}

// standInCase is one sidecar whose real binary is not built here, run as
// podsim's stand-in (cmd/podsim/sidecars.go).
type standInCase struct {
	sidecar Sidecar
	// process is its container's main process, for
	// SUPERVISOR_SIDECAR_PROCESSES (consul-dataplane's is dumb-init).
	process string
	// stop is its HTTP stop as an action URL ("" when it has none); off
	// is the same sidecar with that stop left disabled (nil when it
	// cannot be).
	stop string
	off  *Sidecar
	// stopRecord is the stand-in's record line for an HTTP stop.
	stopRecord string
}

var standInCases = []standInCase{
	{
		// As Dapr's injector adds it: /daprd with its HTTP port.
		sidecar: Sidecar{Program: Daprd, Injected: true, Args: []string{"--mode", "kubernetes", "--dapr-http-port", "3500", "--app-id", "job"}},
		process: "daprd", stop: "http://127.0.0.1:3500/v1.0/shutdown", stopRecord: "stop POST /v1.0/shutdown",
	},
	{
		// As Linkerd's injector adds it, the shutdown endpoint enabled by
		// config.linkerd.io/proxy-admin-shutdown: enabled.
		sidecar: Sidecar{Name: "linkerd-proxy", Program: LinkerdProxy, Injected: true, Env: []string{
			"LINKERD2_PROXY_ADMIN_LISTEN_ADDR=0.0.0.0:4191", "LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED=true"}},
		off: &Sidecar{Name: "linkerd-proxy", Program: LinkerdProxy, Injected: true, Env: []string{
			"LINKERD2_PROXY_ADMIN_LISTEN_ADDR=0.0.0.0:4191", "LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED=false"}},
		process: "linkerd2-proxy", stop: "http://127.0.0.1:4191/shutdown", stopRecord: "stop POST /shutdown",
	},
	{
		// As consul-k8s adds it: args only, under the image's dumb-init.
		sidecar: Sidecar{Program: ConsulDataplane, Injected: true, Args: []string{"-addresses", "consul-server.consul", "-tls-disabled",
			"-graceful-port=20600", "-shutdown-grace-period-seconds=0"}},
		process: "dumb-init", stop: "http://127.0.0.1:20600/graceful_shutdown", stopRecord: "stop POST /graceful_shutdown",
	},
	{
		// As vault-k8s adds it with agent-enable-quit: "true" and its
		// cache listener on 127.0.0.1:8200.
		sidecar: Sidecar{Name: "vault-agent", Program: VaultAgent, Injected: true, VaultConfig: vaultConfig(true)},
		off:     &Sidecar{Name: "vault-agent", Program: VaultAgent, Injected: true, VaultConfig: vaultConfig(false)},
		process: "vault", stop: "http://127.0.0.1:8200/agent/v1/quit", stopRecord: "stop POST /agent/v1/quit",
	},
	{sidecar: Sidecar{Program: OtelcolContrib, Args: []string{"--config=/etc/otelcol-contrib/config.yaml"}}, process: "otelcol-contrib"},
	{sidecar: Sidecar{Program: FluentBit, Args: []string{"-i", "dummy", "-o", "stdout"}}, process: "fluent-bit"},
}

// vaultConfig is the agent configuration vault-k8s renders (its JSON),
// reduced to what the quit endpoint depends on: the cache listener and its
// agent_api block.
func vaultConfig(enableQuit bool) string {
	api := ""
	if enableQuit {
		api = `,"agent_api":{"enable_quit":true}`
	}
	return `{"auto_auth":{"method":{"type":"kubernetes","mount_path":"auth/kubernetes","config":{"role":"job"}}},` +
		`"exit_after_auth":false,"pid_file":"/home/vault/.pid","vault":{"address":"https://vault.vault.svc:8200"},` +
		`"listener":[{"type":"tcp","address":"127.0.0.1:8200","tls_disable":true` + api + `}],"cache":{"use_auto_auth_token":true}}`
}

// TestStandInSidecars runs each stand-in next to the stand-in pilot-agent
// in a Job pod, on every backend, with today's supervisor configured for
// it by hand: its HTTP stop through SUPERVISOR_SIDECAR_ACTIONS (as its
// image's user, whom the supervisor cannot signal), or SIGTERM (as the
// supervisor's uid, 1337). Every one of them exits 0 either way, so the pod
// is Succeeded when the app succeeded, Failed when it failed. A stop that is
// not enabled answers 404 and the supervisor falls back to SIGTERM.
func TestStandInSidecars(t *testing.T) {
	type variant struct {
		name string
		app  []string
		// http: the sidecar's action is its HTTP stop; off: that stop not
		// enabled; uid: run it as the supervisor's.
		http, off bool
		uid       int
		// signal forces it through SUPERVISOR_SIDECAR_ACTIONS; own leaves
		// the sidecar to the supervisor's table.
		signal string
		own    bool
		// want
		phase       pod.Phase
		sidecarCode int
		// record is the stand-in's record after its start line.
		record func(c standInCase) []string
	}
	stopped := func(c standInCase) []string { return []string{c.stopRecord, "exit 0"} }
	termed := func(standInCase) []string { return []string{"signal SIGTERM", "exit 0"} }
	refused := func(c standInCase) []string {
		return []string{"refused POST " + strings.TrimPrefix(c.stopRecord, "stop POST ") + " 404", "signal SIGTERM", "exit 0"}
	}
	variants := []variant{
		{name: "success, HTTP stop", http: true, phase: pod.Succeeded, record: stopped},
		{name: "failure, HTTP stop", http: true, app: []string{"--exit", "3"}, phase: pod.Failed, record: stopped},
		{name: "success, SIGTERM", uid: ProxyUID, signal: "SIGTERM", phase: pod.Succeeded, record: termed},
		{name: "failure, SIGKILL", uid: ProxyUID, signal: "SIGKILL", app: []string{"--exit", "3"}, phase: pod.Failed, sidecarCode: 137,
			record: func(standInCase) []string { return nil }},
		// No settings: the supervisor's table (supervisor/sidecars.go)
		// stops each its own way, as its image's user where it has an HTTP
		// stop, as the supervisor's where only a signal reaches it.
		{name: "success, its own stop", own: true, phase: pod.Succeeded},
		{name: "success, HTTP stop not enabled: 404, then SIGTERM", http: true, off: true, uid: ProxyUID,
			phase: pod.Succeeded, record: refused},
	}
	for _, b := range Builders(t) {
		for _, c := range standInCases {
			for _, v := range variants {
				if (v.http && c.stop == "") || (v.off && c.off == nil) {
					continue
				}
				sc := c.sidecar
				if v.off {
					sc = *c.off
				}
				sc.UID = v.uid
				t.Run(b.Name+"/"+sc.name()+"/"+v.name, func(t *testing.T) {
					// STOP_TIMEOUT past any stop, fluent-bit's 5 s Grace too.
					env := patient("SUPERVISOR_APP_CONTAINERS=1",
						"SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,"+c.process)
					switch {
					case v.http:
						env = append(env, "SUPERVISOR_SIDECAR_ACTIONS="+c.process+"="+c.stop)
					case v.signal != "":
						env = append(env, "SUPERVISOR_SIDECAR_ACTIONS="+c.process+"="+v.signal)
					}
					if v.own && c.stop == "" {
						sc.UID = ProxyUID // only a signal stops it: it must be the supervisor's uid
					}
					d := Desc{Name: "job", Apps: []App{{Name: "app", Cued: true, UID: 1000, Args: v.app}},
						Sidecars: []Sidecar{sc}, SupervisorEnv: env}
					p, built := run(t, b, d)
					waitRecordStart(t, built.PilotRecord)
					recFile := filepath.Join(built.Shared, sc.RecordFile())
					waitRecordStart(t, recFile)
					releaseApps(t, p, built, d.Apps)
					checkEnd(t, p.MustWaitPhase(t, EventBound), v.phase, map[string]int{sc.name(): v.sidecarCode})
					record := v.record
					if v.own {
						record = termed
						if c.stop != "" {
							record = stopped
						}
					}
					checkRecord(t, recFile, record(c)...)
				})
			}
		}
	}
}
