package inject

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/manifests"
	"istio.io/istio/operator/pkg/helm"
	"istio.io/istio/operator/pkg/manifest"
	"istio.io/istio/operator/pkg/render"
	"istio.io/istio/operator/pkg/values"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/kube/inject"
)

// istioInstall is the injector configuration istiod would run with after an
// installation: the istio-sidecar-injector ConfigMap (injection config with
// all templates, and the values they see) and the mesh config from the
// "istio" ConfigMap. Both come from Istio's own charts, embedded in the
// istio.io/istio module (manifests.FS), rendered with our settings.
type istioInstall struct {
	name      string
	rawConfig string
	config    inject.Config
	rawValues string
	values    inject.ValuesConfig
	mesh      *meshconfig.MeshConfig
	warnings  []string
}

// renderHelm renders the istiod chart (istio-control/istio-discovery) as
// `helm install istiod istio/istiod -f deploy/istio/values-supervisor.yaml`
// would: the chart's own defaults, then our values file.
func renderHelm() (istioInstall, error) {
	raw, err := os.ReadFile(filepath.Join(deployDir, "istio", "values-supervisor.yaml"))
	if err != nil {
		return istioInstall{}, err
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		return istioInstall{}, err
	}
	iop := values.Map{"spec": map[string]any{"values": vals}}
	mfs, warnings, err := helm.Render("istiod", "istio-system", "istio-control/istio-discovery", iop, nil)
	if err != nil {
		return istioInstall{}, fmt.Errorf("helm render: %w", err)
	}
	in, err := fromManifests("helm", mfs)
	for _, w := range warnings {
		in.warnings = append(in.warnings, w.Error())
	}
	return in, err
}

// renderOperator renders Istio's default profile merged with our
// IstioOperator overlay, as `istioctl install -f <overlay>` would.
func renderOperator() (istioInstall, error) {
	var log recordingLogger
	sets, _, err := render.GenerateManifest(
		[]string{filepath.Join(deployDir, "istio", "istiooperator-supervisor.yaml")}, nil, false, nil, &log)
	if err != nil {
		return istioInstall{}, fmt.Errorf("istioctl manifest generate: %w", err)
	}
	var mfs []manifest.Manifest
	for _, s := range sets {
		mfs = append(mfs, s.Manifests...)
	}
	in, err := fromManifests("istiooperator", mfs)
	in.warnings = append(in.warnings, log.lines...)
	return in, err
}

func fromManifests(name string, mfs []manifest.Manifest) (istioInstall, error) {
	in := istioInstall{name: name}
	data := func(m manifest.Manifest, key string) string {
		d, _ := m.Object["data"].(map[string]any)
		s, _ := d[key].(string)
		return s
	}
	var meshText string
	for _, m := range mfs {
		if m.GetKind() != "ConfigMap" {
			continue
		}
		switch m.GetName() {
		case "istio-sidecar-injector":
			in.rawConfig, in.rawValues = data(m, "config"), data(m, "values")
		case "istio":
			meshText = data(m, "mesh")
		}
	}
	if in.rawConfig == "" || in.rawValues == "" || meshText == "" {
		return in, fmt.Errorf("%s: rendered manifests lack the istio-sidecar-injector or istio ConfigMap", name)
	}
	var err error
	if in.config, err = inject.UnmarshalConfig([]byte(in.rawConfig)); err != nil {
		return in, fmt.Errorf("%s: injection config: %w", name, err)
	}
	if in.values, err = inject.NewValuesConfig(in.rawValues); err != nil {
		return in, fmt.Errorf("%s: injection values: %w", name, err)
	}
	if in.mesh, err = mesh.ApplyMeshConfig(meshText, mesh.DefaultMeshConfig()); err != nil {
		return in, fmt.Errorf("%s: mesh config: %w", name, err)
	}
	return in, nil
}

// recordingLogger collects what istioctl would print while rendering.
type recordingLogger struct{ lines []string }

func (l *recordingLogger) add(s string)                    { l.lines = append(l.lines, s) }
func (l *recordingLogger) LogAndPrint(v ...any)            { l.add(fmt.Sprint(v...)) }
func (l *recordingLogger) LogAndError(v ...any)            { l.add(fmt.Sprint(v...)) }
func (l *recordingLogger) LogAndFatal(v ...any)            { l.add(fmt.Sprint(v...)) }
func (l *recordingLogger) LogAndPrintf(f string, a ...any) { l.add(fmt.Sprintf(f, a...)) }
func (l *recordingLogger) LogAndErrorf(f string, a ...any) { l.add(fmt.Sprintf(f, a...)) }
func (l *recordingLogger) LogAndFatalf(f string, a ...any) { l.add(fmt.Sprintf(f, a...)) }
func (l *recordingLogger) Print(s string)                  { l.add(s) }
func (l *recordingLogger) PrintErr(s string)               { l.add(s) }

// Rendering the charts takes a while; every test shares one result.
var installsOnce = sync.OnceValues(func() ([]istioInstall, error) {
	h, err := renderHelm()
	if err != nil {
		return nil, err
	}
	o, err := renderOperator()
	if err != nil {
		return nil, err
	}
	return []istioInstall{h, o}, nil
})

func installs(t *testing.T) []istioInstall {
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
		t.Run(in.name, func(t *testing.T) {
			for _, w := range in.warnings {
				t.Logf("render warning: %s", w)
			}
			if diff := cmp.Diff([]string{"sidecar", "supervisor"}, in.config.DefaultTemplates); diff != "" {
				t.Errorf("defaultTemplates (-want +got):\n%s", diff)
			}
			// The chart trims what it embeds (toYaml | trim).
			if diff := cmp.Diff(strings.TrimRight(ours, "\n"), in.config.RawTemplates["supervisor"]); diff != "" {
				t.Errorf("supervisor template in the ConfigMap (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(strings.TrimSpace(string(istios)), strings.TrimSpace(in.config.RawTemplates["sidecar"])); diff != "" {
				t.Errorf("Istio's sidecar template was changed (-want +got):\n%s", diff)
			}
			if in.config.Templates["supervisor"] == nil {
				t.Errorf("istiod could not parse the supervisor template")
			}
		})
	}
}
