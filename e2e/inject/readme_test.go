package inject

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeBlock returns the first fenced code block of kind lang after the
// line starting with marker in the top README.
func readmeBlock(t *testing.T, marker, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+marker)
	if i < 0 {
		t.Fatalf("README has no %q", marker)
	}
	s = s[i:]
	open := "```" + lang + "\n"
	j := strings.Index(s, open)
	if j < 0 {
		t.Fatalf("README has no %s block after %q", lang, marker)
	}
	s = s[j+len(open):]
	k := strings.Index(s, "```")
	if k < 0 {
		t.Fatalf("unterminated block after %q", marker)
	}
	return s[:k]
}

// The image the README's install block builds, and the one it gives istiod.
var (
	readmeImage    = regexp.MustCompile(`(?s)docker buildx build\b.*?\s-t\s+(\S+)`)
	readmeImageSet = regexp.MustCompile(`--set\s+pilot\.env\.SIDECAR_SUPERVISOR_IMAGE=(\S+)`)
)

// TestReadmeInstall checks the README's Install section as written.
func TestReadmeInstall(t *testing.T) {
	t.Run("by hand", func(t *testing.T) {
		tmpl := podTemplateOf(t, "Job", []byte(readmeBlock(t, "**By hand**", "yaml")))
		checkHandWritten(t, tmpl, supervisorLast(map[string]string{
			"SUPERVISOR_RESTART_POLICY": "Never",
			"SUPERVISOR_APP_CONTAINERS": "1",
			"SUPERVISOR_APPS":           "app",
			"SUPERVISOR_ON_SUCCESS":     quitURL,
		}, "app"), false)
	})
	t.Run("injection template", func(t *testing.T) {
		cmd := readmeBlock(t, "**Istio injection template**", "sh")
		const values = "deploy/istio/values-supervisor.yaml"
		if !strings.Contains(cmd, "-f "+values) {
			t.Errorf("README's helm command does not use %s:\n%s", values, cmd)
		}
		// That file is what every injector test renders Istio's chart
		// with (injector.RenderHelm), so it exists.
		// No image is published under the template's default, so the same
		// block builds one and points istiod at it: the helm command's
		// image is the one the build pushes, and not the placeholder.
		built := readmeImage.FindStringSubmatch(cmd)
		set := readmeImageSet.FindStringSubmatch(cmd)
		switch {
		case built == nil || set == nil:
			t.Errorf("README's install block does not both build an image (-t) and set pilot.env.SIDECAR_SUPERVISOR_IMAGE:\n%s", cmd)
		case built[1] != set[1]:
			t.Errorf("README's helm command sets image %s, its build pushes %s", set[1], built[1])
		case set[1] == supervisorRef:
			t.Errorf("README's helm command sets the placeholder image %s", supervisorRef)
		}
	})
	t.Run("kustomize", func(t *testing.T) {
		block := readmeBlock(t, "**Kustomize**", "yaml")
		example := string(readDeploy(t, "kustomize/example/kustomization.yaml"))
		// The example overlay is what the kustomize tests build.
		if !strings.Contains(example, block) {
			t.Errorf("README's kustomize block is not deploy/kustomize/example's:\n%s", block)
		}
	})
}
