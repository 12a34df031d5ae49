package qemu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// releasePrefix is the kernel line the tests expect: Debian's 6.1, the one
// e2e/versions.env pins.
const releasePrefix = "6.1."

// Hang guards for the tests that boot a guest. A boot and a short command
// take seconds under TCG on an idle machine; neither bound is on the
// expected path, whatever the load.
const (
	// guestBudget is each guest's Config.Timeout, from qemu's start.
	guestBudget = 5 * time.Minute
	// testBudget bounds a whole Run: the guest's run, and before it the
	// builds Run makes (a cold arm64 cross-build of the exit helper).
	testBudget = 15 * time.Minute
)

// needRoot skips when not root: the guest tools and kernel are installed
// by apt on first use. CI runs as root, where a missing qemu or kernel
// is a failure (DefaultKernel's error), never a skip.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to install qemu and fetch the 6.1 kernel (e2e/scripts/qemu-kernel.sh); running as uid %d", os.Geteuid())
	}
}

// kernels runs the script once per kernel name and test binary.
var kernels = struct {
	sync.Mutex
	m map[string]func() (Kernel, error)
}{m: map[string]func() (Kernel, error){}}

// kernel is the default kernel, Debian's 6.1 for amd64.
func kernel(t *testing.T) Kernel {
	t.Helper()
	return kernelNamed(t, BookwormAMD64)
}

func kernelNamed(t *testing.T, name string) Kernel {
	t.Helper()
	needRoot(t)
	kernels.Lock()
	get, ok := kernels.m[name]
	if !ok {
		get = sync.OnceValues(func() (Kernel, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			return KernelNamed(ctx, name)
		})
		kernels.m[name] = get
	}
	kernels.Unlock()
	start := time.Now()
	k, err := get()
	if err != nil {
		t.Fatalf("cannot prepare qemu and Debian's kernel %s: %v", name, err)
	}
	t.Logf("kernel %s %s (%s), ready in %s", k.Arch, k.Release, k.Image, time.Since(start).Round(time.Millisecond))
	return k
}

// run boots a guest and fails the test when Run reports an error. The
// console is printed whenever the test fails, by this or a later check.
func run(t *testing.T, cfg Config) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testBudget)
	defer cancel()
	res, err := Run(ctx, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest console:\n%s", res.Console)
		}
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("initramfs %.1f MB built in %s; boot %s, boot+run %s",
		float64(res.InitramfsBytes)/1e6, res.InitramfsBuild.Round(time.Millisecond),
		res.Boot.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond))
	return res
}

