// Package exitstatus checks that the supervisor reads app exit statuses
// right on whatever kernel it runs on, picking its method as documented:
// pidfd exit info on Linux 6.15+, else ptrace when it has CAP_SYS_PTRACE,
// else none (statuses unknown, SUPERVISOR_ON_UNKNOWN). TestExitStatusMethods
// runs on this machine's kernel; TestLinux61 runs it again inside Debian's
// 6.1 kernel under qemu, where auto must pick ptrace.
package exitstatus

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/qemu"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// inGuest is set in the qemu guest's environment.
const inGuest = "SUPERVISOR_E2E_IN_GUEST"

// privilege is how the supervisor container runs.
type privilege struct {
	name string
	uid  int
	caps []int
	env  []string
}

var (
	// As deploy/job.yaml: uid 1337, no capabilities.
	unprivileged = privilege{"unprivileged", scenarios.ProxyUID, []int{}, nil}
	// As deploy/job-ptrace.yaml: root with only KILL (5) and SYS_PTRACE (19).
	ptraceCapable = privilege{"ptrace-capable", 0, []int{5, 19}, nil}
	// The same, told to use ptrace even where pidfd would do.
	ptraceForced = privilege{"ptrace-forced", 0, []int{5, 19}, []string{"SUPERVISOR_EXIT_STATUS=ptrace"}}
)

// TestExitStatusMethods: each way an app can end, read by a supervisor with
// and without CAP_SYS_PTRACE, on this kernel.
func TestExitStatusMethods(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the pod simulation creates namespaces and cgroups")
	}
	tl := pod.MustTools(t)
	endings := []struct {
		name string
		args []string
		code int // the container's exit code
	}{
		{"exit 0", nil, 0},
		{"exit 3", []string{"--exit", "3"}, 3},
		{"killed by SIGKILL", []string{"--kill", "9"}, 137},
		{"killed by SIGINT", []string{"--kill", "2"}, 130},
	}
	for _, priv := range []privilege{ptraceCapable, ptraceForced, unprivileged} {
		for _, e := range endings {
			t.Run(priv.name+"/"+e.name, func(t *testing.T) {
				method, exited, describe := runJob(t, tl, priv, e.args)
				defer func() {
					if t.Failed() {
						t.Log(describe)
					}
				}()
				t.Logf("METHOD %s %s", priv.name, method)
				switch {
				case priv.name == unprivileged.name && method == "ptrace":
					t.Fatalf("picked ptrace without CAP_SYS_PTRACE")
				case priv.name == ptraceCapable.name && method == "none":
					t.Fatalf("picked none although ptrace is permitted")
				case priv.name == ptraceForced.name && method != "ptrace":
					t.Fatalf("SUPERVISOR_EXIT_STATUS=ptrace, but the method is %s", method)
				case method == "none":
					if exited.Str("status") != "unknown" || exited.Str("exit_code") != "" {
						t.Errorf("method none reported a status: %v", exited)
					}
				default:
					if got := exited.Str("exit_code"); got != fmt.Sprint(e.code) {
						t.Errorf("%s: exit_code %q, want %d (%v)", method, got, e.code, exited)
					}
				}
			})
		}
	}
}

