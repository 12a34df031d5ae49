package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pilotAgent stands in for Istio's pilot-agent where the real one is not
// wanted (fast tests, the qemu guest, Istio releases that cannot be built
// here). Like the real one it is the istio-proxy container's main process
// with envoy as its child, serves :15021/healthz/ready, and on its status
// port 127.0.0.1:15020 POST /quitquitquit and /drain (loopback only: 403;
// other methods: 405), as the release PILOT_ISTIO does:
//
//   - SIGTERM or SIGINT: drain (terminationDrainDuration, PILOT_DRAIN),
//     stop envoy, exit 0. With EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true the
//     drain is MINIMUM_DRAIN_DURATION and then a look every second until
//     no connection to PILOT_INBOUND_ADDR (the app's inbound port, if set)
//     is left. Only the first signal counts; later ones are swallowed.
//   - 1.20: /quitquitquit sends SIGTERM to itself (the drain); /drain is
//     404 (it has none).
//   - 1.21 to 1.25: /quitquitquit shuts down through the drain, unless
//     /drain came first: that drains envoy's listeners, sets the skip, and
//     answers 200 only then.
//   - 1.26 and later (the default): /quitquitquit sets the skip and shuts
//     down: exit 0 at once.
//   - Until envoy runs (the real one's agent is made just before it starts
//     envoy), /drain (1.21+) and /quitquitquit (1.26+) panic on the nil
//     agent: the connection closes with no answer, and it runs on.
//
// (Read in Istio's source at each tag: pilot/cmd/pilot-agent/status/
// server.go handleQuit, handleDrain, notifyExit; pkg/envoy/agent.go
// terminate, DrainNow, the active-connections loop.)
//
// Every signal and request is appended to $PILOT_RECORD, one line each
// ("signal SIGTERM", "quitquitquit", "drain", "refused POST /drain 404",
// "no answer POST /drain"), then "exit 0" after a drain or "exit 0 at once"
// without one, so tests can assert what it was sent and what it did.
//
//	PILOT_ISTIO        the release it behaves as (1.20 ... 1.31; default: the newest)
//	PILOT_RECORD       file to append the record to
//	PILOT_DRAIN        terminationDrainDuration (default 200ms; Istio's is 5s)
//	PILOT_IGNORE_TERM  "1": ignore SIGTERM and SIGINT (a stuck sidecar)
//	PILOT_READY_DELAY  how long /healthz/ready answers 503 (default 0)
//	PILOT_ADMIN_ADDR   its status port (127.0.0.1:15020)
//	PILOT_HEALTH_ADDR  where /healthz/ready is served (:15021): a second
//	                   stand-in in the pod (another sidecar) needs others
//	PILOT_INBOUND_ADDR a port it accepts connections on and counts, as
//	                   envoy's inbound listeners (EXIT_ON_ZERO_ACTIVE_CONNECTIONS)
//	PILOT_TIMESTAMPS   file to append "signal SIGTERM UNIX_NS" and
//	                   "quitquitquit UNIX_NS" to, the time each was received
//	                   (benchmarks; the record's format stays as it is)
//	PILOT_DRAIN_CUE    a FIFO: the drain (instead of PILOT_DRAIN) lasts until
//	                   the FIFO is written and closed: a test that must act
//	                   while the sidecar drains ends it when done
//	PILOT_FIRST_EXIT   the code the first instance exits with (none has
//	                   recorded its start yet) instead of 0, as the runtime
//	                   may report istio-proxy's exit (255) when it loses it:
//	                   under OnFailure the kubelet starts it again
//	PILOT_HANDLER_CUE  a FIFO: it asks for SIGTERM (signal.Notify) only once
//	                   the FIFO is written and closed, between its status
//	                   server's start and envoy's, as the real one asks
//	                   after its status server: until then its Go runtime's
//	                   handler lets SIGTERM kill it (143). It records
//	                   "handler" then.
func pilotAgent(args []string) error {
	rec := newRecorder(os.Getenv("PILOT_RECORD"))
	release, err := istioRelease(os.Getenv("PILOT_ISTIO"))
	if err != nil {
		return err
	}
	drain := envDuration("PILOT_DRAIN", 200*time.Millisecond)
	exitOnZero := os.Getenv("EXIT_ON_ZERO_ACTIVE_CONNECTIONS") == "true"
	minDrain := envDuration("MINIMUM_DRAIN_DURATION", 5*time.Second)
	readyAt := time.Now().Add(envDuration("PILOT_READY_DELAY", 0))
	ignore := os.Getenv("PILOT_IGNORE_TERM") == "1"
	stamps := newRecorder(os.Getenv("PILOT_TIMESTAMPS"))
	handlerCue := os.Getenv("PILOT_HANDLER_CUE")
	drainCue := os.Getenv("PILOT_DRAIN_CUE")

	var (
		agentMade  atomic.Bool // envoy started: the real one's agent exists
		skipDrain  atomic.Bool
		shutdown   = make(chan struct{})
		shutOnce   sync.Once
		inbound    atomic.Int64 // open connections to PILOT_INBOUND_ADDR
		cancelRoot = func() { shutOnce.Do(func() { close(shutdown) }) }
	)
	// The checks of the real handlers, in their order: loopback, then POST.
	guard := func(w http.ResponseWriter, r *http.Request) bool {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			http.Error(w, "Only requests from localhost are allowed", http.StatusForbidden)
			return false
		}
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return false
		}
		return true
	}
	// nilAgent: the real handler dereferences an agent not yet made; the
	// panic closes the connection without an answer.
	nilAgent := func(r *http.Request) {
		rec.log("no answer POST %s", r.URL.Path)
		panic(http.ErrAbortHandler)
	}
	admin := http.NewServeMux()
	admin.HandleFunc("/quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		if !guard(w, r) {
			return
		}
		if release >= 126 && !agentMade.Load() {
			nilAgent(r)
		}
		stamps.stamp("quitquitquit", time.Now())
		rec.log("quitquitquit")
		w.Write([]byte("OK"))
		switch {
		case release < 121:
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
		case release < 126:
			cancelRoot()
		default:
			skipDrain.Store(true)
			cancelRoot()
		}
	})
	admin.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/drain" || release < 121 {
			rec.log("refused %s %s 404", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		if !guard(w, r) {
			return
		}
		if !agentMade.Load() {
			nilAgent(r)
		}
		// envoy's drain_listeners?inboundonly&graceful&skip_exit, then the
		// skip; the 200 is flushed when the handler returns.
		rec.log("drain")
		skipDrain.Store(true)
		w.Write([]byte("OK"))
	})
	health := http.NewServeMux()
	health.HandleFunc("/healthz/ready", func(w http.ResponseWriter, r *http.Request) {
		if time.Now().Before(readyAt) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready"))
	})
	adminAddr, healthAddr := cmp.Or(os.Getenv("PILOT_ADMIN_ADDR"), "127.0.0.1:15020"), cmp.Or(os.Getenv("PILOT_HEALTH_ADDR"), ":15021")
	status := &http.Server{Handler: admin}
	for addr, srv := range map[string]*http.Server{adminAddr: status, healthAddr: {Handler: health}} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		go srv.Serve(l)
	}
	// exit ends the process once the status port's answers are written:
	// the real one can exit before its quit's 200 is flushed (the
	// supervisor copes, and its own tests show it); the stand-in's record
	// and answers stay exact.
	code := 0
	if c, err := strconv.Atoi(os.Getenv("PILOT_FIRST_EXIT")); err == nil && !recorded(os.Getenv("PILOT_RECORD"), "start ") {
		code = c
	}
	exit := func(line string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		status.Shutdown(ctx)
		cancel()
		rec.log("%s", strings.Replace(line, "exit 0", fmt.Sprintf("exit %d", code), 1))
		os.Exit(code)
	}
	if addr := os.Getenv("PILOT_INBOUND_ADDR"); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		go countConnections(l, &inbound, rec)
	}

	if handlerCue != "" {
		if err := waitFIFO(handlerCue); err != nil {
			return fmt.Errorf("handler cue: %w", err)
		}
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	if handlerCue != "" {
		rec.log("handler")
	}

	envoy, err := startEnvoy()
	if err != nil {
		return err
	}
	agentMade.Store(true)
	go envoy.Wait()
	rec.log("start pid=%d envoy=%d uid=%d", os.Getpid(), envoy.Process.Pid, os.Getuid())

	// The root context's end: a quit, or the first SIGTERM or SIGINT.
	go func() {
		for sig := range sigs {
			stamps.stamp("signal "+sigName(sig.(syscall.Signal)), time.Now())
			rec.log("signal %s", sigName(sig.(syscall.Signal)))
			if !ignore && (sig == syscall.SIGTERM || sig == syscall.SIGINT) {
				cancelRoot()
			}
		}
	}()
	<-shutdown
	// terminate (pkg/envoy/agent.go).
	switch {
	case skipDrain.Load():
		// "Agent already drained, exiting immediately" (1.21+).
		envoy.Process.Kill()
		exit("exit 0 at once")
	case exitOnZero:
		// Then a look at envoy's downstream_cx_active every second, with
		// no bound of its own.
		time.Sleep(minDrain)
		for said := false; inbound.Load() > 0; {
			if !said {
				rec.log("waiting for %d connections", inbound.Load())
				said = true
			}
			time.Sleep(time.Second)
		}
	case drainCue != "":
		waitFIFO(drainCue)
	default:
		time.Sleep(drain)
	}
	envoy.Process.Kill()
	exit("exit 0")
	return nil
}

