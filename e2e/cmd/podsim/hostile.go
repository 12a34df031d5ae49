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

	"golang.org/x/sys/unix"
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
//	                --churn-par at a time; records "churning N" before and
//	                "churned N" after
//	--churn-par P   (default 4)
//	--churn-after F wait until file F exists before the churn (at most 10
//	                minutes, then fail): a test's trigger
//	--zombie D      reap each churned process only D after starting it: it
//	                stays a zombie meanwhile, as a shell's background jobs do
//	--sleep D       then exit with --exit N (after the churn); 0: run until
//	                killed
//	--fifo PATH     instead of --sleep: exit with --exit N once PATH (a
//	                FIFO) is opened for writing and closed (a test's cue)
//	--exit N
//	--record FILE   append events: "start pid=P comm=%q argv0=%q",
//	                "signal SIGTERM", "swarm N", "churning N",
//	                "churned N", "exit N"
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
	churnPar := fs.Int("churn-par", 4, "")
	churnAfter := fs.String("churn-after", "", "")
	zombie := fs.Duration("zombie", 0, "")
	sleep := fs.Duration("sleep", 0, "")
	fifo := fs.String("fifo", "", "")
	code := fs.Int("exit", 0, "")
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
		if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafePtr(*comm)), 0, 0, 0); err != nil {
			return fmt.Errorf("prctl PR_SET_NAME: %w", err)
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
		swarmed, err := spawn(*swarm, 4, func() *exec.Cmd { return &exec.Cmd{Path: path, Args: argv} })
		children = append(children, swarmed...)
		if err != nil {
			return fmt.Errorf("swarm: %w", err)
		}
		rec.log("swarm %d", *swarm)
	}
	if *churn > 0 {
		if *churnAfter != "" {
			if err := waitFile(*churnAfter, 10*time.Minute); err != nil {
				return err
			}
		}
		rec.log("churning %d", *churn)
		if err := churnProcs(*churn, max(*churnPar, 1), *zombie); err != nil {
			return err
		}
		rec.log("churned %d", *churn)
	}
	var end <-chan struct{}
	switch {
	case *fifo != "":
		cued := make(chan struct{})
		go func() { waitFIFO(*fifo); close(cued) }()
		end = cued
	case *sleep > 0:
		slept := make(chan struct{})
		time.AfterFunc(*sleep, func() { close(slept) })
		end = slept
	}
	for {
		select {
		case s := <-sigs:
			rec.log("signal %s", sigName(s.(syscall.Signal)))
		case <-end:
			rec.log("exit %d", *code)
			for _, c := range children {
				c.Process.Kill()
				c.Wait()
			}
			os.Exit(*code)
		}
	}
}

// spawn starts n processes from mk, par at a time, and returns those that
// started.
func spawn(n, par int, mk func() *exec.Cmd) ([]*exec.Cmd, error) {
	var mu sync.Mutex
	var out []*exec.Cmd
	var first error
	inParallel(n, par, func() {
		c := mk()
		err := c.Start()
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			out = append(out, c)
		} else if first == nil {
			first = err
		}
	})
	return out, first
}

// churnProcs runs n short-lived processes, par at a time, reaping each one
// no sooner than zombie after its start.
func churnProcs(n, par int, zombie time.Duration) error {
	path, argv := "/proc/self/exe", []string{"podsim", "true"}
	if p, err := exec.LookPath("true"); err == nil {
		path, argv = p, []string{"true"}
	}
	var mu sync.Mutex
	var first error
	inParallel(n, par, func() {
		c := &exec.Cmd{Path: path, Args: argv}
		err := c.Start()
		if err == nil {
			time.Sleep(zombie)
			err = c.Wait()
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("churn %s: %w", path, err)
		}
	})
	return first
}

// inParallel calls do n times on par goroutines, so that a pod fills up
// (or churns) as fast as the fork rate allows, and returns once all calls
// are done.
func inParallel(n, par int, do func()) {
	var wg sync.WaitGroup
	next := make(chan struct{})
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				do()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
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

// exitCode is podsim's "true" mode: exit at once with the given code.
func exitCode(args []string) error {
	code := 0
	if len(args) > 0 {
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		code = n
	}
	os.Exit(code)
	return nil
}

// waitFile waits until path exists, for at most limit.
func waitFile(path string, limit time.Duration) error {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s did not appear within %s", path, limit)
}
