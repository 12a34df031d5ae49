package main

import (
	"strings"
	"testing"
)

// TestApproachesAreDistinct checks that each row's Job differs only where
// the approach does: the same app work everywhere, unique names.
func TestApproachesAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range approaches(3) {
		if seen[a.key] {
			t.Errorf("approach key %q twice", a.key)
		}
		seen[a.key] = true
		j := a.job(a.key+"-0", "istio-proxy-image")
		c := j.Spec.Template.Spec.Containers
		if a.istio != "" && len(c) == 2 && c[1].Name == proxyName && c[1].Image == "istio-proxy-image" {
			c = c[:1]
		}
		if len(c) != 1 || c[0].Name != appName {
			t.Errorf("%s: containers %v, want the app alone (the injector adds the rest)", a.key, c)
			continue
		}
		cmd := c[0].Command
		if a.argv == nil && (len(cmd) != 3 || cmd[0] != "sh") {
			t.Errorf("%s: command %q, want sh -c SCRIPT", a.key, cmd)
		}
		if a.argv == nil && !strings.Contains(cmd[len(cmd)-1], "sleep 3; "+stamp) {
			t.Errorf("%s: script %q lacks the common app", a.key, cmd[len(cmd)-1])
		}
		if got := j.Spec.Template.Labels["sidecar.istio.io/inject"]; got != "true" {
			t.Errorf("%s: label sidecar.istio.io/inject = %q", a.key, got)
		}
	}
}
