// Package guestpod runs an e2e test package's simulated pods inside a qemu
// guest: another kernel (Debian's 6.1, 6.12, 7.2) and another architecture
// (amd64, arm64) than the machine's.
//
// The pod simulation (e2e/pod, e2e/scenarios' namespaces backend) needs
// only root, namespaces and cgroup2, which the guest's /init provides, and
// its tools: podsim, pilot-agent (podsim under that name) and the
// supervisor. Run builds them for the guest's architecture, compiles the
// test package for it (`go test -c`), boots the kernel with all of it in the
// initramfs and runs the chosen tests there, as root. In the guest,
// pod.BuildTools finds the tools through $PODSIM_TOOLS_DIR, and InGuest
// reports true, so a test can allow for the guest's slowness (software
// emulation: several times slower than the host, more so for arm64).
//
// Any test of the e2e module that simulates pods with the namespaces backend
// can run in a guest this way: write it for the host, then add a host-side
// test that calls Run with its -test.run pattern and checks Result.Tests
// and the lines the guest test logged (Result.Output). The runc backend
// (real runc and an image) is not available in the guest.
package guestpod

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/qemu"
)

// Env is set (to "1") in the guest's environment.
const Env = "SUPERVISOR_E2E_IN_GUEST"

// InGuest reports whether this process runs inside a guest started by Run.
func InGuest() bool { return os.Getenv(Env) != "" }

// Spec is one guest run.
type Spec struct {
	// Kernel is the kernel's name in e2e/versions.env (qemu.SidARM64, ...).
	Kernel string
	// Package is the e2e package whose tests run, relative to the e2e
	// module: "./exitstatus".
	Package string
	// Run is the -test.run pattern.
	Run string
	// Env holds more KEY=VALUE pairs for the guest's test binary.
	Env []string
	// Timeout bounds the guest's run from qemu's start, boot included
	// (qemu.Config.Timeout); the builds before it are bounded by ctx.
	// Default 20 minutes.
	Timeout time.Duration
	// CPUs and MemoryMiB size the guest; defaults 1 and 1024.
	CPUs      int
	MemoryMiB int
}

// Result is a guest run's outcome.
type Result struct {
	qemu.GoTestResult
	// Kernel is the kernel booted.
	Kernel qemu.Kernel
	// Tools is the time taken to build the pod tools for the guest.
	Tools time.Duration
}

// guestTools is where the tools sit in the guest.
const guestTools = "/tools"

// Run builds the pod tools and the package's tests for the kernel's
// architecture and runs the tests in the guest as root. A failing test is
// not an error: check Result.Passed and Result.Tests. The error is for a
// build failure or a guest that produced no status.
func Run(ctx context.Context, s Spec) (Result, error) {
	var res Result
	if s.Kernel == "" || s.Package == "" {
		return res, errors.New("guestpod: Spec.Kernel and Spec.Package are required")
	}
	if InGuest() {
		return res, errors.New("guestpod: already in a guest (no qemu inside qemu)")
	}
	s.Timeout = cmp.Or(s.Timeout, 20*time.Minute)
	s.MemoryMiB = cmp.Or(s.MemoryMiB, 1024)
	k, err := qemu.KernelNamed(ctx, s.Kernel)
	if err != nil {
		return res, err
	}
	res.Kernel = k
	start := time.Now()
	tl, err := pod.BuildToolsFor(ctx, k.Arch)
	if tl.Dir != "" {
		defer os.RemoveAll(tl.Dir)
	}
	if err != nil {
		return res, err
	}
	res.Tools = time.Since(start)
	files := []qemu.File{
		{Host: tl.Podsim, Guest: filepath.Join(guestTools, "podsim"), Mode: 0o755},
		{Host: tl.PilotAgent, Guest: filepath.Join(guestTools, "sidecar", "pilot-agent"), Mode: 0o755},
		{Host: tl.Supervisor, Guest: filepath.Join(guestTools, "sidecar-supervisor"), Mode: 0o755},
	}
	env := append([]string{pod.ToolsDirEnv + "=" + guestTools, Env + "=1"}, s.Env...)
	r, err := qemu.RunGoTest(ctx, qemu.GoTest{
		Dir:     filepath.Join(pod.RepoDir(), "e2e"),
		Package: s.Package,
		Run:     s.Run,
		Config: qemu.Config{
			Kernel:    k,
			Files:     files,
			Env:       env,
			CPUs:      s.CPUs,
			MemoryMiB: s.MemoryMiB,
			Timeout:   s.Timeout,
		},
	})
	res.GoTestResult = r
	if err != nil {
		return res, fmt.Errorf("guest %s (%s %s): %w", s.Kernel, k.Arch, k.Release, err)
	}
	return res, nil
}
