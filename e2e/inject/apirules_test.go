package inject

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// checkValid checks what the API server would refuse or a merge could
// duplicate, for the fields the supervisor's two shapes use: the rules of
// Kubernetes' own validation (k8s.io/kubernetes pkg/apis/core/validation:
// validateInitContainers, validateContainers, validateProbe,
// validateStartupProbe, validateVolumes) that strict decoding into the API
// types does not check, written down here because that package pulls in
// most of Kubernetes.
func checkValid(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	names, volumeNames := map[string]bool{}, map[string]bool{}
	volumes := map[string]corev1.Volume{}
	// twice reports a name seen before, and marks it seen.
	twice := func(what, name string, seen map[string]bool) {
		if seen[name] {
			t.Errorf("%s: %q appears twice", what, name)
		}
		seen[name] = true
	}
	for _, v := range spec.Volumes {
		twice("volumes", v.Name, volumeNames)
		volumes[v.Name] = v
		if d := v.EmptyDir; d != nil {
			switch d.Medium {
			case corev1.StorageMediumDefault, corev1.StorageMediumMemory, corev1.StorageMediumHugePages:
			default:
				t.Errorf("volume %s: emptyDir medium %q is not one the API accepts", v.Name, d.Medium)
			}
			if d.SizeLimit != nil && d.SizeLimit.Cmp(resource.Quantity{}) < 0 {
				t.Errorf("volume %s: emptyDir sizeLimit %s is negative", v.Name, d.SizeLimit)
			}
		}
	}
	check := func(c corev1.Container, init bool) {
		twice("container names, init and regular", c.Name, names)
		env, paths := map[string]bool{}, map[string]bool{}
		for _, e := range c.Env {
			twice(c.Name+" env", e.Name, env)
		}
		for _, m := range c.VolumeMounts {
			twice(c.Name+" volumeMounts", m.MountPath, paths)
			if _, ok := volumes[m.Name]; !ok {
				t.Errorf("container %s mounts volume %q, which the pod does not have", c.Name, m.Name)
			}
		}
		restartable := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		switch {
		case !init && c.RestartPolicy != nil: // only the alpha ContainerRestartRules gate (1.34) admits one
			t.Errorf("container %s: restartPolicy %q on a regular container", c.Name, *c.RestartPolicy)
		case init && c.RestartPolicy != nil && !restartable:
			t.Errorf("init container %s: restartPolicy %q, the API accepts only Always", c.Name, *c.RestartPolicy)
		case init && !restartable:
			for field, set := range map[string]bool{
				"lifecycle":      c.Lifecycle != nil,
				"livenessProbe":  c.LivenessProbe != nil,
				"readinessProbe": c.ReadinessProbe != nil,
				"startupProbe":   c.StartupProbe != nil,
			} {
				if set {
					t.Errorf("init container %s: %s may not be set for init containers without restartPolicy=Always", c.Name, field)
				}
			}
		}
		for field, p := range map[string]*corev1.Probe{
			"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe,
		} {
			if p != nil {
				checkProbe(t, c.Name+" "+field, p, field != "readinessProbe")
			}
		}
	}
	for _, c := range spec.InitContainers {
		check(c, true)
	}
	for _, c := range spec.Containers {
		check(c, false)
	}
}

// checkProbe checks one probe as validateProbe does; oneSuccess: a startup
// or liveness probe, whose successThreshold must be 1.
func checkProbe(t *testing.T, what string, p *corev1.Probe, oneSuccess bool) {
	t.Helper()
	handlers := 0
	for _, set := range []bool{p.Exec != nil, p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
		if set {
			handlers++
		}
	}
	if handlers != 1 {
		t.Errorf("%s: %d handlers, the API wants exactly one", what, handlers)
	}
	if p.Exec != nil && len(p.Exec.Command) == 0 {
		t.Errorf("%s: exec with no command", what)
	}
	for field, n := range map[string]int32{
		"initialDelaySeconds": p.InitialDelaySeconds, "timeoutSeconds": p.TimeoutSeconds,
		"periodSeconds": p.PeriodSeconds, "successThreshold": p.SuccessThreshold,
		"failureThreshold": p.FailureThreshold,
	} {
		if n < 0 {
			t.Errorf("%s: %s %d is negative", what, field, n)
		}
	}
	if oneSuccess && p.SuccessThreshold > 1 { // 0 is defaulted to 1
		t.Errorf("%s: successThreshold %d, must be 1", what, p.SuccessThreshold)
	}
	if g := p.TerminationGracePeriodSeconds; g != nil && *g <= 0 {
		t.Errorf("%s: terminationGracePeriodSeconds %d, must be positive", what, *g)
	}
}