// istioRelease reads PILOT_ISTIO ("1.24", "1.24.3") as 100*major+minor;
// "" is the newest.
func istioRelease(v string) (int, error) {
	if v == "" {
		return 199, nil
	}
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil || major != 1 {
		return 0, fmt.Errorf("PILOT_ISTIO=%q: want a 1.x release such as 1.24", v)
	}
	return 100*major + minor, nil
}

// countConnections accepts connections on l and keeps n the number open
// (each is held until its peer closes it), recording "inbound open N".
func countConnections(l net.Listener, n *atomic.Int64, rec *recorder) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		rec.log("inbound open %d", n.Add(1))
		go func() {
			io.Copy(io.Discard, c)
			c.Close()
			n.Add(-1)
		}()
	}
}

// startEnvoy starts envoy, the child of pilot-agent and consul-dataplane,
// in its own mode: a PODSIM_MODE that made this process what it is (under
// another name) must not make the child that too.
func startEnvoy() (*exec.Cmd, error) {
	os.Unsetenv(modeEnv)
	envoy := exec.Command("/proc/self/exe")
	envoy.Args = []string{"envoy"}
	envoy.Stdout, envoy.Stderr = os.Stdout, os.Stderr
	if err := envoy.Start(); err != nil {
		return nil, fmt.Errorf("start envoy: %w", err)
	}
	return envoy, nil
}

// envoy is pilot-agent's child: it only waits, and exits on SIGTERM.
func envoy(args []string) error {
	setComm("envoy")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	return nil
}

// envDuration is $name as a duration; def when unset or not one.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

func sigName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return n
	}
	return "SIG" + strconv.Itoa(int(s))
}

// waitHTTP polls a URL until it answers 200: a postStart hook.
func waitHTTP(args []string) error {
	if len(args) < 1 {
		return errors.New("usage: wait-http URL [TIMEOUT]")
	}
	timeout := 30 * time.Second
	if len(args) > 1 {
		d, err := time.ParseDuration(args[1])
		if err != nil {
			return err
		}
		timeout = d
	}
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		resp, err := client.Get(args[0])
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (last: %v)", args[0], timeout, err)
		}
	}
}

// recorded reports whether the record file holds a line starting with
// prefix.
func recorded(path, prefix string) bool {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
