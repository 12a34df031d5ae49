//go:build linux

package exitwatch

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the processes the tests watch:
//
//	HELPER=exit CODE    exits with CODE once stdin closes (the start-up
//	                    probes' target)
//	HELPER=stopped CODE stops itself (SIGSTOP), then as exit once
//	                    continued: a probe child kept off the CPU
//	HELPER=spin         uses the CPU, and never exits
//	HELPER=parent ARGS  starts "HELPER=child ARGS" as its child, prints the
//	                    child's PID, reaps it and exits 0: the child is then
//	                    not ours, like an app's main process in a pod
//	HELPER=child HOW    see child()
//	HELPER=tracer PID   traces PID (PTRACE_SEIZE) until it ends
//	HELPER=nopidfd      prints checkPidfd's error under a seccomp filter
//	                    that fails pidfd_open with ENOSYS (an old kernel)
//	HELPER=accton D M   turns accounting on through a bind mount of its
//	                    own (TestAccountingEndsWithItsMount)
//	HELPER=anchored D P S  turns accounting on in D, anchored through
//	                    process P (started at S), runs a shell that
//	                    exits 3, prints its PID and exits
//	                    (TestAccountingOutlivesItsContainer)
//	HELPER=hide D       mounts a tmpfs on D, says "ready", waits for
//	                    stdin to close
//
// The helper modes need the main goroutine on the main thread (leader-exit).
func init() {
	if os.Getenv("HELPER") != "" {
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	switch os.Getenv("HELPER") {
	case "tracerpid":
		b, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "TracerPid:") {
				fmt.Println("child", strings.Join(strings.Fields(l), " "))
			}
		}
		os.Exit(0)
	case "tracer":
		// Another tracer: seizes the PID, says so, and resumes each
		// signal-delivery stop with its signal (the Go runtime's preemption
		// signals stop a tracee too) until it ends. The tracee here meets
		// no other stop (no group-stop, no SIGTRAP).
		pid, _ := strconv.Atoi(os.Args[len(os.Args)-1])
		if err := unix.PtraceSeize(pid); err != nil {
			fmt.Println("seize:", err)
			os.Exit(100)
		}
		fmt.Println("traced")
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil || ws.Exited() || ws.Signaled() {
				os.Exit(0)
			}
			sig := 0
			if ws.Stopped() && ws.StopSignal() != unix.SIGTRAP {
				sig = int(ws.StopSignal())
			}
			unix.PtraceCont(pid, sig)
		}
	case "nopidfd":
		if err := denyPidfdOpen(); err != nil {
			fmt.Println("seccomp:", err)
			os.Exit(100)
		}
		fmt.Println(checkPidfd())
		os.Exit(0)
	case "accton":
		// In a mount namespace of its own: binds DIR on MNT, turns
		// accounting on into MNT/pacct, runs a shell that exits 3, prints
		// its PID, and exits, its mount namespace with it.
		dir, mnt := os.Args[len(os.Args)-2], os.Args[len(os.Args)-1]
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fmt.Println("private:", err)
			os.Exit(100)
		}
		if err := unix.Mount(dir, mnt, "", unix.MS_BIND, ""); err != nil {
			fmt.Println("bind:", err)
			os.Exit(100)
		}
		if err := os.WriteFile(mnt+"/pacct", nil, 0o600); err != nil {
			fmt.Println("create:", err)
			os.Exit(100)
		}
		if err := unix.Acct(mnt + "/pacct"); err != nil {
			fmt.Println("acct:", err)
			os.Exit(100)
		}
		c := exec.Command("sh", "-c", "exit 3") // one thread: an exact record
		c.Run()
		fmt.Println(c.Process.Pid)
		os.Exit(0)
	case "anchored":
		// In a mount namespace of its own, as a supervisor's container.
		n := len(os.Args)
		dir := os.Args[n-3]
		pid, _ := strconv.Atoi(os.Args[n-2])
		start, _ := strconv.ParseUint(os.Args[n-1], 10, 64)
		os.Setenv("HELPER", "exit") // the probe's mode
		a, sup := startAcct(dir, []string{os.Args[0], "-test.run=^$", "7"})
		if !sup.ok {
			fmt.Println("accounting:", sup.reason)
			os.Exit(100)
		}
		if ok, err := a.anchor(Process{PID: pid, StartTime: start}); !ok || err != nil {
			fmt.Println("anchor:", ok, err)
			os.Exit(100)
		}
		c := exec.Command("sh", "-c", "exit 3") // one thread: an exact record
		c.Run()
		fmt.Println(c.Process.Pid)
		os.Exit(0)
	case "hide":
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fmt.Println("private:", err)
			os.Exit(100)
		}
		if err := unix.Mount("tmpfs", os.Args[len(os.Args)-1], "tmpfs", 0, ""); err != nil {
			fmt.Println("tmpfs:", err)
			os.Exit(100)
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	case "exit", "stopped":
		if os.Getenv("HELPER") == "stopped" {
			unix.Kill(os.Getpid(), unix.SIGSTOP)
		}
		code, _ := strconv.Atoi(os.Args[len(os.Args)-1])
		io.Copy(io.Discard, os.Stdin)
		os.Exit(code)
	case "spin":
		for n := 0; ; n++ { // the CPU, on purpose
			_ = n
		}
	case "parent":
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), "HELPER=child")
		// The child's output is relayed after its PID: written straight to
		// the shared stdout, its "ready" could come first (seen once in CI:
		// the test read "ready" for the PID).
		cmd.Stdin = os.Stdin
		out, err := cmd.StdoutPipe()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(100)
		}
		// Its own process group, whose link to the session is this
		// process: never orphaned while the test runs. In the test's group,
		// an exit elsewhere could orphan the group while the child is
		// stopped, and the kernel would then send it SIGHUP and SIGCONT
		// (a stopped child resumed behind the test's back), or discard
		// its SIGTSTP.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(100)
		}
		fmt.Println(cmd.Process.Pid)
		io.Copy(os.Stdout, out)
		cmd.Wait()
		os.Exit(0)
	case "child":
		child(os.Args[len(os.Args)-1])
	}
	os.Exit(m.Run())
}

