package inject

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
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

var update = flag.Bool("update", false,
	"rewrite deploy/istio/values-supervisor.yaml and istiooperator-supervisor.yaml from supervisor.tmpl")

const templateFile = "istio/supervisor.tmpl"

// The parts of the two generated files around the template. The template is
// inserted as a YAML literal block, indented to its key.
const (
	generatedNotice = `#
# GENERATED from supervisor.tmpl (the injection template itself) by
#   (cd e2e && go test ./inject -run TestIstioFilesInSync -update)
# Edit supervisor.tmpl, not this file; e2e/inject fails when they differ.
`
	defaultTemplatesDoc = `# Run "supervisor" after Istio's own "sidecar" template for every pod the
# injector handles: Jobs and other restartPolicy Never/OnFailure pods get the
# supervisor container, Deployments and other restartPolicy Always pods get
# the hold (istio-proxy's preStop). It renders nothing for a native-sidecar
# istio-proxy, for pods that already have either, for an istio-proxy with a
# preStop hook of its own, and for pods annotated
# supervisor.sidecar-supervisor.io/inject: "false" (or hold: "false").
# To opt in per pod instead, delete defaultTemplates and annotate the pods
# with inject.istio.io/templates: sidecar,supervisor
# If your installation sets defaultTemplates already, merge the two lists
# by hand: a later list replaces an earlier one (templates maps do merge).
`
	valuesHead = `# Helm values for istiod (chart istio/istiod) adding sidecar-supervisor's
# "supervisor" injection template.
` + generatedNotice + `#
#   helm upgrade istiod istio/istiod -n istio-system --reuse-values \
#     -f deploy/istio/values-supervisor.yaml
sidecarInjectorWebhook:
`
	operatorHead = `# IstioOperator overlay adding sidecar-supervisor's "supervisor" injection
# template; istioctl merges it with your own IstioOperator.
` + generatedNotice + `#
#   istioctl install -f <your IstioOperator> -f deploy/istio/istiooperator-supervisor.yaml
apiVersion: install.istio.io/v1alpha1
kind: IstioOperator
spec:
  values:
    sidecarInjectorWebhook:
`
)

// generated returns the contents the two generated files must have.
func generated(tmpl string) map[string]string {
	body := func(indent string) string {
		var b strings.Builder
		for _, l := range strings.Split(strings.TrimRight(defaultTemplatesDoc, "\n"), "\n") {
			b.WriteString(indent + l + "\n")
		}
		b.WriteString(indent + "defaultTemplates: [sidecar, supervisor]\n")
		b.WriteString(indent + "templates:\n")
		b.WriteString(indent + "  supervisor: |\n")
		for _, l := range strings.SplitAfter(strings.TrimRight(tmpl, "\n"), "\n") {
			if strings.TrimSpace(l) == "" {
				b.WriteString("\n")
				continue
			}
			b.WriteString(indent + "    " + l)
		}
		b.WriteString("\n")
		return b.String()
	}
	return map[string]string{
		"istio/values-supervisor.yaml":        valuesHead + body("  "),
		"istio/istiooperator-supervisor.yaml": operatorHead + body("      "),
	}
}

// TestIstioFilesInSync checks that the Helm values file and the IstioOperator
// overlay carry exactly deploy/istio/supervisor.tmpl, byte for byte after
// YAML decoding, and are what the generator writes. With -update it writes
// them.
func TestIstioFilesInSync(t *testing.T) {
	tmpl := string(readDeploy(t, templateFile))
	if strings.Contains(tmpl, "\t") {
		t.Fatalf("%s contains a tab: YAML block scalars cannot carry it", templateFile)
	}
	for path, want := range generated(tmpl) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			got := string(checkGenerated(t, path, []byte(want), *update, "go test ./inject -run TestIstioFilesInSync -update"))

			// Independently of the generator: decode the file as Helm and
			// istioctl would and compare the template it carries, trailing
			// newline included (TestIstioInstallCarriesTemplate checks
			// defaultTemplates, and the template as the chart trims it).
			if diff := cmp.Diff(tmpl, injectorSettings(t, path, got).Templates["supervisor"]); diff != "" {
				t.Errorf("templates.supervisor differs from %s (-want +got):\n%s", templateFile, diff)
			}
		})
	}
}

// checkGenerated checks that deploy/path holds want, which it first writes
// there when update is set; fix is the command that does.
func checkGenerated(t *testing.T, path string, want []byte, update bool, fix string) []byte {
	t.Helper()
	full := filepath.Join(deployDir, path)
	if update {
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := readDeploy(t, path)
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("deploy/%s is not what it is generated from; run %s (-want +got):\n%s", path, fix, diff)
	}
	return got
}

type injectorValues struct {
	DefaultTemplates []string          `json:"defaultTemplates"`
	Templates        map[string]string `json:"templates"`
}

// injectorSettings decodes the sidecarInjectorWebhook values out of a Helm
// values file or an IstioOperator.
func injectorSettings(t *testing.T, path, text string) injectorValues {
	t.Helper()
	var doc struct {
		APIVersion             string          `json:"apiVersion"`
		Kind                   string          `json:"kind"`
		SidecarInjectorWebhook *injectorValues `json:"sidecarInjectorWebhook"`
		Spec                   struct {
			Values struct {
				SidecarInjectorWebhook *injectorValues `json:"sidecarInjectorWebhook"`
			} `json:"values"`
		} `json:"spec"`
	}
	decodeStrict(t, []byte(text), &doc)
	v := doc.SidecarInjectorWebhook
	if v == nil {
		v = doc.Spec.Values.SidecarInjectorWebhook
	}
	if v == nil {
		t.Fatalf("%s has no sidecarInjectorWebhook values:\n%s", path, text)
	}
	return *v
}

// TestGeneratorRoundTrip guards the generator: blank lines, comments and
// template actions come back verbatim at both indentations.
func TestGeneratorRoundTrip(t *testing.T) {
	tmpl := "{{- if .X }}\nspec:\n\n  a: b # c\n    d: \"e\"\n{{- end }}\n"
	for path, text := range generated(tmpl) {
		got := injectorSettings(t, path, text).Templates["supervisor"]
		if diff := cmp.Diff(tmpl, got); diff != "" {
			t.Errorf("%s: template not carried verbatim (-want +got):\n%s", path, diff)
		}
	}
}
