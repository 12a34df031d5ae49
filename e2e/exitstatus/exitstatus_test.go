// Package exitstatus checks that the supervisor reads app exit statuses
// right on whatever kernel it runs on, picking its method as documented:
// pidfd exit info on Linux 6.15+, else ptrace when it has CAP_SYS_PTRACE,
// else process accounting when it has CAP_SYS_PACCT (and a state
// directory), else none (statuses unknown, SUPERVISOR_ON_UNKNOWN).
// TestExitStatusMethods runs on this machine's kernel; TestKernels runs it
// again inside Debian's kernels under qemu (e2e/guestpod): 6.1 and 6.12,
// where auto must pick accounting or ptrace, and 7.2, where it must pick
// pidfd, on amd64 and arm64. Where the unprivileged supervisor gets none, it
// runs TestOnFailureUnknown in one of them too (6.1 on amd64):
// restartPolicy OnFailure with every status unknown.
package exitstatus

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/guestpod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/qemu"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) { pod.RunTests(m) }

// privilege is how the supervisor container runs.
type privilege struct {
	name string
	uid  int
	caps []int
	env  []string
	// accounting: as scenarios.Desc.SupervisorAccounting, root with its
	// state directory (SUPERVISOR_STATE_DIR), which process accounting
	// needs.
	accounting bool
}

var (
	// As deploy/job.yaml: uid 1337, no capabilities.
	unprivileged = privilege{"unprivileged", scenarios.ProxyUID, []int{}, nil, false}
	// Root with only KILL (5) and SYS_PTRACE (19).
	ptraceCapable = privilege{"ptrace-capable", 0, []int{5, 19}, nil, false}
	// The same, told to use ptrace even where pidfd would do.
	ptraceForced = privilege{"ptrace-forced", 0, []int{5, 19}, []string{"SUPERVISOR_EXIT_STATUS=ptrace"}, false}
	// Root with only KILL and SYS_PACCT (20), and a state directory.
	accountingCapable = privilege{"accounting-capable", 0, []int{5, 20}, nil, true}
	// The four, in the order of guests' methods.
	privileges = []privilege{ptraceCapable, ptraceForced, unprivileged, accountingCapable}
)

// ending is one way an app ends.
type ending struct {
	name string
	args []string
	code int  // the container's exit code
	core bool // it dumps core (the app gets --core DIR)
}

var endings = []ending{
	{name: "exit 0", code: 0},
	{name: "exit 3", args: []string{"--exit", "3"}, code: 3},
	{name: "killed by SIGKILL", args: []string{"--kill", "9"}, code: 137},
	{name: "killed by SIGINT", args: []string{"--kill", "2"}, code: 130},
	// abort(): SIGABRT's default action, a core dump; the wait status
	// carries the core flag (0x80) next to the signal.
	{name: "core dump (SIGABRT)", args: []string{"--kill", "6"}, code: 134, core: true},
}

