package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Stand-ins for the sidecars whose real binaries cannot be built here (the
// Go module proxy does not serve them, or not in reasonable time). Each
// follows its program's documentation and source where a Job's end depends
// on it: its process name (its mode, the name it runs under), its HTTP stop
// (method, address, path, the flag, variable or configuration that enables
// it, the answer), and its exit code after that stop and after SIGTERM.
// They catch SIGTERM before anything else and then record "start": a test
// that waits for that line stops a sidecar that handles the signal. Every
// signal and request is appended to $STANDIN_RECORD, one line each
// ("signal SIGTERM", "stop POST /v1.0/shutdown", "refused GET /shutdown
// 405", "exit 0"). Sources, each read for the version in the comment:
//
//	daprd             dapr/dapr cmd/daprd/app/app.go, pkg/api/http/shutdown.go,
//	                  pkg/api/universal/shutdown.go; dapr/kit signals/signals.go
//	linkerd2-proxy    linkerd/linkerd2-proxy linkerd/app/src/env.rs,
//	                  linkerd/app/admin/src/server.rs; linkerd2#12705
//	consul-dataplane  hashicorp/consul-dataplane cmd/consul-dataplane/main.go,
//	                  pkg/consuldp/lifecycle.go, consul_dataplane.go
//	vault             hashicorp/vault command/agent.go (handleQuit);
//	                  hashicorp/vault-k8s agent-inject/agent/container_sidecar.go
//	otelcol-contrib   go.opentelemetry.io/collector/otelcol collector.go
//	fluent-bit        fluent/fluent-bit src/fluent-bit.c
func sidecarStandIn(mode string, args []string) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	s := &standIn{rec: newRecorder(os.Getenv("STANDIN_RECORD")), sigs: sigs, quit: make(chan int, 1)}
	switch mode {
	case "daprd":
		return s.daprd(args)
	case "linkerd2-proxy":
		return s.linkerd()
	case "consul-dataplane":
		return s.consulDataplane(args)
	case "vault":
		return s.vault(args)
	case "otelcol", "otelcol-contrib":
		return s.run(nil, 0, 0)
	case "fluent-bit":
		return s.fluentBit(args)
	}
	return fmt.Errorf("no stand-in for %q", mode)
}

// standIn is one running stand-in.
type standIn struct {
	rec  *recorder
	sigs chan os.Signal
	// quit receives the exit code an HTTP stop ends with.
	quit     chan int
	quitOnce sync.Once
	// onStop runs before exiting (consul-dataplane stops envoy).
	onStop func()
}

// endpoint is an HTTP stop: a path on an address, the methods it takes
// (nil: any), the status it answers, and whether it is enabled (a disabled
// one answers disabledStatus).
type endpoint struct {
	addr, path     string
	methods        []string
	status         int
	enabled        bool
	disabledStatus int
	// exitCode is the program's exit code after this stop.
	exitCode int
	// wrongMethod answers a method not in methods (default 405).
	wrongMethod int
}

// serve listens on each endpoint's address (after the signal handler, as
// each real one does) and answers its path.
func (s *standIn) serve(eps []endpoint) error {
	muxes := map[string]*http.ServeMux{}
	for _, ep := range eps {
		mux := muxes[ep.addr]
		if mux == nil {
			mux = http.NewServeMux()
			muxes[ep.addr] = mux
		}
		mux.HandleFunc(ep.path, func(w http.ResponseWriter, r *http.Request) {
			switch {
			case !ep.enabled:
				s.rec.log("refused %s %s %d", r.Method, r.URL.Path, ep.disabledStatus)
				w.WriteHeader(ep.disabledStatus)
			case ep.methods != nil && !slices.Contains(ep.methods, r.Method):
				code := cmp.Or(ep.wrongMethod, http.StatusMethodNotAllowed)
				s.rec.log("refused %s %s %d", r.Method, r.URL.Path, code)
				w.WriteHeader(code)
			default:
				s.rec.log("stop %s %s", r.Method, r.URL.Path)
				w.WriteHeader(ep.status)
				s.quitOnce.Do(func() { s.quit <- ep.exitCode })
			}
		})
	}
	for addr, mux := range muxes {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		go http.Serve(l, mux)
	}
	return nil
}

// run serves eps, records the start, then waits: an HTTP stop ends it with
// its endpoint's exit code after drain, SIGTERM or SIGINT with termExit
// after drain.
func (s *standIn) run(eps []endpoint, termExit int, drain time.Duration) error {
	if err := s.serve(eps); err != nil {
		return err
	}
	s.rec.log("start pid=%d uid=%d", os.Getpid(), os.Getuid())
	var code int
	select {
	case code = <-s.quit:
	case sig := <-s.sigs:
		s.rec.log("signal %s", sigName(sig.(syscall.Signal)))
		code = termExit
	}
	time.Sleep(drain)
	if s.onStop != nil {
		s.onStop()
	}
	s.rec.log("exit %d", code)
	os.Exit(code)
	return nil
}