// runJob runs a Job pod whose app ends as args say, and returns the
// supervisor's method and its "app exited" log line, after checking the
// action it took matches what it read.
func runJob(t *testing.T, tl pod.Tools, priv privilege, args []string) (string, scenarios.LogLine, string) {
	t.Helper()
	// The app must still run when the supervisor first looks: the guest
	// runs under software emulation, several times slower.
	work := "300ms"
	if os.Getenv(inGuest) != "" {
		work = "3s"
	}
	built, err := scenarios.BuildNamespaces(scenarios.Desc{
		Name: "exitstatus",
		Apps: []scenarios.App{{Name: "app", UID: 1000, Args: append([]string{"--sleep", work}, args...)}},
		SupervisorEnv: []string{"SUPERVISOR_DELETION_GRACE=0s", "SUPERVISOR_STOP_TIMEOUT=5s",
			"SUPERVISOR_APP_START_TIMEOUT=30s", "SUPERVISOR_LOG_LEVEL=debug"},
	}, tl)
	if err != nil {
		t.Fatal(err)
	}
	for i := range built.Spec.Containers {
		if c := &built.Spec.Containers[i]; c.Name == "supervisor" {
			c.UID, c.GID, c.Caps = priv.uid, priv.uid, priv.caps
			c.Env = append(c.Env, priv.env...)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := pod.Start(ctx, built.Backend, built.Spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("%s\n--- pilot-agent record: %q", p.Describe(), scenarios.Record(built.PilotRecord))
		}
		p.Close()
	}()
	st, err := p.WaitPhase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lines := scenarios.ParseLog(p.Logs("supervisor"))
	method, decision := "", scenarios.LogLine(nil)
	var exited scenarios.LogLine
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l.Msg(), "exit statuses") || strings.HasPrefix(l.Msg(), "app exit statuses"):
			method = l.Str("method")
		case l.Msg() == "app exited":
			exited = l
		case l.Msg() == "decision":
			decision = l
		}
	}
	if method == "" || exited == nil || decision == nil {
		t.Fatalf("supervisor log lacks the method, the exit or the decision:\n%s", p.Logs("supervisor"))
	}
	// The action follows what was read: SIGKILL (istio-proxy 137) only for
	// a known failure; an unknown status gets SIGTERM (exit 0).
	wantProxy := 0
	if decision.Str("outcome") == "failure" {
		wantProxy = 137
	}
	if got := st.Container("istio-proxy").ExitCode; got != wantProxy {
		t.Errorf("outcome %s: istio-proxy exit %d, want %d", decision.Str("outcome"), got, wantProxy)
	}
	if c := st.Container("supervisor"); c.ExitCode != 0 {
		t.Errorf("supervisor exit %d", c.ExitCode)
	}
	return method, exited, p.Describe()
}

// TestLinux61 runs TestExitStatusMethods inside Debian's 6.1 kernel under
// qemu: no PIDFD_INFO_EXIT there, so a supervisor with CAP_SYS_PTRACE must
// read every status as a tracer, and one without must report them unknown.
func TestLinux61(t *testing.T) {
	if os.Getenv(inGuest) != "" {
		t.Skip("already in the guest")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: qemu and the guest's pod simulation")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	tl, err := pod.BuildTools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	guestTools := "/tools"
	files := []qemu.File{
		{Host: tl.Podsim, Guest: filepath.Join(guestTools, "podsim"), Mode: 0o755},
		{Host: tl.PilotAgent, Guest: filepath.Join(guestTools, "sidecar", "pilot-agent"), Mode: 0o755},
		{Host: tl.Supervisor, Guest: filepath.Join(guestTools, "sidecar-supervisor"), Mode: 0o755},
	}
	start := time.Now()
	res, err := qemu.RunGoTest(ctx, qemu.GoTest{
		Dir:     filepath.Join(pod.RepoDir(), "e2e"),
		Package: "./exitstatus",
		Run:     "^TestExitStatusMethods$",
		Config: qemu.Config{
			Files:     files,
			Env:       []string{pod.ToolsDirEnv + "=" + guestTools, inGuest + "=1"},
			MemoryMiB: 1024,
			Timeout:   15 * time.Minute,
		},
	})
	if err != nil {
		t.Fatalf("qemu: %v\n%s", err, res.Console)
	}
	t.Logf("guest kernel %s; build %.1fs, boot %.1fs, whole run %.1fs", res.KernelRelease, res.Build.Seconds(),
		res.Boot.Seconds(), time.Since(start).Seconds())
	if !strings.HasPrefix(res.KernelRelease, "6.1.") {
		t.Errorf("guest kernel %q, want 6.1.x", res.KernelRelease)
	}
	if !res.Passed {
		t.Fatalf("TestExitStatusMethods failed on %s:\n%s", res.KernelRelease, res.Output)
	}
	for _, want := range []string{"METHOD ptrace-capable ptrace", "METHOD ptrace-forced ptrace", "METHOD unprivileged none"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("guest output lacks %q:\n%s", want, res.Output)
		}
	}
}

// guestRun is the -test.run pattern for the guest; EXITSTATUS_GUEST_RUN
// narrows it (e.g. "/ptrace-forced/") when chasing one case.
func guestRun() string {
	if r := os.Getenv("EXITSTATUS_GUEST_RUN"); r != "" {
		return "^TestExitStatusMethods$" + r
	}
	return "^TestExitStatusMethods$"
}
