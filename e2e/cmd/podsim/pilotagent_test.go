package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// TestMain lets the test binary be podsim: the stand-in's own processes
// (pilot-agent, and its child envoy, started as /proc/self/exe).
func TestMain(m *testing.M) {
	if os.Getenv(modeEnv) != "" || filepath.Base(os.Args[0]) == "envoy" {
		main()
		return
	}
	os.Exit(m.Run())
}

// agentProc is a running pilot-agent stand-in.
type agentProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	record string
	admin  string
	cue    string // PILOT_HANDLER_CUE, when cued
	exited chan error
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startAgent starts the stand-in as release with env. Cued, its handler
// cue (PILOT_HANDLER_CUE) holds it before envoy, its agent not made, until
// releaseCue; else startAgent waits for its start line.
func startAgent(t *testing.T, release string, cued bool, env ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	s := &agentProc{t: t, record: filepath.Join(dir, "record"), admin: freeAddr(t), exited: make(chan error, 1)}
	s.cmd = exec.Command(os.Args[0])
	s.cmd.Env = append(os.Environ(), modeEnv+"=pilot-agent", "PILOT_ISTIO="+release, "PILOT_RECORD="+s.record,
		"PILOT_ADMIN_ADDR="+s.admin, "PILOT_HEALTH_ADDR="+freeAddr(t), "PILOT_DRAIN=100ms")
	if cued {
		s.cue = filepath.Join(dir, "cue")
		if err := pod.MakeCue(s.cue); err != nil {
			t.Fatal(err)
		}
		s.cmd.Env = append(s.cmd.Env, "PILOT_HANDLER_CUE="+s.cue)
	}
	s.cmd.Env = append(s.cmd.Env, env...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() { s.cmd.Process.Kill() })
	if !cued {
		s.waitLine("start ")
		return s
	}
	s.until("listening status port", func() bool {
		c, err := net.Dial("tcp", s.admin)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return s
}

// releaseCue lets a cued stand-in make its agent, and waits for its start
// line.
func (s *agentProc) releaseCue() {
	s.t.Helper()
	if err := pod.ReleaseCue(s.cue, 30*time.Second); err != nil {
		s.t.Fatal(err)
	}
	s.waitLine("start ")
}

// lines is the record after its start line.
func (s *agentProc) lines() []string {
	b, _ := os.ReadFile(s.record)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" && !strings.HasPrefix(l, "start ") && l != "handler" {
			out = append(out, l)
		}
	}
	return out
}

// waitLine waits for a record line starting with prefix (the start line
// too).
func (s *agentProc) waitLine(prefix string) {
	s.t.Helper()
	s.until(fmt.Sprintf("record line %q", prefix), func() bool {
		b, _ := os.ReadFile(s.record)
		return slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool { return strings.HasPrefix(l, prefix) })
	})
}

// until polls cond (a file, a port: nothing to wait on) within a bound.
func (s *agentProc) until(what string, cond func() bool) {
	s.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("no %s; record: %q", what, s.lines())
		}
	}
}

// checkRecord compares the record after its start line with want.
func (s *agentProc) checkRecord(want ...string) {
	s.t.Helper()
	if diff := cmp.Diff(want, s.lines()); diff != "" {
		s.t.Errorf("record (-want +got):\n%s", diff)
	}
}

// post POSTs path and returns the status, or -1 when no answer came.
func (s *agentProc) post(path string) int {
	s.t.Helper()
	resp, err := http.Post("http://"+s.admin+path, "", nil)
	if err != nil {
		return -1
	}
	resp.Body.Close()
	return resp.StatusCode
}

// wait waits (bounded) for the stand-in's exit, which must be 0.
func (s *agentProc) wait() {
	s.t.Helper()
	select {
	case err := <-s.exited:
		if err != nil {
			s.t.Errorf("stand-in exited: %v; record %q", err, s.lines())
		}
	case <-time.After(30 * time.Second):
		s.t.Fatalf("stand-in did not exit; record %q", s.lines())
	}
}

