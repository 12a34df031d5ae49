package supervisor

import (
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// knownSidecar is what the supervisor knows of a sidecar program: how to
// tell it (its usual container names, its main process's names), how to
// stop it so that it exits 0, and what it exits with. Each fact comes from
// the program's own source or documentation (named per entry), and is
// proven in e2e on its real binary or on a stand-in that follows it.
type knownSidecar struct {
	name       string   // as docs/sidecars.md's table names it
	containers []string // the container names its injector or its docs use
	processes  []string // its main process's names (comm or argv[0] base)
	// quit is its HTTP stop, if it has one.
	quit *httpStop
	// before is what its quit endpoint needs POSTed first, if anything.
	before *beforeQuit
	// handles are the signals it stops on gracefully once handlerWith, a
	// child it starts only after asking for them (signal.Notify), runs.
	handles     []exitwatch.Signal
	handlerWith string
	// termExit is what it exits with on SIGTERM (0 unless said), unless
	// its command line has zeroFlag; fix says how to make it exit 0.
	termExit int
	zeroFlag string
	fix      string
}

// httpStop is a sidecar's HTTP endpoint that stops it, exiting 0.
type httpStop struct {
	path     string
	port     int
	portFlag string // the flag that sets the port ("--admin-port"), if any
	// enableFlag must be on its command line for the endpoint to work; ""
	// when it always works, or when what enables it cannot be seen (an
	// environment variable, a config file): then it is tried, and a 404 or
	// a refusal falls back to SIGTERM.
	enableFlag string
}

// beforeQuit: an HTTP action whose path is quit is preceded by a POST of
// path, on the same host and port, its answer awaited.
type beforeQuit struct{ quit, path string }

// istio is the sidecar the settings ON_SUCCESS, ON_FAILURE and ON_UNKNOWN
// are about (and any sidecar the table does not know).
const istio = "Istio pilot-agent"

var knownSidecars = []knownSidecar{
	// pilot-agent (istio.io/istio pilot/cmd/pilot-agent/app/cmd.go):
	// initStatusServer, then `go cmd.WaitSignalFunc(cancel)`, which calls
	// signal.Notify(SIGINT, SIGTERM), then agent.Run, which starts envoy.
	// So a running envoy child means the goroutine that installs the
	// handler was started before it; envoy's start takes tens of
	// milliseconds of set-up more (SDS, the xDS proxy), far beyond a
	// goroutine's first run. Before that, SIGTERM kills it: 143. Its stop
	// is the settings' (SIGTERM drains; POST :15020/quitquitquit does not).
	//
	// Its POST :15020/quitquitquit skips the drain only from Istio 1.26
	// (istio/istio#55424). On 1.21-1.25 it shuts down through the drain
	// (terminationDrainDuration, 5 s by default; with
	// EXIT_ON_ZERO_ACTIVE_CONNECTIONS, 5 s and then until no connection is
	// left) unless POST /drain came first: that sets the skip once envoy has
	// answered its drain_listeners, and answers 200 only then
	// (pilot/cmd/pilot-agent/status/server.go handleDrain, pkg/envoy/
	// agent.go DrainNow and terminate, at each tag). 1.20 has no /drain
	// (404), and its quit is a SIGTERM to itself: the drain, exit 0. So
	// /drain goes first, its answer awaited, then the quit: pilot-agent
	// exits 0 at once from 1.21, after its drain on 1.20, and on 1.26+ it
	// costs one more round trip on loopback.
	{name: istio, containers: []string{"istio-proxy"}, processes: []string{"pilot-agent"},
		handles: []exitwatch.Signal{exitwatch.SIGINT, exitwatch.SIGTERM}, handlerWith: "envoy",
		before: &beforeQuit{quit: "/quitquitquit", path: "/drain"}},
	// linkerd2-proxy (linkerd2-proxy env.rs, admin/src/server.rs): POST
	// :4191/shutdown, loopback only, when LINKERD2_PROXY_SHUTDOWN_ENDPOINT_
	// ENABLED (the annotation config.linkerd.io/proxy-admin-shutdown: an
	// environment variable, unseen here). The wrapper linkerd2-proxy-run
	// execs it.
	{name: "Linkerd linkerd2-proxy", containers: []string{"linkerd-proxy"}, processes: []string{"linkerd2-proxy", "linkerd2-proxy-run"},
		quit: &httpStop{path: "/shutdown", port: 4191}},
	// daprd (dapr pkg/api/http/shutdown.go): POST :3500/v1.0/shutdown,
	// 204, exit 0; the port is --dapr-http-port.
	{name: "Dapr daprd", containers: []string{"daprd"}, processes: []string{"daprd"},
		quit: &httpStop{path: "/v1.0/shutdown", port: 3500, portFlag: "--dapr-http-port"}},
	// consul-dataplane (consul-dataplane lifecycle.go), under dumb-init in
	// its image: :20300/graceful_shutdown (consul-k8s passes
	// -graceful-port=20600), exit 0 after its grace period.
	{name: "Consul consul-dataplane", containers: []string{"consul-dataplane"}, processes: []string{"consul-dataplane", "dumb-init"},
		quit: &httpStop{path: "/graceful_shutdown", port: 20300, portFlag: "-graceful-port"}},
	// The Vault agent (vault command/agent.go handleQuit): POST
	// :8200/agent/v1/quit when agent_api.enable_quit (vault-k8s's
	// annotation agent-enable-quit; in its config, unseen here).
	{name: "Vault agent", containers: []string{"vault-agent"}, processes: []string{"vault"},
		quit: &httpStop{path: "/agent/v1/quit", port: 8200}},
	// cloud-sql-proxy v2 (cmd/root.go): GET or POST
	// :9091/quitquitquit with --quitquitquit (port: --admin-port), exit 0;
	// on SIGTERM it exits 143 unless --exit-zero-on-sigterm.
	{name: "cloud-sql-proxy v2", containers: []string{"cloud-sql-proxy"}, processes: []string{"cloud-sql-proxy"},
		quit:     &httpStop{path: "/quitquitquit", port: 9091, portFlag: "--admin-port", enableFlag: "--quitquitquit"},
		termExit: 143, zeroFlag: "--exit-zero-on-sigterm", fix: "start it with --exit-zero-on-sigterm or --quitquitquit"},
	// The OpenTelemetry collector (otelcol collector.go) and fluent-bit
	// (src/fluent-bit.c): SIGTERM, exit 0.
	{name: "OpenTelemetry collector", containers: []string{"otc-container", "otel-collector"}, processes: []string{"otelcol", "otelcol-contrib"}},
	{name: "fluent-bit", containers: []string{"fluent-bit"}, processes: []string{"fluent-bit"}},
}

// DefaultSidecars are the sidecar containers known by name: the default of
// SUPERVISOR_SIDECARS (and of the injection template's list).
func DefaultSidecars() []string {
	var out []string
	for _, k := range knownSidecars {
		out = append(out, k.containers...)
	}
	return out
}

// knownAs finds what the table knows of a sidecar container: by its
// Kubernetes name, else by its main process's name.
func knownAs(container string, main procscan.Process) *knownSidecar {
	for i, k := range knownSidecars {
		if slices.Contains(k.containers, container) {
			return &knownSidecars[i]
		}
	}
	for i, k := range knownSidecars {
		if main.Matches(k.processes) {
			return &knownSidecars[i]
		}
	}
	return nil
}

// flag returns the value of a flag on a command line ("--admin-port 9092",
// "--admin-port=9092", "-graceful-port=20600"), and whether it is there.
func flag(args []string, name string) (string, bool) {
	for i, a := range args {
		switch {
		case a == name && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-"):
			return args[i+1], true
		case a == name:
			return "", true
		case strings.HasPrefix(a, name+"="):
			return a[len(name)+1:], true
		}
	}
	return "", false
}

// stopURL is a known sidecar's HTTP stop, as its command line sets it up;
// nil when it has none, or its command line shows it is off.
func (k *knownSidecar) stopURL(args []string) *url.URL {
	q := k.quit
	if q == nil {
		return nil
	}
	if q.enableFlag != "" {
		if _, on := flag(args, q.enableFlag); !on {
			return nil
		}
	}
	port := q.port
	if v, ok := flag(args, q.portFlag); q.portFlag != "" && ok {
		if p, err := strconv.Atoi(v); err == nil && p > 0 && p < 65536 {
			port = p
		}
	}
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port), Path: q.path}
}
