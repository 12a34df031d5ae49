// Package injector runs Istio's own sidecar injector (istio.io/istio/pkg/kube/inject,
// from the module pinned in e2e/go.mod) with the configuration an Istio
// installation carrying our "supervisor" template would give istiod. It is the
// non-test part of e2e/inject, shared with the real-cluster tests (e2e/k8sjobs),
// which serve the webhook to a real kube-apiserver.
//
// The configuration is what Istio's own charts render (embedded in the istio.io
// module, manifests.FS) from the repository's files under deploy/istio: the
// istio-sidecar-injector ConfigMap (templates and the values they see) and the
// mesh config from the "istio" ConfigMap.
package injector

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"

	"sigs.k8s.io/yaml"

	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/operator/pkg/helm"
	"istio.io/istio/operator/pkg/manifest"
	"istio.io/istio/operator/pkg/render"
	"istio.io/istio/operator/pkg/values"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/config/mesh/meshwatcher"
	"istio.io/istio/pkg/kube/inject"
	"istio.io/istio/pkg/kube/multicluster"
)

// Install is the injector configuration istiod would run with after an
// installation.
type Install struct {
	// Name says how it was produced ("helm", "istiooperator").
	Name string
	// RawConfig and Config: the injection config (templates, policy,
	// defaultTemplates), as in the ConfigMap and parsed.
	RawConfig string
	Config    inject.Config
	// RawValues and Values: the values the templates see.
	RawValues string
	Values    inject.ValuesConfig
	// Mesh is the mesh config (defaultConfig is each proxy's ProxyConfig).
	Mesh *meshconfig.MeshConfig
	// Warnings are what helm or istioctl would have printed.
	Warnings []string
}

// DeployDir returns the repository's deploy/ directory, found next to this
// source file (go test compiles from the repository).
func DeployDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate deploy/: no caller information")
	}
	d := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy")
	if _, err := os.Stat(filepath.Join(d, "istio")); err != nil {
		return "", fmt.Errorf("cannot locate deploy/istio: %w", err)
	}
	return d, nil
}

// RenderHelm renders the istiod chart (istio-control/istio-discovery) as
// `helm install istiod istio/istiod -f deploy/istio/values-supervisor.yaml
// -f <overrides>` would: the chart's own defaults, then our values file,
// then overrides (merged key by key; nil for none).
func RenderHelm(overrides map[string]any) (Install, error) {
	dir, err := DeployDir()
	if err != nil {
		return Install{}, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "istio", "values-supervisor.yaml"))
	if err != nil {
		return Install{}, err
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		return Install{}, fmt.Errorf("values-supervisor.yaml: %w", err)
	}
	mergeValues(vals, overrides)
	iop := values.Map{"spec": map[string]any{"values": vals}}
	mfs, warnings, err := helm.Render("istiod", "istio-system", "istio-control/istio-discovery", iop, nil)
	if err != nil {
		return Install{}, fmt.Errorf("helm render: %w", err)
	}
	in, err := fromManifests("helm", mfs)
	for _, w := range warnings {
		in.Warnings = append(in.Warnings, w.Error())
	}
	return in, err
}

// mergeValues merges src into dst as helm merges values files: maps key by
// key, anything else replaced.
func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		sm, sok := v.(map[string]any)
		dm, dok := dst[k].(map[string]any)
		if sok && dok {
			mergeValues(dm, sm)
			continue
		}
		dst[k] = v
	}
}

// RenderOperator renders Istio's default profile merged with our
// IstioOperator overlay (deploy/istio/istiooperator-supervisor.yaml), as
// `istioctl install -f <overlay>` would.
func RenderOperator() (Install, error) {
	dir, err := DeployDir()
	if err != nil {
		return Install{}, err
	}
	var log recordingLogger
	sets, _, err := render.GenerateManifest(
		[]string{filepath.Join(dir, "istio", "istiooperator-supervisor.yaml")}, nil, false, nil, &log)
	if err != nil {
		return Install{}, fmt.Errorf("istioctl manifest generate: %w", err)
	}
	var mfs []manifest.Manifest
	for _, s := range sets {
		mfs = append(mfs, s.Manifests...)
	}
	in, err := fromManifests("istiooperator", mfs)
	in.Warnings = append(in.Warnings, log.lines...)
	return in, err
}

func fromManifests(name string, mfs []manifest.Manifest) (Install, error) {
	in := Install{Name: name}
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
			in.RawConfig, in.RawValues = data(m, "config"), data(m, "values")
		case "istio":
			meshText = data(m, "mesh")
		}
	}
	if in.RawConfig == "" || in.RawValues == "" || meshText == "" {
		return in, fmt.Errorf("%s: rendered manifests lack the istio-sidecar-injector or istio ConfigMap", name)
	}
	var err error
	if in.Config, err = inject.UnmarshalConfig([]byte(in.RawConfig)); err != nil {
		return in, fmt.Errorf("%s: injection config: %w", name, err)
	}
	if in.Values, err = inject.NewValuesConfig(in.RawValues); err != nil {
		return in, fmt.Errorf("%s: injection values: %w", name, err)
	}
	if in.Mesh, err = mesh.ApplyMeshConfig(meshText, mesh.DefaultMeshConfig()); err != nil {
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

// NewWebhook sets up Istio's injection webhook, as istiod runs it, with the
// installation's configuration, and returns its HTTP handler (paths /inject
// and /inject/). clusters is what istiod watches nodes through for
// ENABLE_NATIVE_SIDECARS=auto (nil: a fake with no cluster, which Istio
// takes as "no native sidecars").
func NewWebhook(in Install, clusters multicluster.ComponentBuilder) (http.Handler, error) {
	if clusters == nil {
		clusters = multicluster.NewFakeController()
	}
	cfg := in.Config
	mux := http.NewServeMux()
	env := &model.Environment{Watcher: meshwatcher.NewTestWatcher(in.Mesh)}
	// The webhook takes each pod's ProxyConfig from the push context: the
	// mesh's defaultConfig merged with ProxyConfig resources (none here).
	// Without one it falls back to Istio's built-in defaults and ignores the
	// mesh config's defaultConfig (interceptionMode, ...), which istiod never
	// does.
	push := model.NewPushContext()
	push.ProxyConfigs = model.GetProxyConfigs(model.NewFakeStore(), in.Mesh)
	env.SetPushContext(push)
	_, err := inject.NewWebhook(inject.WebhookParameters{
		Watcher:      staticWatcher{config: &cfg, values: in.RawValues},
		Env:          env,
		Mux:          mux,
		MultiCluster: clusters,
	})
	if err != nil {
		return nil, fmt.Errorf("istio injection webhook: %w", err)
	}
	return mux, nil
}

// staticWatcher hands istiod's webhook a fixed injector configuration, in
// place of the watch on the istio-sidecar-injector ConfigMap.
type staticWatcher struct {
	config *inject.Config
	values string
}

func (w staticWatcher) SetHandler(func(*inject.Config, string) error) {}
func (w staticWatcher) Run(<-chan struct{})                           {}
func (w staticWatcher) Get() (*inject.Config, string, error)          { return w.config, w.values, nil }
