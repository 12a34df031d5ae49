// Package scripts runs the set-up scripts beside it from Go. Each script
// (build-tools.sh, qemu-kernel.sh, install-deps.sh, ...) is idempotent,
// caches what it builds under ~/.cache/sidecar-supervisor-e2e, logs to
// stderr and prints what it prepared on stdout as KEY=VALUE lines.
package scripts

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// DirEnv names the e2e directory for a binary that cannot find it by
// itself (one built with -trimpath and run outside the checkout).
const DirEnv = "SUPERVISOR_E2E_DIR"

// marker is a file every scripts directory holds.
const marker = "lib.sh"

// Dir returns the e2e/scripts directory: under $SUPERVISOR_E2E_DIR when it
// is set, else beside this source file (go test compiles from the
// checkout), else the first found walking up from the working directory.
func Dir() (string, error) {
	var candidates []string
	if d := os.Getenv(DirEnv); d != "" {
		candidates = append(candidates, filepath.Join(d, "scripts"))
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		candidates = append(candidates, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			candidates = append(candidates, filepath.Join(d, "scripts"), filepath.Join(d, "e2e", "scripts"))
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(filepath.Join(c, marker)); err == nil {
			return filepath.Clean(c), nil
		}
	}
	return "", fmt.Errorf("cannot find e2e/scripts (set %s to the e2e directory)", DirEnv)
}

// Output runs `bash e2e/scripts/<name> args...` and returns what it printed
// on stdout. A failed script's error names it and carries its stderr (its
// log). When ctx ends, the script's whole process group is killed, and the
// wait for its output is bounded even if a grandchild holds the pipe open.
func Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	script := filepath.Join(dir, name)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", script, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Run runs the script as Output does and fills each key of want from the
// KEY=VALUE lines it printed.
func Run(ctx context.Context, name string, want map[string]*string, args ...string) error {
	out, err := Output(ctx, name, args...)
	if err != nil {
		return err
	}
	if err := Parse(out, want); err != nil {
		return fmt.Errorf("e2e/scripts/%s: %w", name, err)
	}
	return nil
}

// Parse fills each key of want from out's KEY=VALUE lines (a later line
// wins). A key that out does not give a value is an error naming it.
func Parse(out []byte, want map[string]*string) error {
	given := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if p := want[key]; ok && p != nil {
			*p = value
			given[key] = value != ""
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var missing []string
	for key := range want {
		if !given[key] {
			missing = append(missing, key+"=")
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("no %s line in the output %q", strings.Join(missing, ", "), out)
	}
	return nil
}
