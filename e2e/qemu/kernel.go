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

// scriptName is the script that installs qemu and fetches the kernel, relative
// to the e2e directory.
const scriptName = "scripts/qemu-kernel.sh"

// DefaultKernel runs e2e/scripts/qemu-kernel.sh and returns what it prints:
// Debian's 6.1 kernel pinned in e2e/versions.env, qemu and busybox. The script
// is idempotent and takes a few milliseconds once its cache is warm; on a cold
// machine it installs Debian packages and downloads the kernel, which needs
// root and Debian's archive. Its log goes into the error on failure.
func DefaultKernel(ctx context.Context) (Kernel, error) {
	script, err := findScript()
	if err != nil {
		return Kernel{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return Kernel{}, fmt.Errorf("prepare the 6.1 kernel and qemu with %s: %w\n%s", script, err, strings.TrimSpace(stderr.String()))
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
		"KERNEL":  &k.Image,
		"MODULES": &k.Modules,
		"RELEASE": &k.Release,
		"QEMU":    &k.QEMU,
		"BUSYBOX": &k.Busybox,
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), "=")
		if p := fields[key]; ok && p != nil {
			*p = value
		}
	}
	for key, p := range fields {
		if *p == "" {
			return Kernel{}, fmt.Errorf("no %s= line in the output %q", key, out)
		}
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
