package istioproxy

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

// Tools are the host paths of what e2e/scripts/build-tools.sh builds.
type Tools struct {
	// PilotAgent is the real Istio pilot-agent binary.
	PilotAgent string
	// Envoy is the stand-in envoy binary (named envoy).
	Envoy string
	// BootstrapTemplate is Istio's envoy_bootstrap.json, copied from the istio module.
	BootstrapTemplate string
}

// BuildScript is the script that builds the tools, relative to the e2e module.
const BuildScript = "scripts/build-tools.sh"

// BuildTools runs e2e/scripts/build-tools.sh and returns the paths it
// prints. The script is idempotent and takes well under a second when
// everything is cached; a cold build of pilot-agent takes about a minute.
func BuildTools(ctx context.Context) (Tools, error) {
	dir, err := e2eDir()
	if err != nil {
		return Tools{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, BuildScript))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Tools{}, fmt.Errorf("%s: %w\n%s", filepath.Join(dir, BuildScript), err, stderr.String())
	}
	return ParseTools(stdout.String())
}

// ParseTools reads build-tools.sh's output: PILOT_AGENT=, ENVOY= and
// ENVOY_BOOTSTRAP_TMPL= lines. Every path must exist.
func ParseTools(out string) (Tools, error) {
	var t Tools
	fields := map[string]*string{
		"PILOT_AGENT":          &t.PilotAgent,
		"ENVOY":                &t.Envoy,
		"ENVOY_BOOTSTRAP_TMPL": &t.BootstrapTemplate,
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if p := fields[k]; ok && p != nil {
			*p = v
		}
	}
	for k, p := range fields {
		if *p == "" {
			return t, fmt.Errorf("%s printed no %s= line", BuildScript, k)
		}
		if _, err := os.Stat(*p); err != nil {
			return t, fmt.Errorf("%s=%s: %w", k, *p, err)
		}
	}
	return t, nil
}

// e2eDir finds the e2e module directory: from this source file's location
// when the binary was built from a checkout (tests are), else by walking up
// from the working directory.
func e2eDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		d := filepath.Dir(filepath.Dir(file))
		if _, err := os.Stat(filepath.Join(d, BuildScript)); err == nil {
			return d, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		for _, c := range []string{d, filepath.Join(d, "e2e")} {
			if _, err := os.Stat(filepath.Join(c, BuildScript)); err == nil {
				return c, nil
			}
		}
		if d == filepath.Dir(d) {
			return "", errors.New("cannot find e2e/" + BuildScript + " above " + wd)
		}
	}
}