// TestExitStatusMethods: each way an app can end, read by a supervisor with
// and without CAP_SYS_PTRACE, and with CAP_SYS_PACCT, on this kernel. Each case logs a line
// "READ <privilege>/<ending>: method M, ..." with what the supervisor read,
// which TestKernels quotes from the guests.
func TestExitStatusMethods(t *testing.T) {
	pod.NeedRoot(t)
	unprivilegedMethod := ""
	for _, priv := range privileges {
		if priv.name == accountingCapable.name && unprivilegedMethod == "pidfd" {
			// auto takes pidfd first whatever the capabilities: the
			// unprivileged cases read these endings already, and
			// supervisor/exitwatch's TestAccounting reads them through
			// accounting on this kernel. Not run again, for the time.
			t.Logf("METHOD %s not run: pidfd (as unprivileged)", priv.name)
			continue
		}
		for _, e := range endings {
			t.Run(priv.name+"/"+e.name, func(t *testing.T) {
				args := e.args
				var coreDir string
				if e.core {
					coreDir = newCoreDir(t)
					args = append(append([]string{}, args...), "--core", coreDir)
				}
				method, reason, exited := runJob(t, priv, args)
				t.Logf("METHOD %s %s", priv.name, method)
				if priv.name == unprivileged.name {
					unprivilegedMethod = method
				}
				t.Logf("READ %s/%s: method %s uid %d caps %v: %s", priv.name, e.name, method, priv.uid, priv.caps, exited.Fields("status", "signal", "exit_code", "reason"))
				switch {
				case priv.name == unprivileged.name && method == "ptrace":
					t.Fatalf("picked ptrace without CAP_SYS_PTRACE")
				case priv.name == ptraceCapable.name && method == "none":
					t.Fatalf("picked none although ptrace is permitted")
				case priv.name == ptraceForced.name && method != "ptrace":
					t.Fatalf("SUPERVISOR_EXIT_STATUS=ptrace, but the method is %s", method)
				case priv.name == accountingCapable.name && method != "accounting" && method != "pidfd":
					t.Fatalf("picked %s although accounting works", method)
				case method == "accounting" && exited.Str("status") == "unknown":
					// A record of exit 0 reads unknown: always for exit 0,
					// and for a program of several threads (podsim's app)
					// recorded before its main thread took its code.
					if !strings.Contains(exited.Str("reason"), scenarios.AcctZero) {
						t.Errorf("accounting: status unknown, reason %q: want %q", exited.Str("reason"), scenarios.AcctZero)
					}
				case method == "accounting" && e.code == 0:
					t.Errorf("accounting read %v: a record of exit 0 must read unknown", exited)
				case method == "none":
					if exited.Str("status") != "unknown" || exited.Str("exit_code") != "" {
						t.Errorf("method none reported a status: %v", exited)
					}
					// auto says why, and what would fix it.
					t.Logf("REASON %s %s", priv.name, reason)
					if !strings.Contains(reason, "SYS_PTRACE") || !strings.Contains(reason, "6.15") {
						t.Errorf("method none, reason %q: want the fix named (SYS_PTRACE, Linux 6.15+)", reason)
					}
				default:
					if got := exited.Str("exit_code"); got != fmt.Sprint(e.code) {
						t.Errorf("%s: exit_code %q, want %d (%v)", method, got, e.code, exited)
					}
					if sig := e.code - 128; sig > 0 && exited.Str("signal") == "" {
						t.Errorf("%s: no signal in %v, want signal %d", method, exited, sig)
					}
				}
				if e.core {
					checkCore(t, coreDir)
				}
			})
		}
	}
}

