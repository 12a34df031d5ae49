package istioproxy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
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
// prints: PILOT_AGENT=, ENVOY= and ENVOY_BOOTSTRAP_TMPL= lines, each of
// which must exist. The script is idempotent and takes well under a second
// when everything is cached; a cold build of pilot-agent takes about a
// minute.
func BuildTools(ctx context.Context) (Tools, error) {
	var t Tools
	fields := map[string]*string{
		"PILOT_AGENT":          &t.PilotAgent,
		"ENVOY":                &t.Envoy,
		"ENVOY_BOOTSTRAP_TMPL": &t.BootstrapTemplate,
	}
	if err := scripts.Run(ctx, filepath.Base(BuildScript), fields); err != nil {
		return Tools{}, err
	}
	for k, p := range fields {
		if _, err := os.Stat(*p); err != nil {
			return Tools{}, fmt.Errorf("e2e/%s printed %s=%s: %w", BuildScript, k, *p, err)
		}
	}
	return t, nil
}
