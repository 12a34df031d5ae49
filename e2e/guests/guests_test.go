// Package guests runs the product module's own tests (procscan, supervisor
// and supervisor/exitwatch: real processes, ptrace, pidfds, process
// accounting, PID namespaces, a recycled PID) inside Debian's kernels under qemu, compiled with `go test -c` for
// the guest's architecture: arm64 on 6.1 (no PIDFD_INFO_EXIT: ptrace) and
// on 7.2 (pidfd), and amd64 on 7.2, a kernel newer than the machine's.
// Signal numbers, ptrace's register and wait-status handling and the
// pidfd ioctls are where architectures and kernels differ.
//
// The guest runs the test binary as root with its own /proc, cgroup2,
// tmpfs /tmp and busybox's sh, sleep and mount: what the tests that need
// root (a PID namespace with its own /proc, ns_last_pid) use. A test
// that skips there is reported, and fails this test unless the kernel
// explains it (PIDFD_INFO_EXIT before 6.15).
//
// arm64 under software emulation is slow: the run takes a minute or two
// per kernel (e2e/README.md, "Other kernels and arm64", has the figures).
// e2e/test.sh runs it with the rest; `go test -run
// 'TestProductTests/sid-arm64' ./guests` runs one kernel.
package guests

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/qemu"
)

// packages are the product module's packages with tests that touch the
// kernel.
var packages = []string{"./procscan", "./supervisor", "./supervisor/exitwatch"}

// kernels are the guests, and the tests each may skip there, with why.
var kernels = []struct {
	name    string
	release string
	skips   map[string]string
}{
	{qemu.BookwormARM64, "6.1.", map[string]string{
		"TestPidfdExitStatus": "no PIDFD_INFO_EXIT before Linux 6.15",
	}},
	{qemu.SidARM64, "7.2.", nil},
	{qemu.SidAMD64, "7.2.", nil},
}

// excluded are product tests left out in every guest, with why: what they
// check is not a kernel feature (a machine as fast as a real node, a file
// of the repository that the guest lacks, logic over generated files).
var excluded = map[string]string{
	// Its churned processes live about a millisecond, and it must catch one
	// alive within 30 s; one scan of /proc takes about 45 ms under arm64
	// software emulation (2 ms on the machine), so it catches one by luck:
	// it failed 2 runs in 3 on sid-arm64. Its other checks (no scan fails
	// while processes vanish) run on the machine.
	"TestRealChurn": "needs scans much faster than a process's millisecond of life",
	// It holds the settings table of the repository's
	// docs/configuration.md to the settings' tags: a check of the
	// documentation, which the guest's initramfs does not carry.
	"TestReadmeSettings": "reads ../docs/configuration.md, which is not in the guest",
	// It holds the deployed lists of known sidecars (the injection
	// template, the admission policy) to the table: files of deploy/,
	// which the guest does not carry either.
	"TestDeployKnowsSidecars": "reads ../deploy/, which is not in the guest",
	// It creates containers with Debian's runc and crun: what it checks is
	// how each runtime names its init, not the kernel.
	"TestRealRuntimeInits": "runs runc and crun, which the guest does not carry",
	// Each writes a /proc of 3,000 to 10,000 generated processes as
	// files in a temporary directory and scans it: the scanner's logic
	// and allocations at scale, which no kernel or architecture changes
	// (the machine runs them). Writing and reading those files under
	// software emulation took about 160 s of the three guests' 200.
	"TestScanKeepsOne":    "scans a generated /proc of 10,000 files: logic, not the kernel",
	"TestManyProcesses":   "scans a generated /proc of 10,000 files: logic, not the kernel",
	"TestScanAllocations": "scans a generated /proc of 3,000 files: logic, not the kernel",
}

// TestProductTests runs `go test` of procscan, supervisor and exitwatch in each guest,
// one subtest per kernel and package (-run 'TestProductTests/sid-arm64'
// picks one kernel).
func TestProductTests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: qemu, and the tests' namespaces in the guest")
	}
	for name, why := range excluded {
		t.Logf("%s left out in the guests: %s", name, why)
	}
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) {
			// The guests side by side (go test -parallel, GOMAXPROCS: two
			// here): each is one qemu process, much of whose time the
			// guest's tests spend waiting.
			t.Parallel()
			kernel, err := qemu.KernelNamed(t.Context(), k.name)
			if err != nil {
				t.Fatal(err)
			}
			for _, pkg := range packages {
				t.Run(strings.TrimPrefix(pkg, "./"), func(t *testing.T) {
					runPackage(t, kernel, k.release, pkg, k.skips)
				})
			}
		})
	}
}

func runPackage(t *testing.T, k qemu.Kernel, release, pkg string, skips map[string]string) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := qemu.RunGoTest(ctx, qemu.GoTest{
		Dir:      pod.RepoDir(),
		Package:  pkg,
		Run:      os.Getenv("GUESTS_RUN"), // narrows the tests run, when chasing one
		Args:     []string{"-test.skip", skipPattern()},
		Testdata: true,
		Config: qemu.Config{
			Kernel:    k,
			MemoryMiB: 1024,
			CPUs:      cpus(k.Arch),
			Timeout:   25 * time.Minute,
		},
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest output:\n%s", res.Output)
		}
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Console)
	}
	// Each top-level test's verdict and time in the guest.
	for _, line := range strings.Split(res.Output, "\n") {
		if strings.HasPrefix(line, "--- ") {
			t.Log(line)
		}
	}
	var pass, skip, fail []string
	for name, v := range res.Tests {
		if strings.Contains(name, "/") {
			continue // subtests: counted with their parent
		}
		switch v {
		case "PASS":
			pass = append(pass, name)
		case "SKIP":
			skip = append(skip, name)
		default:
			fail = append(fail, name)
		}
	}
	slices.Sort(skip)
	slices.Sort(fail)
	t.Logf("%s on %s %s: %d passed, %d skipped %v, %d failed %v; go test -c %.1fs, initramfs %.0f MB, boot %.1fs, whole run %.1fs",
		pkg, k.Arch, res.KernelRelease, len(pass), len(skip), skip, len(fail), fail,
		res.Build.Seconds(), float64(res.InitramfsBytes)/1e6, res.Boot.Seconds(), time.Since(start).Seconds())
	if !strings.HasPrefix(res.KernelRelease, release) {
		t.Errorf("guest kernel %q, want %s*", res.KernelRelease, release)
	}
	if !res.Passed {
		t.Errorf("go test %s failed in the %s guest (exit status %d)", pkg, k.Name, res.ExitStatus)
	}
	for _, name := range skip {
		if why, ok := skips[name]; ok {
			t.Logf("%s skipped, as expected: %s", name, why)
			continue
		}
		t.Errorf("%s skipped in the %s guest, as root: the guest lacks something it needs", name, k.Name)
	}
}

// cpus is the guest's vCPUs. arm64 gets two, each on a host thread of its
// own: the tests start many processes at once, and emulated arm64 is slow.
// amd64 gets one: qemu runs several amd64 vCPUs on one host thread (see
// qemu.Run), which only slows the boot.
func cpus(goarch string) int {
	if goarch == "arm64" {
		return 2
	}
	return 1
}

// skipPattern is the -test.skip pattern for the excluded tests.
func skipPattern() string {
	names := slices.Sorted(maps.Keys(excluded))
	return "^(" + strings.Join(names, "|") + ")$"
}
