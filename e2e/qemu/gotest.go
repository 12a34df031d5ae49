package qemu

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// staticEnv makes `go build` produce a binary the guest can run: no cgo
// means no libc, so the result is statically linked, for the guest's
// architecture (Kernel.Arch).
func staticEnv(goarch string) []string {
	return []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + goarch}
}

// BuildStatic runs `go build -trimpath -o out pkg` in dir with
// CGO_ENABLED=0 for GOARCH goarch (a Kernel's Arch). pkg is anything go
// build accepts, including a directory under testdata given as a relative
// path ("./testdata/x").
//
// -trimpath, as the product image's build (e2e/scripts/build-image.sh) and
// pod.BuildToolsFor: what the guests run then shares the standard
// library's and the product's compiles for arm64 with those builds, which
// a cold run makes anyway, instead of compiling them a second time with
// other paths. Nothing that runs in a guest reads its own source.
func BuildStatic(ctx context.Context, goarch, dir, pkg, out string) error {
	return goCmd(ctx, goarch, dir, "build", "-trimpath", "-o", out, pkg)
}

// BuildTest compiles pkg's tests into the static binary out, as
// `go test -c -trimpath -o out pkg` with CGO_ENABLED=0, for GOARCH goarch
// (-trimpath: see BuildStatic).
func BuildTest(ctx context.Context, goarch, dir, pkg, out string) error {
	if err := goCmd(ctx, goarch, dir, "test", "-c", "-trimpath", "-o", out, pkg); err != nil {
		return err
	}
	// go test -c writes nothing, successfully, for a package without tests.
	if _, err := os.Stat(out); err != nil {
		return fmt.Errorf("go test -c %s wrote no binary (a package without test files?): %w", pkg, err)
	}
	return nil
}

func goCmd(ctx context.Context, goarch, dir string, args ...string) error {
	if _, ok := archs[goarch]; !ok {
		return fmt.Errorf("qemu: GOARCH %q: the guests are amd64 or arm64", goarch)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), staticEnv(goarch)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// goList returns the source directory of pkg.
func goList(ctx context.Context, dir, pkg string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", pkg)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s (in %s): %w\n%s", pkg, dir, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// GoTest describes a Go test package to run inside the guest.
type GoTest struct {
	// Dir is where go runs (default "."), which fixes the module and what
	// a relative Package means.
	Dir string
	// Package is the package to compile with `go test -c`, e.g.
	// "./testdata/guesttest" or an import path.
	Package string
	// Run is the -test.run pattern; empty runs all tests.
	Run string
	// Testdata copies the package's testdata directory, if it has one, to
	// /gotest/testdata, so that tests reading "testdata/..." relative to
	// their working directory find it as under go test.
	Testdata bool
	// Args are more flags for the test binary (-test.v and -test.timeout are
	// set already), e.g. "-test.count=1".
	Args []string
	// Config is the guest: Files for extra static binaries, Env, Modules,
	// timeouts, memory. Command and Script are set by RunGoTest.
	Config Config
}

// GoTestResult is the outcome of RunGoTest.
type GoTestResult struct {
	Result
	// Passed is true when the test binary exited 0 and ran at least one
	// test (a -test.run pattern that matches nothing also exits 0).
	Passed bool
	// Tests maps each top-level test and subtest seen in the -test.v output
	// to "PASS", "FAIL" or "SKIP".
	Tests map[string]string
	// Build is the time `go test -c` took.
	Build time.Duration
}

// guestTestDir holds the test binary in the guest, and is its working
// directory.
const guestTestDir = "/gotest"

// testResultLine matches -test.v's verdict lines, at any indentation
// (subtests are indented).
var testResultLine = regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL|SKIP): (\S+) \(`)

// RunGoTest compiles a package's tests as a static binary and runs it in
// the guest as `X -test.v -test.run <Run>`, with the files and environment
// of t.Config. The binary's working directory is /gotest; set t.Testdata for
// tests that read their testdata directory. -test.timeout is set just
// below Config.CommandTimeout, so a hung test prints its goroutines before
// the guest kills it.
//
// Test failures are reported in the result (Passed, Tests); the error is for
// a build failure or a run that produced no exit status.
func RunGoTest(ctx context.Context, t GoTest) (GoTestResult, error) {
	var res GoTestResult
	if t.Package == "" {
		return res, errors.New("qemu: GoTest.Package is empty")
	}
	dir := cmp.Or(t.Dir, ".")
	tmp, err := os.MkdirTemp("", "qemu-gotest-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	base := path.Base(strings.TrimSuffix(filepath.ToSlash(t.Package), "/"))
	if base == "." || base == ".." || base == "/" {
		base = "pkg"
	}
	name := base + ".test"
	bin := filepath.Join(tmp, name)
	cfg := t.Config
	// The kernel decides the architecture to build for.
	if cfg.Kernel == (Kernel{}) {
		k, err := DefaultKernel(ctx)
		if err != nil {
			return res, err
		}
		cfg.Kernel = k
	}
	start := time.Now()
	if err := BuildTest(ctx, cfg.Kernel.Arch, dir, t.Package, bin); err != nil {
		return res, err
	}
	res.Build = time.Since(start)

	if t.Testdata {
		pkgDir, err := goList(ctx, dir, t.Package)
		if err != nil {
			return res, err
		}
		td := filepath.Join(pkgDir, "testdata")
		if st, err := os.Stat(td); err == nil && st.IsDir() {
			cfg.Trees = append(append([]Tree(nil), cfg.Trees...), Tree{Host: td, Guest: path.Join(guestTestDir, "testdata")})
		}
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.CommandTimeout = cmp.Or(cfg.CommandTimeout, cfg.Timeout*3/4)
	guestBin := path.Join(guestTestDir, name)
	cfg.Files = append(append([]File(nil), cfg.Files...), File{Host: bin, Guest: guestBin})
	cfg.Script = ""
	cfg.Command = []string{guestBin, "-test.v", "-test.timeout", testTimeout(cfg.CommandTimeout).String()}
	if t.Run != "" {
		cfg.Command = append(cfg.Command, "-test.run", t.Run)
	}
	cfg.Command = append(cfg.Command, t.Args...)
	cfg.Dir = cmp.Or(cfg.Dir, guestTestDir)

	r, err := Run(ctx, cfg)
	res.Result = r
	res.Tests = map[string]string{}
	for _, m := range testResultLine.FindAllStringSubmatch(r.Output, -1) {
		res.Tests[m[2]] = m[1]
	}
	res.Passed = err == nil && r.ExitStatus == 0 && len(res.Tests) > 0
	return res, err
}

// testTimeout leaves the guest's watchdog a margin over the test binary's
// own -test.timeout, so that the binary's panic with all goroutines wins.
func testTimeout(command time.Duration) time.Duration {
	margin := command / 10
	if margin < 5*time.Second {
		margin = min(5*time.Second, command/2)
	}
	return command - margin
}
