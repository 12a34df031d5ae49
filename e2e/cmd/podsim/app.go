package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// app is the application of a test pod.
//
//	--sleep D       work for D, then end
//	--exit N        end with exit code N
//	--kill SIG      end by sending itself SIG (a number)
//	--core DIR      with --kill: let SIG's default action run, dumping core
//	                into DIR (a core-dumping signal such as 6, SIGABRT)
//	--orphan D      start a child that outlives the app by D
//	--on-term-until PATH
//	                on SIGTERM, keep working until PATH (a FIFO) is opened
//	                for writing and closed (a drain a test ends), then end
//	--term-exit N   the exit code after a SIGTERM drain (default 143)
//	--get URL       during the SIGTERM drain, GET URL every 200ms and
//	                record each outcome ("get ok 200" / "get fail ..."); a
//	                call fails on an error, or after 30s without an answer
//	--record FILE   append events to FILE
//	--fifo PATH     work until PATH (a FIFO) is opened for writing and
//	                closed, then end (instead of --sleep): a benchmark's
//	                trigger, with no polling
//	--stamps FILE   append "exit UNIX_NS" right before ending, by exit or by
//	                --kill (benchmarks, invariant checks)
//	--ack FIFO      on each SIGUSR1, write one byte to FIFO (the signal-rate
//	                benchmark's ping-pong)
//	--fail-first N  the first N runs (counted in FILE.attempts next to the
//	                --record FILE, across restarts) exit 1 instead of --exit
func app(args []string) error {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	sleep := fs.Duration("sleep", 0, "")
	code := fs.Int("exit", 0, "")
	kill := fs.Int("kill", 0, "")
	coreDir := fs.String("core", "", "")
	orphan := fs.Duration("orphan", 0, "")
	onTermUntil := fs.String("on-term-until", "", "")
	termExit := fs.Int("term-exit", 143, "")
	get := fs.String("get", "", "")
	record := fs.String("record", "", "")
	fifo := fs.String("fifo", "", "")
	stamps := fs.String("stamps", "", "")
	ack := fs.String("ack", "", "")
	failFirst := fs.Int("fail-first", 0, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *failFirst > 0 && *record != "" {
		f, err := os.OpenFile(*record+".attempts", os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o666)
		if err != nil {
			return err
		}
		prior, _ := io.ReadAll(f)
		f.WriteString("x")
		f.Close()
		if len(prior) < *failFirst {
			*code = 1
		}
	}
	// SIGTERM is handled from before "app start" is recorded: a test that
	// saw the line may delete the pod.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	rec := newRecorder(*record)
	rec.log("app start pid=%d ppid=%d uid=%d", os.Getpid(), os.Getppid(), os.Getuid())
	st := newRecorder(*stamps)
	exit := func(code int) {
		st.stamp("exit", time.Now())
		os.Exit(code)
	}
	if *ack != "" {
		if err := ackSignals(*ack); err != nil {
			return err
		}
	}
	if *orphan > 0 {
		// argv[0] podsim: under its own name, /proc/self/exe, it would be
		// mode "exe", and exit at once.
		c := &exec.Cmd{Path: "/proc/self/exe", Args: []string{"podsim", "app", "--sleep", orphan.String()}}
		if err := c.Start(); err != nil {
			return err
		}
	}
	worked := make(chan struct{})
	if *fifo != "" {
		go func() { waitFIFO(*fifo); close(worked) }()
	} else {
		time.AfterFunc(*sleep, func() { close(worked) })
	}
	select {
	case <-worked:
	case <-sigs:
		rec.log("app signal SIGTERM")
		if *onTermUntil != "" {
			drain(rec, *onTermUntil, *get)
		}
		rec.log("app exit %d", *termExit)
		exit(*termExit)
	}
	if *kill != 0 {
		rec.log("app kill %d", *kill)
		if *coreDir != "" {
			if err := allowCore(*coreDir, syscall.Signal(*kill)); err != nil {
				return err
			}
		}
		st.stamp("exit", time.Now())
		signal.Reset()
		syscall.Kill(os.Getpid(), syscall.Signal(*kill))
		time.Sleep(time.Minute)
	}
	rec.log("app exit %d", *code)
	fmt.Fprintf(os.Stdout, "app done\n")
	exit(*code)
	return nil
}

// drain is the app's work after SIGTERM: until the FIFO until is written
// and closed; with get, a call to it every 200ms, each recorded.
// A call is bounded by 30s only: on a loaded machine an answer may be
// slow, and a refused connection (the sidecar gone) fails at once anyway.
func drain(rec *recorder, until, get string) {
	done := make(chan struct{})
	go func() { waitFIFO(until); close(done) }()
	c := &http.Client{Timeout: 30 * time.Second}
	for {
		select {
		case <-done:
			return
		default:
		}
		if get != "" {
			resp, err := c.Get(get)
			if err != nil {
				rec.log("get fail %v", err)
			} else {
				resp.Body.Close()
				rec.log("get ok %d", resp.StatusCode)
			}
		}
		select {
		case <-done:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitFIFO returns once a writer has opened and closed path, a FIFO:
// opening one for reading waits for a writer, reading it for its close.
// An error is said on stderr too.
func waitFIFO(path string) error {
	_, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fifo: %v\n", err)
	}
	return err
}

// ackSignals answers each SIGUSR1 with one byte written to the FIFO at path.
// O_RDWR: on Linux, opening a FIFO so never waits for the other end.
func ackSignals(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			f.Write([]byte{1})
		}
	}()
	return nil
}

// allowCore makes sig kill the app with a core dump written into dir, as a
// C program's abort() would: the Go runtime catches SIGABRT, SIGQUIT,
// SIGSEGV and the like itself (a goroutine dump, then exit 2), so sig's
// action goes back to the kernel's default; and the soft RLIMIT_CORE,
// 0 by default, goes up to the hard limit. The kernel writes "core" (the
// default core_pattern) into the working directory.
func allowCore(dir string, sig syscall.Signal) error {
	if err := os.Chdir(dir); err != nil {
		return err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &lim); err != nil {
		return err
	}
	lim.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &lim); err != nil {
		return fmt.Errorf("raise RLIMIT_CORE: %w", err)
	}
	return sigDefault(sig)
}
