package procscan

// BenchmarkScanProc needs Linux's PID namespaces (CLONE_NEWPID): apart
// from bench_test.go so that the package vets on any OS.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkScanProc: discovery over a real /proc holding exactly N real
// processes: a new PID namespace whose PID 1, sh, mounts its own /proc and
// forks N-1 children that block opening a FIFO (forks without exec, about
// 100 kB each). It is read from here through /proc/PID/root/proc, one path
// lookup more per file than the supervisor's /proc.
func BenchmarkScanProc(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: a new PID namespace and its own /proc mount")
	}
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("procs=%d", n), func(b *testing.B) {
			root := benchNamespace(b, n)
			benchScan(b, root, 1, n)
		})
	}
}

// benchNamespace starts the namespace of BenchmarkScanProc, stopped at the
// end of b, and returns its /proc as seen from here.
func benchNamespace(b *testing.B, n int) string {
	b.Helper()
	if _, err := exec.LookPath("mount"); err != nil {
		b.Skip("needs mount(8)")
	}
	fifo := filepath.Join(b.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		b.Fatal(err)
	}
	// Private mounts first, so that the new /proc stays in the namespace.
	script := fmt.Sprintf(`mount --make-rprivate / && mount -t proc proc /proc || exit 1
i=1; while [ $i -lt %d ]; do read x < %s & i=$((i+1)); done
echo ready; read x < %s`, n, fifo, fifo)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// SIGKILL to a PID namespace's init ends every process in it.
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() { s, _ := bufio.NewReader(out).ReadString('\n'); line <- s }()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			b.Fatalf("namespace did not start (said %q)", s)
		}
	case <-time.After(2 * time.Minute):
		b.Fatalf("%d processes not started within 2 minutes", n)
	}
	return fmt.Sprintf("/proc/%d/root/proc", cmd.Process.Pid)
}
