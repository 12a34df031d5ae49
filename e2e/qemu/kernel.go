package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Kernel is a bootable kernel and the host tools that go with it, as
// e2e/scripts/qemu-kernel.sh prepares them.
type Kernel struct {
	// Name is the kernel's name in e2e/versions.env, e.g. "sid-arm64".
	Name string
	// Arch is the guest's architecture as Go names it: "amd64" or "arm64".
	// Programs for the guest are built with this GOARCH.
	Arch string
	// Image is the kernel passed to qemu -kernel: an ELF vmlinux or a
	// bzImage for amd64, an Image for arm64.
	Image string
	// Modules is the kernel's /lib/modules/<release> directory on the host,
	// with modules.dep; needed only when Config.Modules is set. Empty when
	// the kernel's package has no modules.
	Modules string
	// Release is the kernel's `uname -r`, e.g. "6.1.0-57-amd64".
	Release string
	// QEMU is the qemu-system-x86_64 or qemu-system-aarch64 binary.
	QEMU string
	// Busybox is a statically linked busybox of the guest's architecture,
	// the guest's shell and tools.
	Busybox string
}

// Names of the kernels e2e/versions.env pins (QEMU_KERNEL_<name>), for
// KernelNamed.
const (
	// BookwormAMD64 is Debian bookworm's Linux 6.1 for amd64: no
	// PIDFD_INFO_EXIT, so ptrace or nothing. The default kernel.
	BookwormAMD64 = "bookworm-amd64"
	// BookwormARM64 is the same Linux 6.1 for arm64.
	BookwormARM64 = "bookworm-arm64"
	// TrixieAMD64 is Debian trixie's Linux 6.12 for amd64, a kernel many
	// node images ship (no PIDFD_INFO_EXIT either).
	TrixieAMD64 = "trixie-amd64"
	// SidAMD64 is Debian sid's Linux 7.2 for amd64: PIDFD_INFO_EXIT.
	SidAMD64 = "sid-amd64"
	// SidARM64 is Debian sid's Linux 7.2 for arm64.
	SidARM64 = "sid-arm64"
)

// scriptName is the script that installs qemu and fetches the kernel, relative
// to the e2e directory.
const scriptName = "scripts/qemu-kernel.sh"

// DefaultKernel is KernelNamed(ctx, BookwormAMD64): Debian's 6.1 for amd64.
func DefaultKernel(ctx context.Context) (Kernel, error) {
	return KernelNamed(ctx, BookwormAMD64)
}

// KernelNamed runs e2e/scripts/qemu-kernel.sh NAME and returns what it
// prints: the Debian kernel e2e/versions.env pins under that name, qemu for
// its architecture and a busybox for it. The script is idempotent and takes
// a few milliseconds once its cache is warm; on a cold machine it installs
// Debian packages and downloads the kernel, which needs root and Debian's
// archive. Its log goes into the error on failure.
func KernelNamed(ctx context.Context, name string) (Kernel, error) {
	script, err := findScript()
	if err != nil {
		return Kernel{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script, name)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return Kernel{}, fmt.Errorf("prepare the kernel %s and qemu with %s: %w\n%s", name, script, err, strings.TrimSpace(stderr.String()))
	}
	k, err := parseKernel(stdout.Bytes())
	if err != nil {
		return Kernel{}, fmt.Errorf("%s: %w\n%s", script, err, strings.TrimSpace(stderr.String()))
	}
	return k, nil
}

// parseKernel reads the script's KEY=VALUE lines.
func parseKernel(out []byte) (Kernel, error) {
	var k Kernel
	fields := map[string]*string{
		"NAME":    &k.Name,
		"ARCH":    &k.Arch,
		"KERNEL":  &k.Image,
		"MODULES": &k.Modules,
		"RELEASE": &k.Release,
		"QEMU":    &k.QEMU,
		"BUSYBOX": &k.Busybox,
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), "=")
		if p := fields[key]; ok && p != nil {
			*p = value
			seen[key] = true
		}
	}
	for key, p := range fields {
		// MODULES= is empty for a kernel packaged without its modules.
		if !seen[key] || *p == "" && key != "MODULES" {
			return Kernel{}, fmt.Errorf("no %s= line in the output %q", key, out)
		}
	}
	if _, ok := archs[k.Arch]; !ok {
		return Kernel{}, fmt.Errorf("ARCH=%s: want amd64 or arm64", k.Arch)
	}
	return k, nil
}

// check reports the first part of k that is missing on the host, so that a
// stale cache path fails with a message rather than a qemu error.
func (k Kernel) check() error {
	if _, ok := archs[k.Arch]; !ok {
		return fmt.Errorf("kernel config: architecture %q, want amd64 or arm64", k.Arch)
	}
	for _, f := range []struct{ what, path string }{
		{"kernel image", k.Image},
		{"qemu", k.QEMU},
		{"busybox", k.Busybox},
	} {
		if f.path == "" {
			return fmt.Errorf("kernel config: no %s path", f.what)
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("kernel config: %s: %w", f.what, err)
		}
	}
	return nil
}

// findScript locates e2e/scripts/qemu-kernel.sh. The source file's own path
// works whenever the caller was compiled from this checkout (go test); the
// walk up from the working directory covers binaries built with -trimpath.
// SUPERVISOR_E2E_DIR overrides both.
func findScript() (string, error) {
	var candidates []string
	if d := os.Getenv("SUPERVISOR_E2E_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, scriptName))
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		candidates = append(candidates, filepath.Join(filepath.Dir(file), "..", scriptName))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			candidates = append(candidates,
				filepath.Join(d, scriptName),
				filepath.Join(d, "e2e", scriptName))
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return filepath.Clean(c), nil
		}
	}
	return "", errors.New("cannot find e2e/" + scriptName + " (set SUPERVISOR_E2E_DIR to the e2e directory, or set Config.Kernel)")
}
