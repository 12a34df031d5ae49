package qemu

import (
	"context"
	"fmt"
	"os"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
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

// scriptName is the script in e2e/scripts that installs qemu and fetches
// the kernel.
const scriptName = "qemu-kernel.sh"

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
	out, err := scripts.Output(ctx, scriptName, name)
	if err != nil {
		return Kernel{}, fmt.Errorf("prepare the kernel %s and qemu (or set Config.Kernel): %w", name, err)
	}
	k, err := parseKernel(out)
	if err != nil {
		return Kernel{}, fmt.Errorf("e2e/scripts/%s: %w", scriptName, err)
	}
	return k, nil
}

// parseKernel reads the script's KEY=VALUE lines.
func parseKernel(out []byte) (Kernel, error) {
	var k Kernel
	err := scripts.Parse(out, map[string]*string{
		"NAME":    &k.Name,
		"ARCH":    &k.Arch,
		"KERNEL":  &k.Image,
		"RELEASE": &k.Release,
		"QEMU":    &k.QEMU,
		"BUSYBOX": &k.Busybox,
	})
	if err != nil {
		return Kernel{}, err
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