// TestKernelProbe runs testdata/kernelprobe in the 6.1 guest and checks the
// facts the supervisor and the pod simulation rely on there.
func TestKernelProbe(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	k := kernel(t)
	probe := filepath.Join(t.TempDir(), "kernelprobe")
	start := time.Now()
	if err := BuildStatic(t.Context(), k.Arch, ".", "./testdata/kernelprobe", probe); err != nil {
		t.Fatal(err)
	}
	t.Logf("probe built in %s", time.Since(start).Round(time.Millisecond))

	res := run(t, Config{
		Kernel:   k,
		Files:    []File{{Host: probe, Guest: "/bin/kernelprobe"}},
		Command:  []string{"kernelprobe"},
		Env:      []string{"KERNELPROBE_IN_GUEST=1"},
		Hostname: "probe-guest",
		Timeout:  guestBudget,
	})
	if res.ExitStatus != 0 {
		t.Fatalf("kernelprobe exited %d", res.ExitStatus)
	}
	if !strings.HasPrefix(res.KernelRelease, releasePrefix) {
		t.Errorf("guest kernel %q, want %s*", res.KernelRelease, releasePrefix)
	}
	line := lastAfter(res.Output, "KERNELPROBE ")
	var facts map[string]string
	if err := json.Unmarshal([]byte(line), &facts); err != nil {
		t.Fatalf("no facts from kernelprobe (%v)", err)
	}
	for _, name := range []string{"release", "yama.ptrace_scope", "cgroup.controllers"} {
		t.Logf("guest %s: %s", name, facts[name])
	}

	for _, c := range []struct {
		fact, want string
		why        string
	}{
		{"hostname", "probe-guest", "/init sets Config.Hostname"},
		{"mount.proc", "ok", "/init mounts proc"},
		{"mount.sys", "ok", "/init mounts sysfs"},
		{"mount.dev", "ok", "/init mounts devtmpfs"},
		{"mount.tmp", "ok", "/init mounts a tmpfs on /tmp"},
		{"mount.run", "ok", "/init mounts a tmpfs on /run"},
		{"mount.cgroup2", "ok", "/init mounts cgroup2 on /sys/fs/cgroup"},
		{"lo", "up", "/init brings up lo"},

		{"grandchild", "ok", "the probe starts a grandchild"},
		{"grandchild.parent", "middle", "the watched process is not the watcher's child"},
		{"pidfd_open", "ok", "pidfd_open works on a non-child"},
		{"pidfd_get_info", "ENOTTY", "PIDFD_GET_INFO is unknown before 6.13: the supervisor must fall back"},
		{"pidfd.poll", "readable", "a pidfd polls readable once the process exited"},
		{"ptrace_seize", "ok", "root may PTRACE_SEIZE a non-child"},
		{"ptrace.exit_event", "seen", "PTRACE_O_TRACEEXIT stops the tracee at exit"},
		{"ptrace.exit_status", "3", "the tracer's wait4 gets the exact exit status"},
		{"parent.exit_status", "3", "the real parent still reaps the same status after the tracer"},

		{"clocksource", "hpet", "the guest keeps time by qemu's HPET, not a TSC calibrated at boot (arch.go)"},

		{"pidns.getpid", "1", "CLONE_NEWPID gives PID 1"},
		{"pidns.proc_self", "1", "a fresh /proc shows the new PID namespace"},
		{"pidns.proc_pids", "1", "a fresh /proc lists only the namespace's processes"},
		{"userns.uid", "0", "CLONE_NEWUSER with a uid map works"},
		{"userns.uid_map", "0 65534 1", "the user namespace maps its root to nobody"},
		{"pivot_root", "ok", "pivot_root works (the root is not the bare rootfs)"},

		{"cgroup.mkdir", "ok", "a cgroup2 leaf can be created"},
		{"cgroup.subtree_control", "ok", "controllers can be enabled for the leaf"},
		{"cgroup.move", "0::/kernelprobe", "a process moves into the leaf via cgroup.procs"},
		{"cgroup.clone_into", "0::/kernelprobe", "clone3(CLONE_INTO_CGROUP) starts a process in the leaf"},
		{"cgroupns.before", "0::/kernelprobe", "a process in the leaf sees its path"},
		{"cgroupns.after", "0::/", "after unshare(CLONE_NEWCGROUP) the leaf is its root"},
	} {
		if got, ok := facts[c.fact]; !ok || got != c.want {
			t.Errorf("%s = %q, want %q (%s)", c.fact, got, c.want, c.why)
		}
	}
	if !strings.HasPrefix(facts["release"], releasePrefix) || facts["release"] != res.KernelRelease {
		t.Errorf("probe saw release %q, /init %q, want both %s*", facts["release"], res.KernelRelease, releasePrefix)
	}
}

// TestRunGoTest runs testdata/guesttest's test binary in the guest, with an
// extra static binary, environment and the package's testdata, and reads a
// deliberate failure as one.
func TestRunGoTest(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	k := kernel(t)
	probe := filepath.Join(t.TempDir(), "kernelprobe")
	if err := BuildStatic(t.Context(), k.Arch, ".", "./testdata/kernelprobe", probe); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testBudget)
	defer cancel()
	res, err := RunGoTest(ctx, GoTest{
		Package:  "./testdata/guesttest",
		Run:      "^TestGuest",
		Testdata: true,
		Config: Config{
			Kernel:  k,
			Files:   []File{{Host: probe, Guest: "/bin/kernelprobe"}},
			Env:     []string{"GUESTTEST_RELEASE_PREFIX=" + releasePrefix, "GUESTTEST_FAIL=1"},
			Timeout: guestBudget,
		},
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest console:\n%s", res.Console)
		}
	})
	if err != nil {
		t.Fatalf("RunGoTest: %v", err)
	}
	t.Logf("go test -c %s; initramfs %.1f MB in %s; boot %s, boot+run %s",
		res.Build.Round(time.Millisecond), float64(res.InitramfsBytes)/1e6, res.InitramfsBuild.Round(time.Millisecond),
		res.Boot.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond))

	want := map[string]string{
		"TestGuestKernel":              "PASS",
		"TestGuestKernel/ExtraBinary":  "PASS",
		"TestGuestKernel/PidfdGetInfo": "PASS",
		"TestGuestTestdata":            "PASS",
		"TestGuestFailsOnPurpose":      "FAIL",
	}
	for name, w := range want {
		if got := res.Tests[name]; got != w {
			t.Errorf("%s: %q, want %q", name, got, w)
		}
	}
	if len(res.Tests) != len(want) {
		t.Errorf("tests seen: %v, want exactly %v", res.Tests, want)
	}
	if res.Passed || res.ExitStatus != 1 {
		t.Errorf("Passed=%v, exit status %d; want a failed run with status 1", res.Passed, res.ExitStatus)
	}
	if !strings.HasPrefix(res.KernelRelease, releasePrefix) {
		t.Errorf("guest kernel %q, want %s*", res.KernelRelease, releasePrefix)
	}
}

