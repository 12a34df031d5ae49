package inject

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// The supervisor comes in two shapes: a regular container ("container",
// the default), or a native sidecar ("native": an init container with
// restartPolicy Always), which the kubelet restarts on any death whatever
// the pod's restartPolicy, starts before every regular container and stops
// after them. Kubelets before 1.29 (1.28 with the SidecarContainers gate
// off) do not know such a container and wait for it to end before they
// start the apps, which it never does: only a fact about the cluster turns
// the native shape on.

// readyProbe is the native supervisor's startup probe: the image's binary
// (the Dockerfile's /sidecar-supervisor) asked whether its first scan of the
// pod is done, every second. The kubelet starts the next container only
// once it passes, so no app starts before the supervisor watches. A failing
// probe only holds the apps back; past its failureThreshold the kubelet
// restarts the supervisor, which helps only one that hung: 600 tries, ten
// minutes, as Istio gives its own native istio-proxy.
var readyProbe = corev1.Probe{
	ProbeHandler: corev1.ProbeHandler{
		Exec: &corev1.ExecAction{Command: []string{"/" + supervisorName, "ready"}},
	},
	PeriodSeconds:    1,
	FailureThreshold: 600,
}

// waitHook is the postStart hook of a supervisor that is a regular
// container placed before the apps: the kubelet starts the next container
// only once it returns, which is when the supervisor's first scan is done
// (bounded, always exit 0), as readyProbe does for the native shape.
var waitHook = corev1.Lifecycle{
	PostStart: &corev1.LifecycleHandler{
		Exec: &corev1.ExecAction{Command: []string{"/" + supervisorName, "wait"}},
	},
}

// checkSupervisorShape checks that the supervisor c, with environment env,
// is what its place in the pod says, a regular container or a native
// sidecar (an init container); each error says why. The native one has no
// liveness probe, which would restart a supervisor at work, and no
// readiness probe, which means nothing to a Job.
func checkSupervisorShape(t *testing.T, spec corev1.PodSpec, c *corev1.Container, env map[string]string) {
	t.Helper()
	shape := env[shapeVar]
	if findInit(spec, supervisorName) == nil {
		if c.RestartPolicy != nil || c.StartupProbe != nil || c.LivenessProbe != nil || c.ReadinessProbe != nil {
			t.Errorf("the supervisor as a regular container has a restartPolicy or a probe: %+v", c)
		}
		if shape != "" && shape != "container" {
			t.Errorf("the supervisor is a regular container with %s=%q", shapeVar, shape)
		}
		switch first := spec.Containers[0].Name == supervisorName; {
		case first && env[stateVar] == "":
			t.Errorf("the supervisor comes before the apps without %s: its postStart hook has no ready file to wait for", stateVar)
		case first:
			if diff := cmp.Diff(&waitHook, c.Lifecycle); diff != "" {
				t.Errorf("the supervisor before the apps: its lifecycle (-want +got):\n%s", diff)
			}
		case c.Lifecycle != nil:
			t.Errorf("the supervisor after an app has a hook, which would only hold back the containers after it: %+v", c.Lifecycle)
		}
		return
	}
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("the supervisor is an init container without restartPolicy Always: the pod would wait for it to end before starting the apps")
	}
	if shape != "native" {
		t.Errorf("the supervisor is a native sidecar with %s=%q, want native: it would exit once done, and be restarted", shapeVar, shape)
	}
	if diff := cmp.Diff(&readyProbe, c.StartupProbe); diff != "" {
		t.Errorf("the native supervisor's startupProbe (-want +got):\n%s", diff)
	}
	if c.LivenessProbe != nil || c.ReadinessProbe != nil || c.Lifecycle != nil {
		t.Errorf("the native supervisor has a liveness or readiness probe or a hook: %+v", c)
	}
}

