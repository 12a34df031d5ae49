// Command envoy is a stand-in for Envoy, for end-to-end tests that run the
// real Istio pilot-agent where no envoy binary can be had. It is named envoy
// so that process listings (and the supervisor's classification) see what a
// real istio-proxy container has: pilot-agent with an envoy child.
//
// It accepts the command line pilot-agent gives envoy (-c envoy-rev.json,
// --drain-time-s, ...), reads the admin address and the static HTTP listeners
// from that bootstrap, and serves:
//
//   - the admin API (127.0.0.1:15000 in Istio's bootstrap): /stats with the
//     values pilot-agent's readiness probe wants (server.state LIVE,
//     listener_manager.workers_started 1, cds/lds update_success 1),
//     POST /drain_listeners, POST /quitquitquit, /ready, /server_info, ...;
//   - each static listener with HTTP routes to static clusters, by forwarding
//     the request: 0.0.0.0:15021/healthz/ready reaches pilot-agent's
//     :15020/healthz/ready as it does through a real envoy.
//
// It proxies no application traffic and has no xDS client: it claims to have
// received its config as soon as it starts (or after ENVOY_STANDIN_READY_DELAY).
//
// Every admin request, forwarded request, signal and exit is appended to the
// file named by $ENVOY_STANDIN_RECORD, one JSON object per line (see package
// e2e/istioproxy/record).
//
// Exits: 0 on SIGTERM or SIGINT (as envoy does), 0 after answering POST
// /quitquitquit, 1 on a bad command line, bootstrap or port clash. SIGKILL,
// which pilot-agent uses to stop envoy, is of course not recorded.
//
// Environment:
//
//	ENVOY_STANDIN_RECORD          record file (default: none)
//	ENVOY_STANDIN_READY_DELAY     Go duration before the stats say ready (default 0)
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
	"golang.org/x/sys/unix"
)

const envReadyDelay = "ENVOY_STANDIN_READY_DELAY"

func main() {
	os.Exit(run())
}

func run() int {
	var rec *record.Writer
	if p := os.Getenv(record.EnvVar); p != "" {
		var err error
		if rec, err = record.Create(p); err != nil {
			fmt.Fprintf(os.Stderr, "envoy stand-in: %v\n", err)
			return 1
		}
		defer rec.Close()
	}
	uid := os.Getuid()
	_ = rec.Write(record.Event{Kind: record.Start, PID: os.Getpid(), UID: &uid, Args: os.Args})

	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "envoy stand-in: %v\n", err)
		_ = rec.Write(record.Event{Kind: record.Error, Reason: err.Error()})
		_ = rec.Write(record.Event{Kind: record.Exit, Code: 1, Reason: err.Error()})
		return 1
	}

	opts, err := parseArgs(os.Args[1:])
	if err != nil {
		return fail(fmt.Errorf("command line: %w", err))
	}
	if opts.version {
		fmt.Println("envoy stand-in (sidecar-supervisor e2e)")
		return 0
	}
	boot, err := loadBootstrap(opts.configPath)
	if err != nil {
		return fail(fmt.Errorf("bootstrap: %w", err))
	}
	readyDelay := time.Duration(0)
	if v := os.Getenv(envReadyDelay); v != "" {
		if readyDelay, err = time.ParseDuration(v); err != nil {
			return fail(fmt.Errorf("%s=%q: %w", envReadyDelay, v, err))
		}
	}

	// Subscribe before opening ports: a SIGTERM that arrives as soon as
	// someone sees us listening must not kill us unrecorded.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)

	srv := &server{start: time.Now(), concurrency: opts.concurrency, drainTime: opts.drainTime}
	quit := make(chan string, 1)
	admin := &adminHandler{
		srv: srv, rec: rec,
		drain: func(q url.Values) {
			srv.mu.Lock()
			srv.draining = true
			srv.mu.Unlock()
			_ = rec.Write(record.Event{Kind: record.Drain,
				Graceful: has(q, "graceful"), InboundOnly: has(q, "inboundonly"), SkipExit: has(q, "skip_exit")})
		},
		quit: func() {
			select {
			case quit <- "POST /quitquitquit":
			default:
			}
		},
	}

	var servers []*http.Server
	serve := func(name, addr string, h http.Handler) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listener %s: %w", name, err)
		}
		s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, s)
		go func() { _ = s.Serve(l) }()
		_ = rec.Write(record.Event{Kind: record.Listen, Name: name, Addr: l.Addr().String()})
		return nil
	}
	if err := serve("admin", boot.adminAddr, admin); err != nil {
		return fail(err)
	}
	for _, l := range boot.listeners {
		srv.listeners = append(srv.listeners, statName(l.addr))
		if err := serve(l.name, l.addr, newRouter(l, rec)); err != nil {
			return fail(err)
		}
	}
	fmt.Fprintf(os.Stderr, "envoy stand-in: pid %d, admin on %s, %d listeners, record %q\n",
		os.Getpid(), boot.adminAddr, len(boot.listeners), os.Getenv(record.EnvVar))

	setReady := func() {
		srv.mu.Lock()
		srv.ready = true
		srv.mu.Unlock()
		_ = rec.Write(record.Event{Kind: record.Ready})
	}
	if readyDelay > 0 {
		time.AfterFunc(readyDelay, setReady)
	} else {
		setReady()
	}

	go watchParent(quit)

	code, reason := 0, ""
	for reason == "" {
		select {
		case s := <-sigs:
			name := unix.SignalName(s.(syscall.Signal))
			_ = rec.Write(record.Event{Kind: record.Signal, Signal: name})
			switch s {
			case syscall.SIGTERM, syscall.SIGINT:
				reason = name
			}
			// SIGHUP is ignored and SIGUSR1 reopens logs in envoy: nothing to do.
		case reason = <-quit:
		}
	}
	_ = rec.Write(record.Event{Kind: record.Exit, Code: code, Reason: reason})
	// Let in-flight answers (the quitquitquit "OK") finish, but do not linger.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(ctx)
	}
	return code
}

// watchParent ends the stand-in when its parent (pilot-agent) is gone. A real
// envoy would stay on as an orphan, but in a real pod the container runtime
// then kills everything left in the container; the test harnesses do not, so
// without this a SIGKILLed pilot-agent would leak an envoy holding the ports.
// Polling getppid is used rather than PR_SET_PDEATHSIG, which fires when the
// parent *thread* that forked us exits, and Go may retire that thread.
func watchParent(quit chan<- string) {
	parent := os.Getppid()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for range t.C {
		if os.Getppid() != parent {
			select {
			case quit <- fmt.Sprintf("parent %d exited", parent):
			default:
			}
			return
		}
	}
}

// statName turns a listener address into envoy's stat name for it:
// "0.0.0.0:15021" -> "0.0.0.0_15021".
func statName(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host + "_" + port
}