// grandchild starts a process that is not the test's child, and returns
// its scanned state and a function that closes its stdin (most modes then
// end).
func grandchild(t *testing.T, how string) (Process, func()) {
	g := startGrandchild(t, how)
	return g.proc, g.end
}

type grand struct {
	proc Process
	end  func()
	out  *bufio.Reader // what it prints after its PID
}

// helper is the test binary in a HELPER mode, with args (it runs no
// tests: -test.run=^$, should HELPER ever be lost).
func helper(mode string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), "HELPER="+mode)
	return cmd
}

// startPiped starts cmd with a pipe to its stdin and one from its stdout.
func startPiped(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, *bufio.Reader) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return stdin, bufio.NewReader(out)
}

func startGrandchild(t *testing.T, how string) grand {
	t.Helper()
	cmd := helper("parent", how)
	stdin, r := startPiped(t, cmd)
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := readLine(r, 10*time.Second)
	if err != nil {
		t.Fatalf("read grandchild pid: %v", err)
	}
	pid, _ := strconv.Atoi(line)
	st, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if ppid := parentOf(t, pid); ppid != cmd.Process.Pid {
		t.Fatalf("grandchild %d has parent %d, want %d", pid, ppid, cmd.Process.Pid)
	}
	return grand{proc: Process{PID: pid, StartTime: st}, end: func() { stdin.Close() }, out: r}
}

// startFirstLine starts cmd, killed at the test's end, and returns the
// first line it prints within 10 s; what names that line in a failure.
func startFirstLine(t *testing.T, cmd *exec.Cmd, what string) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := readLine(bufio.NewReader(out), 10*time.Second)
	if err != nil {
		t.Fatalf("read %s: %v", what, err)
	}
	return line
}

// parentOf reads field 4 of /proc/PID/stat.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// testProbe is the probe command: this test binary in its exit mode.
func testProbe(t testing.TB, code string) []string {
	t.Setenv("HELPER", "exit")
	// -test.run=^$: should HELPER ever be lost, the child runs no tests
	// (and so starts no probe of its own).
	return []string{os.Args[0], "-test.run=^$", code}
}

// pidfdSupport is support, as the tests read it.
type pidfdSupport struct {
	ExitInfo bool
	Reason   string
}

func probe(t *testing.T) pidfdSupport {
	t.Helper()
	sup := probePidfd(testProbe(t, "7"))
	if !sup.ok && strings.Contains(sup.reason, "exit probe") {
		t.Fatalf("probePidfd: the probe failed: %s", sup.reason)
	}
	return pidfdSupport{ExitInfo: sup.ok, Reason: sup.reason}
}

// newKernel is a watcher with the pidfd method (exitInfo) or none.
func newKernel(t *testing.T, exitInfo bool) *Watcher {
	t.Helper()
	m := None
	if exitInfo {
		m = Pidfd
	}
	return testWatcher(t, m)
}

