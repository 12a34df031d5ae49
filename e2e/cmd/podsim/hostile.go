package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// modeEnv overrides the mode that argv[0] would give: how a process runs
// with an arbitrary argv[0] (--argv0) and still knows what to do.
const modeEnv = "PODSIM_MODE"

// hostile is a process that is awkward to read from /proc, for the
// hardening tests (e2e/hardening). Every flag is opt-in.
//
//	--comm S        set its own comm with prctl(PR_SET_NAME): any bytes but
//	                NUL (spaces, parentheses, newlines, invalid UTF-8); the
//	                kernel keeps the first 15
//	--argv0 S       run with argv[0] = S (it re-executes itself once)
//	--decoy S       (repeatable) start a child whose comm and argv[0] are S,
//	                which records every catchable signal it gets and runs
//	                until killed: something that must never be signalled
//	--swarm N       start N children that sleep until killed (the host's
//	                sleep(1) when there is one: a Go process each would cost
//	                ~1.5 MB); records "swarm N" once all run
//	--churn N       start N short-lived processes (true(1), or podsim true),
//	                4 at a time; records "churning N" before and "churned N"
//	                after
//	--churn-after F wait until F (a FIFO) is opened for writing and closed
//	                before the churn: a test's cue
//	--zombie D      reap each churned process only D after starting it: it
//	                stays a zombie meanwhile, as a shell's background jobs do
//	--fifo PATH     exit 0 once PATH (a FIFO) is opened for writing and
//	                closed (a test's cue); without it, run until killed
//	--record FILE   append events: "start pid=P comm=%q argv0=%q",
//	                "signal SIGTERM", "swarm N", "churning N",
//	                "churned N", "exit 0"
//
// The decoys and the swarm are in the caller's container (same cgroup,
// same uid), children of the caller: never a container's main process.
func hostile(args []string) error {
	fs := flag.NewFlagSet("hostile", flag.ContinueOnError)
	comm := fs.String("comm", "", "")
	argv0 := fs.String("argv0", "", "")
	var decoys []string
	fs.Func("decoy", "", func(s string) error { decoys = append(decoys, s); return nil })
	swarm := fs.Int("swarm", 0, "")
	churn := fs.Int("churn", 0, "")
	churnAfter := fs.String("churn-after", "", "")
	zombie := fs.Duration("zombie", 0, "")
	fifo := fs.String("fifo", "", "")
	record := fs.String("record", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *argv0 != "" && os.Getenv(modeEnv) == "" {
		// Once: the re-executed process sees PODSIM_MODE and stays.
		rest := withoutFlag(args, "argv0")
		env := append(os.Environ(), modeEnv+"=hostile")
		return syscall.Exec("/proc/self/exe", append([]string{*argv0}, rest...), env)
	}
	os.Unsetenv(modeEnv)
	if *comm != "" {
		if err := setComm(*comm); err != nil {
			return err
		}
	}
	rec := newRecorder(*record)
	sigs := make(chan os.Signal, 16)
	// Every catchable signal a supervisor might send, recorded.
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE)
	self, _ := os.ReadFile("/proc/self/comm")
	rec.log("start pid=%d comm=%q argv0=%q", os.Getpid(), strings.TrimSuffix(string(self), "\n"), os.Args[0])

	var children []*exec.Cmd
	defer func() {
		for _, c := range children {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for _, name := range decoys {
		c := exec.Command("/proc/self/exe", "--comm", name, "--record", *record)
		c.Args[0] = name
		c.Env = append(os.Environ(), modeEnv+"=hostile")
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			return fmt.Errorf("start decoy %q: %w", name, err)
		}
		children = append(children, c)
	}
	if *swarm > 0 {
		// Without sleep(1), podsim hostile: a Go process, until killed.
		path, argv := "/proc/self/exe", []string{"podsim", "hostile"}
		if p, err := exec.LookPath("sleep"); err == nil {
			path, argv = p, []string{"sleep", "infinity"}
		}
		var mu sync.Mutex
		err := inParallel(*swarm, func() error {
			c := &exec.Cmd{Path: path, Args: argv}
			if err := c.Start(); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			children = append(children, c)
			return nil
		})
		if err != nil {
			return fmt.Errorf("swarm: %w", err)
		}
		rec.log("swarm %d", *swarm)
	}
	if *churn > 0 {
		if *churnAfter != "" {
			waitFIFO(*churnAfter)
		}
		rec.log("churning %d", *churn)
		if err := churnProcs(*churn, *zombie); err != nil {
			return err
		}
		rec.log("churned %d", *churn)
	}
	cued := make(chan struct{})
	if *fifo != "" {
		go func() { waitFIFO(*fifo); close(cued) }()
	}
	for {
		select {
		case s := <-sigs:
			rec.log("signal %s", sigName(s.(syscall.Signal)))
		case <-cued:
			rec.log("exit 0")
			return nil // after the deferred kill of the children
		}
	}
}

// churnProcs runs n short-lived processes, reaping each one no sooner than
// zombie after its start.
func churnProcs(n int, zombie time.Duration) error {
	path, argv := "/proc/self/exe", []string{"podsim", "true"}
	if p, err := exec.LookPath("true"); err == nil {
		path, argv = p, []string{"true"}
	}
	err := inParallel(n, func() error {
		c := &exec.Cmd{Path: path, Args: argv}
		if err := c.Start(); err != nil {
			return err
		}
		time.Sleep(zombie)
		return c.Wait()
	})
	if err != nil {
		return fmt.Errorf("churn %s: %w", path, err)
	}
	return nil
}

// inParallel calls do n times on 4 goroutines, so that a pod fills up (or
// churns) as fast as the fork rate allows, and returns once all calls are
// done, with the first error.
func inParallel(n int, do func() error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	next := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for range next {
				if err := do(); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	return first
}

// withoutFlag drops --name VALUE and --name=VALUE from args.
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--"+name || a == "-"+name {
			i++
			continue
		}
		if strings.HasPrefix(a, "--"+name+"=") || strings.HasPrefix(a, "-"+name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}

// exitCode is podsim's "true" mode: exit at once with the given code
// (default 0).
func exitCode(args []string) error {
	code, err := strconv.Atoi(append(args, "0")[0])
	if err != nil {
		return err
	}
	os.Exit(code)
	return nil
}