// newCoreDir is a directory the app (uid 1000) can write its core into.
func newCoreDir(t *testing.T) string {
	t.Helper()
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "exitstatus-core-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkCore checks that the app really dumped core: a file "core" (or
// "core.PID") in dir, as the kernel's default core_pattern writes it.
func checkCore(t *testing.T, dir string) {
	t.Helper()
	pattern, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	if p := strings.TrimSpace(string(pattern)); p != "core" && !strings.HasPrefix(p, "core.") {
		// A pipe to a crash collector (systemd-coredump, apport) or a
		// path elsewhere: the dump is not ours to find. The guests and CI
		// use the kernel's default.
		t.Logf("core_pattern is %q: not looking for the core file", p)
		return
	}
	cores, _ := filepath.Glob(filepath.Join(dir, "core*"))
	if len(cores) == 0 {
		t.Errorf("the app died of SIGABRT but left no core in %s", dir)
		return
	}
	st, err := os.Stat(cores[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CORE %s (%d bytes)", filepath.Base(cores[0]), st.Size())
}

// runJob runs a Job pod whose app ends as args say, and returns the
// supervisor's method, its reason and its "app exited" log line, after
// checking the action it took matches what it read.
func runJob(t *testing.T, priv privilege, args []string) (method, reason string, exited scenarios.LogLine) {
	t.Helper()
	built := buildJob(t, "exitstatus", pod.Never, priv, args)
	p := scenarios.Start(t, built)
	waitFound(t, p, 1, 2*time.Minute)
	if err := built.Release("app"); err != nil {
		t.Fatal(err)
	}
	st := p.MustWaitPhase(t, 2*time.Minute)
	lines := scenarios.ParseLog(p.Logs("supervisor"))
	method, reason = readMethod(lines)
	var decision scenarios.LogLine
	for _, l := range lines {
		switch l.Msg() {
		case "app exited":
			exited = l
		case "decision":
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
	return method, reason, exited
}

// buildJob builds a Job pod under policy whose one app runs podsim app
// with args, cued: each run works until the test releases it, once the
// supervisor has found it (and, with ptrace, attached), however slowly a
// loaded guest starts the supervisor; a timed run lost that race in loaded
// amd64 guests. The supervisor runs as priv, with env after the settings
// every run has.
func buildJob(t *testing.T, name string, policy pod.RestartPolicy, priv privilege, args []string, env ...string) scenarios.Built {
	t.Helper()
	built, err := scenarios.BuildNamespaces(scenarios.Desc{Name: name, Policy: policy,
		Apps:            []scenarios.App{{Name: "app", UID: 1000, Args: args, Cued: true}},
		SupervisorState: priv.accounting, SupervisorAccounting: priv.accounting,
		SupervisorEnv: append([]string{"SUPERVISOR_DELETION_GRACE=0s", "SUPERVISOR_STOP_TIMEOUT=" + stopTimeout,
			"SUPERVISOR_APP_START_TIMEOUT=30s", "SUPERVISOR_LOG_LEVEL=debug"}, env...),
	}, pod.MustTools(t))
	if err != nil {
		t.Fatal(err)
	}
	sup := scenarios.Container(&built.Spec, "supervisor")
	sup.UID, sup.GID, sup.Caps = priv.uid, priv.uid, priv.caps
	sup.Env = append(sup.Env, priv.env...)
	return built
}

// readMethod is the exit-status method the supervisor's log names, and why.
func readMethod(lines []scenarios.LogLine) (method, reason string) {
	for _, l := range lines {
		if strings.HasPrefix(l.Msg(), "exit statuses") || strings.HasPrefix(l.Msg(), "app exit statuses") {
			method, reason = l.Str("method"), l.Str("reason")
		}
	}
	return method, reason
}

// stopTimeout is SUPERVISOR_STOP_TIMEOUT here: a hang guard. The stand-in
// pilot-agent drains 200ms after its SIGTERM and exits; it must never be
// SIGKILLed for being slow, in an arm64 guest on a loaded host either.
const stopTimeout = "60s"

// guests are the kernels TestKernels boots, and the method each supervisor
// must get there: ptrace-capable, ptrace-forced, unprivileged,
// accounting-capable.
var guests = []struct {
	kernel  string
	release string // the prefix of its uname -r
	methods [4]string
	// onFailure: TestOnFailureUnknown's timelines run there too, with
	// statuses unknown by auto's own choice (the unprivileged method is
	// none). Once is enough: they check the supervisor's waits, which are
	// the same on every kernel (about 150 s of a guest's run, most of it
	// waiting), and run on this machine's kernel as well, forced.
	onFailure bool
}{
	// Before 6.15: no PIDFD_INFO_EXIT. Accounting with CAP_SYS_PACCT,
	// ptrace with CAP_SYS_PTRACE, else nothing (statuses unknown).
	{qemu.BookwormAMD64, "6.1.", [4]string{"ptrace", "ptrace", "none", "accounting"}, true},
	{qemu.TrixieAMD64, "6.12.", [4]string{"ptrace", "ptrace", "none", "accounting"}, false},
	{qemu.BookwormARM64, "6.1.", [4]string{"ptrace", "ptrace", "none", "accounting"}, false},
	// 6.15 and later: pidfd, with or without privileges (accounting-capable
	// not run again: TestExitStatusMethods).
	{qemu.SidAMD64, "7.2.", [4]string{"pidfd", "ptrace", "pidfd", "not run: pidfd (as unprivileged)"}, false},
	{qemu.SidARM64, "7.2.", [4]string{"pidfd", "ptrace", "pidfd", "not run: pidfd (as unprivileged)"}, false},
}

// TestKernels runs TestExitStatusMethods inside Debian's kernels under qemu,
// one subtest per kernel (-run 'TestKernels/sid-arm64' picks one): each way
// an app ends must be read with the method the kernel and the privileges
// allow, and exactly, or be reported unknown with the reason. In the guest
// marked onFailure, TestOnFailureUnknown's timelines must pass too.
func TestKernels(t *testing.T) {
	if guestpod.InGuest() {
		t.Skip("already in the guest")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: qemu and the guest's pod simulation")
	}
	for _, g := range guests {
		t.Run(g.kernel, func(t *testing.T) {
			// The kernels' guests side by side (go test's -parallel:
			// GOMAXPROCS, two here): each is one qemu process, much of
			// whose time the OnFailure timelines spend waiting.
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
			defer cancel()
			start := time.Now()
			if g.onFailure && g.methods[2] != "none" {
				t.Fatalf("the OnFailure timelines want statuses unknown to the unprivileged supervisor, not %s", g.methods[2])
			}
			onFailure := g.onFailure && os.Getenv("EXITSTATUS_GUEST_RUN") == ""
			res, err := guestpod.Run(ctx, guestpod.Spec{
				Kernel:  g.kernel,
				Package: "./exitstatus",
				Run:     guestRun(onFailure),
				Timeout: 20 * time.Minute,
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, res.Console)
			}
			t.Logf("guest %s %s: tools %.1fs, go test -c %.1fs, initramfs %.0f MB, boot %.1fs, whole run %.1fs",
				res.Kernel.Arch, res.KernelRelease, res.Tools.Seconds(), res.Build.Seconds(),
				float64(res.InitramfsBytes)/1e6, res.Boot.Seconds(), time.Since(start).Seconds())
			if !strings.HasPrefix(res.KernelRelease, g.release) {
				t.Errorf("guest kernel %q, want %s*", res.KernelRelease, g.release)
			}
			if !res.Passed {
				t.Fatalf("TestExitStatusMethods failed on %s:\n%s", res.KernelRelease, res.Output)
			}
			for i, priv := range privileges {
				if want := "METHOD " + priv.name + " " + g.methods[i]; !strings.Contains(res.Output, want) {
					t.Errorf("guest output lacks %q:\n%s", want, res.Output)
				}
			}
			if onFailure {
				for _, tm := range timelines {
					name := "TestOnFailureUnknown/" + strings.ReplaceAll(tm.name, " ", "_")
					if got := res.Tests[name]; got != "PASS" {
						t.Errorf("guest: %s %q, want PASS:\n%s", name, got, res.Output)
					}
				}
				for _, m := range timelineTime.FindAllStringSubmatch(res.Output, -1) {
					t.Logf("guest %s: TestOnFailureUnknown/%s took %ss", res.KernelRelease, m[1], m[2])
				}
			}
			// What was read, case by case, from the guest.
			for _, line := range strings.Split(res.Output, "\n") {
				line = strings.TrimSpace(line)
				for _, p := range []string{"READ ", "REASON ", "CORE ", "ONFAILURE "} {
					if i := strings.Index(line, p); i >= 0 {
						t.Log(line[i:])
					}
				}
			}
		})
	}
}

// timelineTime is a TestOnFailureUnknown timeline's verdict line, with its
// time (the timelines run in parallel: the parent's own line says 0s).
var timelineTime = regexp.MustCompile(`(?m)^\s*--- PASS: TestOnFailureUnknown/(\S+) \(([0-9.]+)s\)`)

// guestRun is the -test.run pattern for the guest, with TestOnFailureUnknown
// if onFailure; EXITSTATUS_GUEST_RUN narrows it to TestExitStatusMethods'
// cases (e.g. "/ptrace-forced/") when chasing one.
func guestRun(onFailure bool) string {
	if r := os.Getenv("EXITSTATUS_GUEST_RUN"); r != "" {
		return "^TestExitStatusMethods$" + r
	}
	if onFailure {
		return "^(TestExitStatusMethods|TestOnFailureUnknown)$"
	}
	return "^TestExitStatusMethods$"
}

// waitFound waits, within bound, until the supervisor's log says "app
// found" runs times: the app's runs-th run (a restart logs it again) is
// watched from then on. A restart found as its runtime's init
// ("runc:[2:INIT]") and released at once may exec and end within one
// scan: the supervisor then awaits its new start as for a start that
// failed (supervisor/startfailed.go), under its own log line and with the
// same wait, which runOnFailure counts as the wait for the restart.
func waitFound(t *testing.T, p *pod.Pod, runs int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if len(scenarios.LogWhere(p, scenarios.Is("app found"))) >= runs {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("not %d \"app found\" in the supervisor's log within %s:\n%s", runs, bound, p.Logs("supervisor"))
}