// TestRunExitStatus checks both ways a status comes back: directly through
// the exit device (below 126: isa-debug-exit on amd64, a semihosting exit on
// arm64) and from the console line when the device's value saturates.
func TestRunExitStatus(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	for _, name := range []string{BookwormAMD64, SidARM64} {
		t.Run(name, func(t *testing.T) { testRunExitStatus(t, kernelNamed(t, name)) })
	}
}

func testRunExitStatus(t *testing.T, k Kernel) {
	for _, status := range []int{0, 3, 200} {
		res := run(t, Config{
			Kernel: k,
			// No final newline: the output must still end where it should.
			Script:  "printf 'out\\n'; printf 'err\\n' >&2; printf 'no newline'; exit " + strconv.Itoa(status),
			Timeout: guestBudget,
		})
		if res.ExitStatus != status || res.TimedOut {
			t.Errorf("exit %d: got status %d, timed out %v", status, res.ExitStatus, res.TimedOut)
		}
		if want := "out\nerr\nno newline"; res.Output != want {
			t.Errorf("exit %d: output %q, want %q", status, res.Output, want)
		}
	}
}

// TestRunNoStatus: a guest that powers off without /init's report (PSCI
// on arm64, ACPI on amd64: qemu exits 0, as after a kernel panic) is an
// error, never a status, on both architectures.
func TestRunNoStatus(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	for _, name := range []string{BookwormAMD64, SidARM64} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), testBudget)
			defer cancel()
			res, err := Run(ctx, Config{Kernel: kernelNamed(t, name), Script: "echo bye; poweroff -f; sleep 60", Timeout: guestBudget})
			if err == nil || !strings.Contains(err.Error(), "without reporting a status") {
				t.Errorf("Run: %v (status %d), want a 'without reporting a status' error; console:\n%s", err, res.ExitStatus, res.Console)
			}
		})
	}
}

// TestRunDefaultSignals: the command starts with no signal ignored, as a
// container's process does (a shell's background job would have SIGINT and
// SIGQUIT ignored, and a Go program could not die of them).
func TestRunDefaultSignals(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	res := run(t, Config{Kernel: kernel(t), Script: "grep SigIgn /proc/self/status", Timeout: guestBudget})
	if want := "SigIgn:\t0000000000000000\n"; res.ExitStatus != 0 || res.Output != want {
		t.Errorf("status %d, output %q; want 0, %q", res.ExitStatus, res.Output, want)
	}
}

// TestRunCommandTimeout checks that the guest kills a command that runs
// past CommandTimeout and says so, with the output so far. The evidence is
// the cause, not the elapsed time: TimedOut and status 124, and a run that
// did not last the command's 600 s. The 10 s CommandTimeout is the feature;
// it only has to outlast the guest's start of the command up to its first
// echo, a few TCG execs that a loaded host can stretch to seconds.
func TestRunCommandTimeout(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	k := kernel(t)
	res := run(t, Config{
		Kernel:         k,
		Script:         "echo started; sleep 600",
		CommandTimeout: 10 * time.Second,
		Timeout:        guestBudget,
	})
	if !res.TimedOut || res.ExitStatus != timedOutStatus {
		t.Errorf("timed out %v, status %d; want true, %d", res.TimedOut, res.ExitStatus, timedOutStatus)
	}
	if !strings.HasPrefix(res.Output, "started\n") {
		t.Errorf("output %q, want it to start with %q", res.Output, "started\n")
	}
	if ran := res.Elapsed - res.Boot; ran >= 600*time.Second {
		t.Errorf("the command ran %s: the guest waited for its sleep 600", ran)
	}
}

// TestRunHostTimeout checks that Run kills qemu when Timeout expires (here
// before the guest has even booted) and reports it as an error: "guest
// killed", caused by the deadline. Its only time check is a hang guard:
// Run returns within a minute of qemu's start, where a guest left to run
// would take the 10 min CommandTimeout.
func TestRunHostTimeout(t *testing.T) {
	t.Parallel() // each boots guests of its own: two at a time (-parallel)
	k := kernel(t)
	res, err := Run(t.Context(), Config{
		Kernel:         k,
		Script:         "sleep 600",
		Timeout:        500 * time.Millisecond,
		CommandTimeout: 10 * time.Minute,
	})
	if err == nil || !strings.Contains(err.Error(), "guest killed") || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("Run: %v, want a 'guest killed' error caused by the deadline; console:\n%s", err, res.Console)
	}
	if res.Elapsed > time.Minute {
		t.Errorf("Run returned %s after qemu's start, with a 500ms timeout", res.Elapsed)
	}
}