// TestPilotAgentReleases: the stand-in's quit, drain and SIGTERM follow
// each release's (see pilotAgent): which requests it answers, whether it
// drains, and exit 0 on every path. Before its agent is made (envoy not
// started), /drain (1.21+) and /quitquitquit (1.26+) get no answer (-1)
// and change nothing.
func TestPilotAgentReleases(t *testing.T) {
	for _, tc := range []struct {
		release string
		early   string   // a path POSTed before its agent is made, or ""
		steps   []string // POST paths, or "SIGTERM"
		answers []int    // the early POST's first
		record  []string
	}{
		{"1.20", "", []string{"/quitquitquit"}, []int{200}, []string{"quitquitquit", "signal SIGTERM", "exit 0"}},
		{"1.20", "", []string{"/drain", "/quitquitquit"}, []int{404, 200},
			[]string{"refused POST /drain 404", "quitquitquit", "signal SIGTERM", "exit 0"}},
		{"1.21", "", []string{"/quitquitquit"}, []int{200}, []string{"quitquitquit", "exit 0"}},
		{"1.25", "", []string{"/drain", "/quitquitquit"}, []int{200, 200}, []string{"drain", "quitquitquit", "exit 0 at once"}},
		{"1.26", "", []string{"/quitquitquit"}, []int{200}, []string{"quitquitquit", "exit 0 at once"}},
		{"1.31", "", []string{"/drain", "/quitquitquit"}, []int{200, 200}, []string{"drain", "quitquitquit", "exit 0 at once"}},
		{"1.24", "", []string{"SIGTERM"}, nil, []string{"signal SIGTERM", "exit 0"}},
		{"1.24", "", []string{"/drain", "SIGTERM"}, []int{200}, []string{"drain", "signal SIGTERM", "exit 0 at once"}},
		{"1.26", "/quitquitquit", []string{"/drain", "/quitquitquit"}, []int{-1, 200, 200},
			[]string{"no answer POST /quitquitquit", "drain", "quitquitquit", "exit 0 at once"}},
		{"1.22", "/drain", []string{"/drain", "/quitquitquit"}, []int{-1, 200, 200},
			[]string{"no answer POST /drain", "drain", "quitquitquit", "exit 0 at once"}},
	} {
		name := tc.release + " " + strings.Join(tc.steps, " ")
		if tc.early != "" {
			name = tc.release + " early " + tc.early + ", then " + strings.Join(tc.steps, " ")
		}
		t.Run(name, func(t *testing.T) {
			s := startAgent(t, tc.release, tc.early != "")
			var answers []int
			if tc.early != "" {
				answers = append(answers, s.post(tc.early))
				s.releaseCue()
			}
			for _, step := range tc.steps {
				if step == "SIGTERM" {
					s.cmd.Process.Signal(syscall.SIGTERM)
					continue
				}
				answers = append(answers, s.post(step))
			}
			s.wait()
			if diff := cmp.Diff(tc.answers, answers); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
			s.checkRecord(tc.record...)
		})
	}
}

// TestPilotAgentExitOnZero: with EXIT_ON_ZERO_ACTIVE_CONNECTIONS, the drain
// lasts while an inbound connection is open, however long; after /drain
// (1.21+) there is no drain at all.
func TestPilotAgentExitOnZero(t *testing.T) {
	inbound := freeAddr(t)
	s := startAgent(t, "1.23", false, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=50ms",
		"PILOT_INBOUND_ADDR="+inbound)
	c, err := net.Dial("tcp", inbound)
	if err != nil {
		t.Fatal(err)
	}
	s.waitLine("inbound open 1")
	if got := s.post("/quitquitquit"); got != 200 {
		t.Fatalf("quit: %d", got)
	}
	s.waitLine("waiting for 1 connections")
	c.Close()
	s.wait()
	s.checkRecord("inbound open 1", "quitquitquit", "waiting for 1 connections", "exit 0")

	s = startAgent(t, "1.23", false, "EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "PILOT_INBOUND_ADDR="+inbound)
	c, err = net.Dial("tcp", inbound)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s.waitLine("inbound open 1")
	for _, path := range []string{"/drain", "/quitquitquit"} {
		if got := s.post(path); got != 200 {
			t.Errorf("POST %s: %d", path, got)
		}
	}
	s.wait()
	s.checkRecord("inbound open 1", "drain", "quitquitquit", "exit 0 at once")
}
