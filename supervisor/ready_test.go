package supervisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReadyFile: the ready file is removed at the start and written once
// the first scan is done, naming the running process; without a state
// directory, or with a file that is not one, Ready says why.
func TestReadyFile(t *testing.T) {
	if err := Ready(""); err == nil || !strings.Contains(err.Error(), "SUPERVISOR_STATE_DIR is not set") {
		t.Errorf("Ready(\"\") = %v", err)
	}
	dir := t.TempDir()
	if err := Ready(dir); err == nil {
		t.Error("ready without a file")
	}
	if err := ready(dir, true); err != nil {
		t.Fatal(err)
	}
	if err := Ready(dir); err != nil {
		t.Errorf("Ready with this process's file: %v", err)
	}
	for _, bad := range []string{"", "2026-12-04T15:00:00Z\n", "0 12\n", "12\n", "x 12\n"} {
		writeReady(t, dir, bad)
		if err := Ready(dir); err == nil || !strings.Contains(err.Error(), "not a supervisor's PID and start time") {
			t.Errorf("Ready with %q = %v", bad, err)
		}
	}
	if err := ready(dir, true); err != nil {
		t.Fatal(err)
	}
	if err := ready(dir, false); err != nil || Ready(dir) == nil {
		t.Errorf("ready(false) = %v, and the file stays", err)
	}
	if err := ready(dir, false); err != nil {
		t.Errorf("ready(false) without a file = %v", err)
	}
}

// TestReadyFileOfDeadSupervisor: a file left by a supervisor that died
// (the kubelet restarts the container; the emptyDir keeps the file) does
// not pass for the new one's: it counts only while its writer runs, the
// same process (PID and start time).
func TestReadyFileOfDeadSupervisor(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	start, err := startTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	writeReady(t, dir, fmt.Sprintf("%d %d\n", cmd.Process.Pid, start))
	if err := Ready(dir); err != nil {
		t.Fatalf("Ready while its writer runs: %v", err)
	}
	// Its PID taken by another process: another start time.
	writeReady(t, dir, fmt.Sprintf("%d %d\n", cmd.Process.Pid, start+1))
	if err := Ready(dir); err == nil || !strings.Contains(err.Error(), "runs no more") {
		t.Errorf("Ready with another start time = %v", err)
	}
	writeReady(t, dir, fmt.Sprintf("%d %d\n", cmd.Process.Pid, start))
	cmd.Process.Kill()
	cmd.Wait()
	want := fmt.Sprintf("an earlier supervisor's (PID %d, which runs no more)", cmd.Process.Pid)
	if err := Ready(dir); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Ready after its writer died = %v", err)
	}
}

// TestWaitReady: the postStart hook's wait returns once the first scan is
// done, and is bounded when it never is.
func TestWaitReady(t *testing.T) {
	dir := t.TempDir()
	// A stale file first: the wait goes on until this process writes its
	// own.
	writeReady(t, dir, noProcess)
	done := make(chan error, 1)
	go func() { done <- WaitReady(context.Background(), dir, time.Hour) }()
	if err := ready(dir, true); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("WaitReady = %v, want nil once the file is there", err)
	}

	// A supervisor that never gets there: the bound ends the wait, with
	// why.
	writeReady(t, dir, noProcess)
	if err := WaitReady(context.Background(), dir, 20*time.Millisecond); err == nil || !strings.Contains(err.Error(), "runs no more") {
		t.Errorf("WaitReady on a stale file = %v", err)
	}
	if err := WaitReady(context.Background(), "", time.Hour); err == nil || !strings.Contains(err.Error(), "SUPERVISOR_STATE_DIR is not set") {
		t.Errorf("WaitReady without a state directory = %v", err)
	}
}

// noProcess is a ready file whose writer is no process: PIDs stay below
// PID_MAX_LIMIT (4194304).
const noProcess = "4194304 1\n"

func writeReady(t *testing.T, dir, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, readyFile), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
