package supervisor

import (
	"context"
	"errors"
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
	if err := Ready(""); err == nil || !strings.Contains(err.Error(), "no usable SUPERVISOR_STATE_DIR") {
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
	if err := WaitReady(context.Background(), "", time.Hour); err == nil || !strings.Contains(err.Error(), "no usable SUPERVISOR_STATE_DIR") {
		t.Errorf("WaitReady without a state directory = %v", err)
	}
}

// TestReadyProbe: the startup probe passes on the supervisor's ready file;
// without one to come (no usable state directory, or none written within
// WaitLimit of the supervisor's start) it passes too, saying why, rather
// than hold the pod's apps back for good; before that it fails, saying why.
func TestReadyProbe(t *testing.T) {
	dir := t.TempDir()
	native := func(env ...string) Config {
		cfg, _, _ := LoadConfig(append([]string{"SUPERVISOR_SHAPE=native"}, env...))
		return cfg
	}
	upFor := func(d time.Duration) func() (time.Duration, error) {
		return func() (time.Duration, error) { return d, nil }
	}
	cannot := func() (time.Duration, error) { return 0, errors.New("no main process") }
	for _, tc := range []struct {
		name string
		cfg  Config
		file string // the ready file's content; "" none
		up   func() (time.Duration, error)
		// want: the probe passes; note or error contains says.
		pass bool
		says string
	}{
		{"ready file of the running supervisor", native("SUPERVISOR_STATE_DIR=" + dir), "self", upFor(time.Second), true, ""},
		{"no ready file yet", native("SUPERVISOR_STATE_DIR=" + dir), "", upFor(time.Second), false, "not ready"},
		{"an earlier supervisor's file", native("SUPERVISOR_STATE_DIR=" + dir), noProcess, upFor(time.Second), false, "runs no more"},
		{"no ready file after WaitLimit", native("SUPERVISOR_STATE_DIR=" + dir), "", upFor(WaitLimit), true, "ready without it, as without the probe"},
		{"its uptime unknown", native("SUPERVISOR_STATE_DIR=" + dir), "", cannot, false, "not ready"},
		{"no state directory", native(), "", cannot, true, "runs without a ready file"},
		{"a relative state directory", native("SUPERVISOR_STATE_DIR=state"), "", cannot, true, "runs without a ready file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch tc.file {
			case "":
				os.Remove(filepath.Join(dir, readyFile))
			case "self":
				if err := ready(dir, true); err != nil {
					t.Fatal(err)
				}
			default:
				writeReady(t, dir, tc.file)
			}
			note, err := ReadyProbe(&tc.cfg, tc.up)
			if (err == nil) != tc.pass {
				t.Fatalf("ReadyProbe = %q, %v; want passing %v", note, err, tc.pass)
			}
			got := note
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.says) {
				t.Errorf("ReadyProbe says %q, want %q", got, tc.says)
			}
		})
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
