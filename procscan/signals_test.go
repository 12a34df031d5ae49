package procscan

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseSignals(t *testing.T) {
	status := "Name:\tpilot-agent\nSigQ:\t0/96362\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n" +
		"SigBlk:\t0000000000000000\nSigIgn:\t0000000000001000\nSigCgt:\t0000000000004002\n"
	got, err := parseSignals(strings.NewReader(status), 7)
	if err != nil {
		t.Fatal(err)
	}
	for sig, want := range map[int]bool{15: true, 2: true, 13: true, 1: false, 9: false, 0: false, 65: false} {
		if got.Handles(sig) != want {
			t.Errorf("Handles(%d) = %v, want %v (%+v)", sig, !want, want, got)
		}
	}
	for _, bad := range []string{"SigCgt:\tzz\nSigIgn:\t0\n", "Name:\tx\n", "SigCgt:\t0\n"} {
		if _, err := parseSignals(strings.NewReader(bad), 7); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestSignalsReal reads a real shell's dispositions before and after it
// traps SIGTERM, and a vanished process.
func TestSignalsReal(t *testing.T) {
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `read x; trap 'exit 0' TERM; echo trapped; read y`)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sigs, err := s.Signals(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if sigs.Handles(15) {
		t.Errorf("sh handles SIGTERM before its trap: %+v", sigs)
	}
	in.Write([]byte("go\n"))
	buf := make([]byte, 8)
	out.Read(buf)
	if sigs, err = s.Signals(cmd.Process.Pid); err != nil || !sigs.Handles(15) {
		t.Errorf("after the trap: %+v, %v; want SIGTERM handled", sigs, err)
	}
	in.Close()
	cmd.Wait()
	if _, err := s.Signals(cmd.Process.Pid); !errors.Is(err, ErrGone) {
		t.Errorf("a reaped process: %v, want ErrGone", err)
	}
}

// TestSignalsGoRuntime pins down why SigCgt alone cannot tell whether a Go
// program will stop gracefully: its runtime catches SIGTERM before the
// program calls signal.Notify, and on SIGTERM then dies by it (143).
func TestSignalsGoRuntime(t *testing.T) {
	if os.Getenv("PROCSCAN_GO_HELPER") == "1" {
		os.Stdout.WriteString("up\n")
		time.Sleep(time.Minute)
		return
	}
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalsGoRuntime$")
	cmd.Env = append(os.Environ(), "PROCSCAN_GO_HELPER=1")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	buf := make([]byte, 3)
	if _, err := out.Read(buf); err != nil {
		t.Fatal(err)
	}
	sigs, err := s.Signals(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !sigs.Handles(int(syscall.SIGTERM)) {
		t.Errorf("the Go runtime does not catch SIGTERM here (%+v): the supervisor's sidecar table may rely on SigCgt alone", sigs)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("a Go program with SIGTERM in SigCgt but no signal.Notify ended with %v, want killed by SIGTERM", err)
	}
}

// TestChildren: a child forked from another thread than the main one is
// found too (Go forks from whichever thread runs the goroutine).
func TestChildren(t *testing.T) {
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	done := make(chan struct{})
	for i := 0; i < 4; i++ {
		var err error
		go func() {
			cmd := exec.Command("sleep", "30")
			if err = cmd.Start(); err == nil {
				cmds = append(cmds, cmd)
			}
			done <- struct{}{}
		}()
		<-done
		if err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}()
	kids, err := s.Children(os.Getpid())
	if errors.Is(err, ErrNoChildrenFile) {
		t.Skipf("this kernel has no CONFIG_PROC_CHILDREN: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// By PID, not by name: Start returns once the child's exec has begun,
	// and /proc may still show its argv[0] from before (a guest on 6.1
	// showed comm "sleep" with the test binary's argv[0]).
	want := map[int]bool{}
	for _, c := range cmds {
		want[c.Process.Pid] = true
	}
	n := 0
	for _, k := range kids {
		if want[k.PID] && k.PPID == os.Getpid() {
			n++
		}
	}
	if n != 4 {
		t.Errorf("found %d of 4 sleep children %v: %+v", n, want, kids)
	}
}

// TestArgs: a running process's command line, whole; a zombie's is empty
// (nil, as for a process in the middle of its exec), and a reaped one's is
// ErrGone.
func TestArgs(t *testing.T) {
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	// A shell that waits for its child, whatever the shell (busybox's,
	// dash, bash: two commands, so none execs the last in its place), with
	// an argument holding a space.
	run := exec.Command("sh", "-c", "sleep 30; :", "a b")
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed with its sleep
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-run.Process.Pid, syscall.SIGKILL); run.Wait() }()
	// Start returns once the exec has begun, not ended: until it has, the
	// command line is the test's (the child shares its memory) or none.
	want := "sh|-c|sleep 30; :|a b"
	var got []string
	for deadline := time.Now().Add(10 * time.Second); strings.Join(got, "|") != want; time.Sleep(time.Millisecond) {
		if got, err = s.Args(run.Process.Pid); err != nil || time.Now().After(deadline) {
			t.Fatalf("Args of sh = %q, %v; want %q", got, err, want)
		}
	}

	end := exec.Command("true")
	if err := end.Start(); err != nil {
		t.Fatal(err)
	}
	pid := end.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		p, err := s.Process(pid)
		if err != nil {
			t.Fatalf("read the child: %v", err)
		}
		if p.IsZombie() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("true not a zombie after 10s: %+v", p)
		}
	}
	if args, err := s.Args(pid); args != nil || err != nil {
		t.Errorf("Args of a zombie = %q, %v; want nil, nil", args, err)
	}
	end.Wait()
	if _, err := s.Args(pid); !errors.Is(err, ErrGone) {
		t.Errorf("Args of a reaped process: %v, want ErrGone", err)
	}
}
