package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pilotAgent stands in for Istio's pilot-agent where the real one is not
// wanted (fast tests, the qemu guest). Like the real one it is the
// istio-proxy container's main process with envoy as its child, serves
// POST 127.0.0.1:15020/quitquitquit and :15021/healthz/ready, and on
// SIGTERM drains for a while, stops envoy and exits 0. Every signal and
// request is appended to $PILOT_RECORD, one line each ("signal SIGTERM",
// "quitquitquit", "exit 0"), so tests can assert what it was sent.
//
//	PILOT_RECORD       file to append the record to
//	PILOT_DRAIN        how long to drain after SIGTERM (default 200ms)
//	PILOT_IGNORE_TERM  "1": ignore SIGTERM and SIGINT (a stuck sidecar)
//	PILOT_READY_DELAY  how long /healthz/ready answers 503 (default 0)
//	PILOT_ADMIN_ADDR   where /quitquitquit is served (127.0.0.1:15020)
//	PILOT_HEALTH_ADDR  where /healthz/ready is served (:15021): a second
//	                   stand-in in the pod (another sidecar) needs others
//	PILOT_TIMESTAMPS   file to append "signal SIGTERM UNIX_NS" and
//	                   "quitquitquit UNIX_NS" to, the time each was received
//	                   (benchmarks; the record's format stays as it is)
//	PILOT_HANDLER_CUE  a FIFO: it asks for SIGTERM (signal.Notify) only once
//	                   the FIFO is written and closed, between its status
//	                   server's start and envoy's, as the real one asks
//	                   after its status server: until then its Go runtime's
//	                   handler lets SIGTERM kill it (143). It records
//	                   "handler" then.
func pilotAgent(args []string) error {
	rec := newRecorder(os.Getenv("PILOT_RECORD"))
	drain := envDuration("PILOT_DRAIN", 200*time.Millisecond)
	readyAt := time.Now().Add(envDuration("PILOT_READY_DELAY", 0))
	ignore := os.Getenv("PILOT_IGNORE_TERM") == "1"
	stamps := newStamper(os.Getenv("PILOT_TIMESTAMPS"))

	handlerCue := os.Getenv("PILOT_HANDLER_CUE")

	// The real pilot-agent's order (pilot/cmd/pilot-agent/app/cmd.go): its
	// status server, then signal.Notify, then envoy.
	quit := make(chan struct{})
	var quitOnce sync.Once
	admin := http.NewServeMux()
	admin.HandleFunc("/quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		stamps.stamp("quitquitquit", time.Now())
		rec.log("quitquitquit")
		w.Write([]byte("OK"))
		quitOnce.Do(func() { close(quit) })
	})
	health := http.NewServeMux()
	health.HandleFunc("/healthz/ready", func(w http.ResponseWriter, r *http.Request) {
		if time.Now().Before(readyAt) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready"))
	})
	adminAddr, healthAddr := envOr("PILOT_ADMIN_ADDR", "127.0.0.1:15020"), envOr("PILOT_HEALTH_ADDR", ":15021")
	for addr, mux := range map[string]*http.ServeMux{adminAddr: admin, healthAddr: health} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		go http.Serve(l, mux)
	}

	if handlerCue != "" {
		// Blocks until the test opens the FIFO for writing, then reads to
		// its close.
		if b, err := os.ReadFile(handlerCue); err != nil {
			return fmt.Errorf("handler cue: %w (read %q)", err, b)
		}
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	if handlerCue != "" {
		rec.log("handler")
	}

	// envoy is a child of its own mode: a PODSIM_MODE that made this
	// process pilot-agent (under another name) must not make it one too.
	os.Unsetenv(modeEnv)
	envoy := exec.Command("/proc/self/exe")
	envoy.Args = []string{"envoy"}
	envoy.Stdout, envoy.Stderr = os.Stdout, os.Stderr
	if err := envoy.Start(); err != nil {
		return fmt.Errorf("start envoy: %w", err)
	}
	go envoy.Wait()
	rec.log("start pid=%d envoy=%d uid=%d", os.Getpid(), envoy.Process.Pid, os.Getuid())
	stopEnvoy := func() {
		envoy.Process.Signal(syscall.SIGTERM)
	}
	for {
		select {
		case <-quit:
			// As the real one: no drain, exit 0 at once.
			time.Sleep(20 * time.Millisecond)
			stopEnvoy()
			rec.log("exit 0")
			os.Exit(0)
		case sig := <-sigs:
			stamps.stamp("signal "+sigName(sig.(syscall.Signal)), time.Now())
			rec.log("signal %s", sigName(sig.(syscall.Signal)))
			if ignore || (sig != syscall.SIGTERM && sig != syscall.SIGINT) {
				continue
			}
			time.Sleep(drain)
			stopEnvoy()
			rec.log("exit 0")
			os.Exit(0)
		}
	}
}

// envoy is pilot-agent's child: it only waits, and exits on SIGTERM.
func envoy(args []string) error {
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafePtr("envoy")), 0, 0, 0)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	return nil
}

type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func newRecorder(path string) *recorder {
	r := &recorder{}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
		if err != nil {
			fmt.Fprintf(os.Stderr, "record: %v\n", err)
		}
		r.f = f
	}
	return r
}

func (r *recorder) log(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), line)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		r.f.WriteString(line + "\n")
	}
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
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
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(args[0])
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %s (last: %v)", args[0], timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
