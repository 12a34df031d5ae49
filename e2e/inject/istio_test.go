package inject

import (
	"io/fs"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"istio.io/istio/manifests"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

// istioInstall is the injector configuration istiod would run with after an
// installation (see package injector, which renders it from Istio's charts).
type istioInstall = injector.Install

// Rendering the charts takes a while; every test shares one result.
var installsOnce = sync.OnceValues(func() ([]istioInstall, error) {
	h, err := injector.RenderHelm(nil)
	if err != nil {
		return nil, err
	}
	o, err := injector.RenderOperator()
	if err != nil {
		return nil, err
	}
	return []istioInstall{h, o}, nil
})

func installs(t testing.TB) []istioInstall {
	t.Helper()
	ins, err := installsOnce()
	if err != nil {
		t.Fatal(err)
	}
	return ins
}

// TestIstioInstallCarriesTemplate checks what both installation methods put
// into istiod's injector ConfigMap: Istio's unchanged default "sidecar"
// template, our "supervisor" template exactly as in deploy/istio, and the
// default template list naming both, in that order.
func TestIstioInstallCarriesTemplate(t *testing.T) {
	ours := string(readDeploy(t, templateFile))
	// The file Istio's chart embeds, from the same istio.io/istio module.
	istios, err := fs.ReadFile(manifests.FS, "charts/istio-control/istio-discovery/files/injection-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range installs(t) {
		t.Run(in.Name, func(t *testing.T) {
			for _, w := range in.Warnings {
				t.Logf("render warning: %s", w)
			}
			if diff := cmp.Diff([]string{"sidecar", "supervisor"}, in.Config.DefaultTemplates); diff != "" {
				t.Errorf("defaultTemplates (-want +got):\n%s", diff)
			}
			// The chart trims what it embeds (toYaml | trim).
			if diff := cmp.Diff(strings.TrimRight(ours, "\n"), in.Config.RawTemplates["supervisor"]); diff != "" {
				t.Errorf("supervisor template in the ConfigMap (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(strings.TrimSpace(string(istios)), strings.TrimSpace(in.Config.RawTemplates["sidecar"])); diff != "" {
				t.Errorf("Istio's sidecar template was changed (-want +got):\n%s", diff)
			}
			if in.Config.Templates["supervisor"] == nil {
				t.Errorf("istiod could not parse the supervisor template")
			}
		})
	}
}