// daprd: the HTTP API on --dapr-http-port (3500) serves POST
// /v1.0/shutdown, always: 204, then the same graceful shutdown as SIGTERM,
// exit 0 (its dapr-force-shutdown header, which exits 1, is not modelled).
// Other methods match no route: 404. Checked against the real daprd v1.14.0
// (built once from the module proxy, standalone, offline): POST 204 and
// exit 0 in 10 ms, GET and PUT 404, SIGTERM exit 0.
func (s *standIn) daprd(args []string) error {
	port := argValue(args, "dapr-http-port", "3500")
	return s.run([]endpoint{{addr: "127.0.0.1:" + port, path: "/v1.0/shutdown", methods: []string{http.MethodPost},
		status: http.StatusNoContent, enabled: true, wrongMethod: http.StatusNotFound}}, 0, 0)
}

// linkerd2-proxy: the admin server on $LINKERD2_PROXY_ADMIN_LISTEN_ADDR
// (127.0.0.1:4191; the injector sets 0.0.0.0:4191) serves POST /shutdown
// when $LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED is true (Linkerd 2.16 on:
// the config.linkerd.io/proxy-admin-shutdown annotation, off by default):
// 200 "shutdown", exit 0. Disabled it is not routed: 404.
func (s *standIn) linkerd() error {
	addr := cmp.Or(os.Getenv("LINKERD2_PROXY_ADMIN_LISTEN_ADDR"), "127.0.0.1:4191")
	enabled, _ := strconv.ParseBool(os.Getenv("LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED"))
	return s.run([]endpoint{{addr: addr, path: "/shutdown", methods: []string{http.MethodPost},
		status: http.StatusOK, enabled: enabled, disabledStatus: http.StatusNotFound}}, 0, 0)
}

// consul-dataplane: starts envoy (its child), then its lifecycle server on
// 127.0.0.1:-graceful-port ($DP_GRACEFUL_PORT, 20300; consul-k8s passes
// 20600) serving -graceful-shutdown-path (/graceful_shutdown), any method,
// always: 200, then it waits -shutdown-grace-period-seconds
// ($DP_SHUTDOWN_GRACE_PERIOD_SECONDS, 0; consul-k8s's default 30), stops
// envoy and exits 0. SIGTERM takes the same path.
func (s *standIn) consulDataplane(args []string) error {
	port := argValue(args, "graceful-port", cmp.Or(os.Getenv("DP_GRACEFUL_PORT"), "20300"))
	path := argValue(args, "graceful-shutdown-path", cmp.Or(os.Getenv("DP_GRACEFUL_SHUTDOWN_PATH"), "/graceful_shutdown"))
	grace, err := strconv.Atoi(argValue(args, "shutdown-grace-period-seconds", cmp.Or(os.Getenv("DP_SHUTDOWN_GRACE_PERIOD_SECONDS"), "0")))
	if err != nil {
		return fmt.Errorf("-shutdown-grace-period-seconds: %w", err)
	}
	envoy, err := startEnvoy()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { envoy.Wait(); close(done) }()
	s.onStop = func() {
		envoy.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	return s.run([]endpoint{{addr: "127.0.0.1:" + port, path: path, status: http.StatusOK, enabled: true}},
		0, time.Duration(grace)*time.Second)
}

// vault (agent): `vault agent -config=FILE`, FILE the JSON vault-k8s writes
// from $VAULT_CONFIG. Each tcp listener serves /agent/v1/quit; with
// agent_api.enable_quit (vault-k8s: the agent-enable-quit annotation) POST
// gets 200 and the agent exits 0, other methods 405; without it 404.
// SIGTERM: exit 0.
func (s *standIn) vault(args []string) error {
	if len(args) == 0 || args[0] != "agent" {
		return errors.New("usage: vault agent -config=FILE")
	}
	file := argValue(args[1:], "config", "")
	if file == "" {
		return errors.New("vault agent: -config=FILE is required")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var cfg struct {
		Listener []struct {
			Type     string `json:"type"`
			Address  string `json:"address"`
			AgentAPI *struct {
				EnableQuit bool `json:"enable_quit"`
			} `json:"agent_api"`
		} `json:"listener"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	var eps []endpoint
	for _, l := range cfg.Listener {
		if l.Type != "tcp" {
			continue
		}
		eps = append(eps, endpoint{addr: l.Address, path: "/agent/v1/quit", methods: []string{http.MethodPost},
			status: http.StatusOK, enabled: l.AgentAPI != nil && l.AgentAPI.EnableQuit, disabledStatus: http.StatusNotFound})
	}
	return s.run(eps, 0, 0)
}

// fluent-bit: no HTTP stop. SIGTERM: flush for up to the configuration's
// Grace (5 s by default; read from the -c file here), exit 0.
func (s *standIn) fluentBit(args []string) error {
	grace := 5
	if file := argValue(args, "c", argValue(args, "config", "")); file != "" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) == 2 && strings.EqualFold(fields[0], "grace") {
				if grace, err = strconv.Atoi(fields[1]); err != nil {
					return fmt.Errorf("%s: grace: %w", file, err)
				}
			}
		}
		f.Close()
	}
	return s.run(nil, 0, time.Duration(grace)*time.Second)
}

// argValue finds a flag in the forms -name v, --name v, -name=v, --name=v.
func argValue(args []string, name, def string) string {
	for i, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return def
}