// checkStateDir: a supervisor c whose env has SUPERVISOR_STATE_DIR mounts
// there, writable, a volume no app container mounts (a restarted
// supervisor reads back only what it wrote itself, or istio-proxy's
// uid, which it checks): an emptyDir in memory (it lasts as long as the
// pod, on no disk; tmpfs pages count against the supervisor's own memory
// limit) of at most 1Mi. istio-proxy mounts it too, at the same path and
// writable, exactly under exit-status ptrace (process accounting goes
// through istio-proxy's mount, to outlive the supervisor's: that needs
// the supervisor's CAP_SYS_PTRACE). Without it, no state volume.
func checkStateDir(t *testing.T, spec corev1.PodSpec, c *corev1.Container, env map[string]string) {
	t.Helper()
	dir := env[stateVar]
	var mounts []string
	for _, m := range c.VolumeMounts {
		if m.Name == stateVolume {
			mounts = append(mounts, m.MountPath)
			if m.ReadOnly {
				t.Errorf("the supervisor mounts %s read-only: it writes its journal there", stateVolume)
			}
		}
	}
	if dir == "" {
		if len(mounts) > 0 {
			t.Errorf("the supervisor mounts %s at %v but has no %s", stateVolume, mounts, stateVar)
		}
		return
	}
	if diff := cmp.Diff([]string{dir}, mounts); diff != "" {
		t.Errorf("%s=%s: the supervisor's mounts of %s (-want +got):\n%s", stateVar, dir, stateVolume, diff)
	}
	ptrace := env["SUPERVISOR_EXIT_STATUS"] == "ptrace"
	for _, o := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if o.Name == supervisorName || o.Name == standbyName { // the standby: checkStandby
			continue
		}
		var at []corev1.VolumeMount
		for _, m := range o.VolumeMounts {
			if m.Name == stateVolume {
				at = append(at, m)
			}
		}
		switch want := []corev1.VolumeMount{{Name: stateVolume, MountPath: dir}}; {
		case o.Name == proxyName && ptrace:
			if diff := cmp.Diff(want, at); diff != "" {
				t.Errorf("istio-proxy's mounts of %s, under exit-status ptrace (-want +got):\n%s", stateVolume, diff)
			}
		case len(at) > 0:
			t.Errorf("container %s mounts the supervisor's state volume too", o.Name)
		}
	}
	want := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi")),
	}}
	for _, v := range spec.Volumes {
		if v.Name == stateVolume {
			if diff := cmp.Diff(want, v.VolumeSource); diff != "" {
				t.Errorf("volume %s (-want +got):\n%s", stateVolume, diff)
			}
			return
		}
	}
	t.Errorf("the supervisor mounts %s, which the pod does not have", stateVolume)
}

// istioInits are the init containers Istio's injector moves last (after
// every other init container) where istio-proxy is a regular container:
// iptables set up after the pod's own init containers, so as not to
// blackhole them (istio/istio pkg/kube/inject webhook.go, reorderPod).
// istio-validation (Istio's CNI) it moves first instead.
var istioInits = []string{"istio-init", "enable-core-dump"}

// checkNativeOrder checks where a native supervisor sits. The kubelet starts
// the init containers one at a time, a restartable one counting as started
// once its startup probe passes, and only then the regular containers: the
// supervisor watches before any app starts wherever it is among the init
// containers. It comes after the pod's own, which are neither apps nor
// waited for, and before Istio's istio-init alone, which it does not need
// (no network until the apps are done, and then only loopback). As in the
// container shape, SUPERVISOR_AFTER_APPS says that istio-proxy comes last:
// the kubelet pulls each app's image only once it gets to it, so the look
// for an app not seen cannot count from the supervisor's start. Without it,
// istio-proxy comes first (holdApplicationUntilProxyStarts) and
// SUPERVISOR_APP_START_TIMEOUT must be set instead, long.
func checkNativeOrder(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	shape := shapeOf(spec)
	inits := shape.InitContainers
	i := slices.Index(inits, supervisorName)
	for _, n := range inits[i+1:] {
		if n != standbyName && !slices.Contains(istioInits, n) {
			t.Errorf("init container %q comes after the native %s: only Istio's %v may: %v", n, supervisorName, istioInits, inits)
		}
	}
	names := shape.Containers
	p := slices.Index(names, proxyName)
	switch after := shape.SupervisorEnv[afterAppsVar]; {
	case after == proxyName:
		if p >= 0 && p != len(names)-1 {
			t.Errorf("the native %s has %s=%s but istio-proxy is not last: %v", supervisorName, afterAppsVar, proxyName, names)
		}
	case after != "":
		t.Errorf("the native %s has %s=%q, want %q or none", supervisorName, afterAppsVar, after, proxyName)
	default:
		if p > 0 {
			t.Errorf("the native %s has no %s, so istio-proxy must come first: %v", supervisorName, afterAppsVar, names)
		}
		if shape.SupervisorEnv["SUPERVISOR_APP_START_TIMEOUT"] == "" {
			t.Errorf("the native %s has neither %s nor SUPERVISOR_APP_START_TIMEOUT: the look for the apps would count 30s from its own start, before their images are pulled", supervisorName, afterAppsVar)
		}
	}
}

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