// testWatcher builds a watcher of method m without New's probes.
func testWatcher(t testing.TB, m Method) *Watcher {
	t.Helper()
	w := &Watcher{method: m}
	var err error
	if w.pidfds, err = newPidfds(); err != nil {
		t.Fatal(err)
	}
	if m == Ptrace {
		if w.tracer, err = newTracer(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func waitDone(t *testing.T, p Proc) Status {
	t.Helper()
	select {
	case <-p.Done():
		return p.Status()
	case <-time.After(10 * time.Second):
		t.Fatalf("pid %d: no exit seen within 10s", p.PID())
	}
	return Status{}
}

// child is the watched process. HOW is what it does:
//
//	N (a number)   waits for stdin to close, exits N
//	SIGNAME        waits for stdin to close, kills itself with SIGNAME
//	signals        prints "got SIG..." for each signal it receives (USR1,
//	               USR2, INT, TERM, HUP, CHLD), "ready" once set up; exits 0
//	               when stdin closes
//	stopcont       prints "ready"; exits 0 when stdin closes (the test
//	               stops and continues it in between)
//	thread-exit    exits 5 from a goroutine locked to another thread
//	leader-exit    its main thread exits alone; another calls exit_group(6)
//	fork           runs two children of its own (which print their
//	               TracerPid), waits for them, exits 4
//	shell          execs sh -c 'CHILD 0; exit 4' (a shell as main process)
//	sh:SCRIPT      execs sh -c 'read stdin to its end; SCRIPT': one
//	               thread, whose accounting record is exact (acct_linux.go)
func child(how string) {
	if script, ok := strings.CutPrefix(how, "sh:"); ok {
		execShell("while read -r _; do :; done; " + script)
	}
	signal.Ignore(syscall.SIGHUP)
	ready := func() { fmt.Println("ready") }
	switch how {
	case "signals":
		sigs := make(chan os.Signal, 16)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGCHLD)
		go func() {
			for s := range sigs {
				fmt.Println("got", sigName(s))
			}
		}()
		ready()
		io.Copy(io.Discard, os.Stdin)
		time.Sleep(50 * time.Millisecond) // let the last signal print
		os.Exit(0)
	case "stopcont":
		ready()
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	case "thread-exit":
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			io.Copy(io.Discard, os.Stdin)
			os.Exit(5)
		}()
		<-done
	case "leader-exit":
		// The main thread dies holding its P, which the runtime never gets
		// back: with one P (GOMAXPROCS 1, a machine of one CPU) the other
		// goroutine would never run again.
		runtime.GOMAXPROCS(2)
		ended := make(chan struct{})
		go func() {
			<-ended
			time.Sleep(100 * time.Millisecond)
			os.Exit(6) // exit_group, after the leader is gone
		}()
		// Only once the test ends it (its tracer attached by then: the
		// kernel refuses to attach to a process whose leader has exited,
		// EPERM, which a leader exiting at once raced).
		io.Copy(io.Discard, os.Stdin)
		close(ended)
		// The main goroutine runs on the main thread (locked in init):
		// end that thread alone, with exit(2), not exit_group(2).
		syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
	case "fork":
		io.Copy(io.Discard, os.Stdin)
		for i := 0; i < 2; i++ {
			c := exec.Command(os.Args[0], "-test.run=^$", "tracerpid")
			c.Env = append(os.Environ(), "HELPER=tracerpid")
			c.Stdout = os.Stdout
			c.Run()
		}
		os.Exit(4)
	case "shell":
		io.Copy(io.Discard, os.Stdin)
		execShell(fmt.Sprintf("HELPER=tracerpid %q -test.run=^$ x; exit 4", os.Args[0]))
	}
	io.Copy(io.Discard, os.Stdin)
	if code, err := strconv.Atoi(how); err == nil {
		os.Exit(code)
	}
	sig, _ := ParseSignal(how)
	signal.Reset()
	syscall.Kill(os.Getpid(), syscall.Signal(sig))
	time.Sleep(time.Minute)
	os.Exit(99)
}

// execShell replaces the process with sh -c script (from the main thread:
// the helpers lock it in init), or exits 111 without a shell.
func execShell(script string) {
	sh, err := exec.LookPath("sh")
	if err == nil {
		err = syscall.Exec(sh, []string{"sh", "-c", script}, os.Environ())
	}
	fmt.Fprintln(os.Stderr, "exec sh:", err)
	os.Exit(111)
}

func sigName(s os.Signal) string {
	return Signal(s.(syscall.Signal)).String()
}

func exited(code int) Status   { return Status{Known: true, Code: code} }
func killed(sig Signal) Status { return Status{Known: true, Signal: sig} }

// denyPidfdOpen makes pidfd_open fail with ENOSYS on this thread from now
// on, as a kernel before 5.3 (or gVisor before release-20260504.0) does:
// a seccomp filter (no_new_privs first, so that it needs no privilege).
func denyPidfdOpen() error {
	const (
		ldAbsW   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK     = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK     = unix.BPF_RET | unix.BPF_K
		retErrno = 0x00050000 // SECCOMP_RET_ERRNO
		retAllow = 0x7fff0000 // SECCOMP_RET_ALLOW
	)
	filter := []unix.SockFilter{
		{Code: ldAbsW, K: 0}, // seccomp_data.nr
		{Code: jeqK, Jt: 0, Jf: 1, K: unix.SYS_PIDFD_OPEN},
		{Code: retK, K: retErrno | uint32(unix.ENOSYS)},
		{Code: retK, K: retAllow},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	return unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0)
}
