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
	// Image is the kernel (bzImage) passed to qemu -kernel.
	Image string
	// Modules is the kernel's /lib/modules/<release> directory on the host,
	// with modules.dep; needed only when Config.Modules is set.
	Modules string
	// Release is the kernel's `uname -r`, e.g. "6.1.0-57-amd64".
	Release string
	// QEMU is the qemu-system-x86_64 binary.
	QEMU string
	// Busybox is a statically linked busybox, the guest's shell and tools.
	Busybox string
}

// scriptName is the script in e2e/scripts that installs qemu and fetches
// the kernel.
const scriptName = "qemu-kernel.sh"

// DefaultKernel runs e2e/scripts/qemu-kernel.sh and returns what it prints:
// Debian's 6.1 kernel pinned in e2e/versions.env, qemu and busybox. The script
// is idempotent and takes a few milliseconds once its cache is warm; on a cold
// machine it installs Debian packages and downloads the kernel, which needs
// root and Debian's archive. Its log goes into the error on failure.
func DefaultKernel(ctx context.Context) (Kernel, error) {
	out, err := scripts.Output(ctx, scriptName)
	if err != nil {
		return Kernel{}, fmt.Errorf("prepare the 6.1 kernel and qemu (or set Config.Kernel): %w", err)
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
		"KERNEL":  &k.Image,
		"MODULES": &k.Modules,
		"RELEASE": &k.Release,
		"QEMU":    &k.QEMU,
		"BUSYBOX": &k.Busybox,
	})
	if err != nil {
		return Kernel{}, err
	}
	return k, nil
}

// check reports the first part of k that is missing on the host, so that a
// stale cache path fails with a message rather than a qemu error.
func (k Kernel) check() error {
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
