package inject

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

const (
	// deployDir is the repository's deploy/ seen from this package.
	deployDir = "../../deploy"

	supervisorName = "sidecar-supervisor"
	standbyName    = "sidecar-supervisor-standby"
	proxyName      = "istio-proxy"
	supervisorRef  = "ghcr.io/sidecar-supervisor/sidecar-supervisor:v0.1.0"

	// The hold's parts: the init container that copies the binary into the
	// volume, the volume, where istio-proxy mounts it.
	installName = "sidecar-supervisor-install"
	holdVolume  = "sidecar-supervisor"
	holdDir     = "/var/run/sidecar-supervisor"

	// annotationPrefix is the prefix of the injection template's per-pod
	// settings.
	annotationPrefix = "supervisor.sidecar-supervisor.io/"

	// The supervisor's state: a memory-backed emptyDir of its own, where
	// it keeps its journal (what it saw, for a restarted instance to carry
	// on from) and its ready file (SUPERVISOR_STATE_DIR).
	stateVar    = "SUPERVISOR_STATE_DIR"
	stateVolume = "sidecar-supervisor-state"
	stateDir    = "/var/run/sidecar-supervisor-state"

	// shapeVar tells the binary which shape it runs in: "container" (a
	// regular container, the default) or "native" (a restartable init
	// container, which must idle once done rather than exit).
	shapeVar = "SUPERVISOR_SHAPE"
)

// settingAnnotations maps each SUPERVISOR_* variable that can be tuned per
// pod to its annotation (after annotationPrefix). The injection template and
// the kustomize component must both honour exactly these.
var settingAnnotations = map[string]string{
	"SUPERVISOR_APP_CONTAINERS":        "app-containers",
	"SUPERVISOR_APPS":                  "apps",
	"SUPERVISOR_SIDECARS":              "sidecars",
	"SUPERVISOR_RESTART_MARGIN":        "restart-margin",
	"SUPERVISOR_ON_SUCCESS":            "on-success",
	"SUPERVISOR_ON_FAILURE":            "on-failure",
	"SUPERVISOR_ON_UNKNOWN":            "on-unknown",
	"SUPERVISOR_STOP_TIMEOUT":          "stop-timeout",
	"SUPERVISOR_APP_START_TIMEOUT":     "app-start-timeout",
	"SUPERVISOR_SIDECAR_START_TIMEOUT": "sidecar-start-timeout",
	"SUPERVISOR_EXIT_STATUS":           "exit-status",
	"SUPERVISOR_LOG_LEVEL":             "log-level",
	"SUPERVISOR_LOG_FORMAT":            "log-format",
	"SUPERVISOR_IGNORE_PROCESSES":      "ignore-processes",
}

// readDeploy returns the contents of a file under deploy/.
func readDeploy(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeStrict decodes YAML or JSON into out and fails the test on fields the
// Kubernetes type does not have, or on duplicate fields: what kubectl's
// server-side field validation would reject.
func decodeStrict(t *testing.T, data []byte, out any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Fatalf("strict decode into %T: %v\n--- input ---\n%s", out, err, data)
	}
}

// podShape is what the tests compare between the pod they got and the pod
// they want: where the supervisor and istio-proxy are and how the supervisor
// is configured.
type podShape struct {
	InitContainers        []string
	Containers            []string
	ShareProcessNamespace bool
	// The supervisor container's environment: literal values as they are,
	// values from the downward API as "fieldRef:<path>" or
	// "resourceFieldRef:<resource>". Nil without a supervisor.
	SupervisorEnv map[string]string
	// The supervisor's runAsUser ("" when unset) and added capabilities.
	SupervisorUser    string
	SupervisorCapsAdd []string
	// What istio-proxy and the pod carry of the hold (or of other hooks).
	Hold holdShape
}

// supervisorFirst and supervisorLast are a pod of containers with the
// supervisor, configured with env and running as istio-proxy's uid, before
// or after them, sharing its PID namespace.
func supervisorFirst(env map[string]string, containers ...string) podShape {
	return podShape{Containers: slices.Concat([]string{supervisorName}, containers), ShareProcessNamespace: true, SupervisorEnv: env, SupervisorUser: "1337"}
}

func supervisorLast(env map[string]string, containers ...string) podShape {
	return podShape{Containers: slices.Concat(containers, []string{supervisorName}), ShareProcessNamespace: true, SupervisorEnv: env, SupervisorUser: "1337"}
}

// asRoot is s with the supervisor as exit-status ptrace runs it: as root,
// with SYS_PTRACE, SYS_PACCT and KILL; asAccountingRoot as exit-status
// accounting does: with SYS_PACCT and KILL.
func asRoot(s podShape) podShape {
	s.SupervisorUser, s.SupervisorCapsAdd = "0", []string{"SYS_PTRACE", "SYS_PACCT", "KILL"}
	return s
}

func asAccountingRoot(s podShape) podShape {
	s.SupervisorUser, s.SupervisorCapsAdd = "0", []string{"SYS_PACCT", "KILL"}
	return s
}

// holdShape is what a pod has of the hold, found in it field by field, so
// that a half-added hold shows which part is missing.
type holdShape struct {
	// istio-proxy's preStop hook command, whoever set it: the hold, Istio
	// (native sidecars: pilot-agent request ... drain) or the user.
	PreStop []string
	// istio-proxy's postStart hook command (Istio's pilot-agent wait with
	// holdApplicationUntilProxyStarts), to show that the hold keeps it.
	PostStart []string
	// istio-proxy's SUPERVISOR_* variables, as in SupervisorEnv.
	Env map[string]string
	// istio-proxy's mounts of the hold volume: "path" or "path (read-only)".
	Mounts []string
	// The hold volume's source: "emptyDir", or "other" for anything else.
	Volume string
	// The install init container's args and mounts of the hold volume.
	InstallArgs   []string
	InstallMounts []string
}

// wantHold is the hold as the injection template adds it, with the given
// SUPERVISOR_HOLD_TIMEOUT and further istio-proxy variables (name, value...).
func wantHold(timeout string, extra ...string) holdShape {
	return holdShape{
		PreStop:       []string{holdDir + "/" + supervisorName, "hold"},
		Env:           setPairs(map[string]string{"SUPERVISOR_HOLD_TIMEOUT": timeout}, extra...),
		Mounts:        []string{holdDir + " (read-only)"},
		Volume:        "emptyDir",
		InstallArgs:   []string{"install", holdDir},
		InstallMounts: []string{holdDir},
	}
}

// setPairs sets in m, made if nil, each name to the value after it in kv
// (name, value...), and returns m: how the tests write an environment,
// annotations or labels as a list.
func setPairs(m map[string]string, kv ...string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// holdOf finds in spec, field by field, what it has of the hold.
func holdOf(spec corev1.PodSpec) holdShape {
	var h holdShape
	mounts := func(c *corev1.Container) []string {
		var out []string
		for _, m := range c.VolumeMounts {
			if m.Name != holdVolume {
				continue
			}
			if m.ReadOnly {
				out = append(out, m.MountPath+" (read-only)")
			} else {
				out = append(out, m.MountPath)
			}
		}
		return out
	}
	if p := findEither(spec, proxyName); p != nil {
		if l := p.Lifecycle; l != nil {
			if l.PreStop != nil && l.PreStop.Exec != nil {
				h.PreStop = l.PreStop.Exec.Command
			}
			if l.PostStart != nil && l.PostStart.Exec != nil {
				h.PostStart = l.PostStart.Exec.Command
			}
		}
		for _, e := range p.Env {
			if strings.HasPrefix(e.Name, "SUPERVISOR_") {
				h.Env = setPairs(h.Env, e.Name, envValue(e))
			}
		}
		h.Mounts = mounts(p)
	}
	for _, v := range spec.Volumes {
		if v.Name == holdVolume {
			h.Volume = "other"
			if v.EmptyDir != nil {
				h.Volume = "emptyDir"
			}
		}
	}
	if c := findInit(spec, installName); c != nil {
		h.InstallArgs = c.Args
		h.InstallMounts = mounts(c)
	}
	return h
}

// findInit returns the init container called name, or nil.
func findInit(spec corev1.PodSpec, name string) *corev1.Container {
	return injector.Find(spec.InitContainers, name)
}

// envValue gives a literal value as it is, a downward API value as
// "fieldRef:<path>" or "resourceFieldRef:<resource>".
func envValue(e corev1.EnvVar) string {
	switch {
	case e.ValueFrom == nil:
		return e.Value
	case e.ValueFrom.FieldRef != nil:
		return "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
	case e.ValueFrom.ResourceFieldRef != nil:
		return "resourceFieldRef:" + e.ValueFrom.ResourceFieldRef.Resource
	}
	return "valueFrom:?"
}

func shapeOf(spec corev1.PodSpec) podShape {
	s := podShape{
		ShareProcessNamespace: spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace,
		Hold:                  holdOf(spec),
	}
	for _, c := range spec.InitContainers {
		s.InitContainers = append(s.InitContainers, c.Name)
	}
	for _, c := range spec.Containers {
		s.Containers = append(s.Containers, c.Name)
	}
	c := findEither(spec, supervisorName)
	if c == nil {
		return s
	}
	s.SupervisorEnv = map[string]string{}
	for _, e := range c.Env {
		s.SupervisorEnv[e.Name] = envValue(e)
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			s.SupervisorUser = strconv.FormatInt(*sc.RunAsUser, 10)
		}
		if sc.Capabilities != nil {
			for _, cp := range sc.Capabilities.Add {
				s.SupervisorCapsAdd = append(s.SupervisorCapsAdd, string(cp))
			}
		}
	}
	return s
}

// findEither returns the regular container called name or, failing that,
// the init container (a native sidecar): the supervisor or istio-proxy in
// either of its shapes.
func findEither(spec corev1.PodSpec, name string) *corev1.Container {
	if c := findContainer(spec, name); c != nil {
		return c
	}
	return findInit(spec, name)
}

// findContainer returns the regular container called name, or nil.
func findContainer(spec corev1.PodSpec, name string) *corev1.Container {
	return injector.Find(spec.Containers, name)
}

// afterAppsVar names the containers the kubelet starts after every app; the
// injection template sets it to istio-proxy when it puts the supervisor first.
const afterAppsVar = "SUPERVISOR_AFTER_APPS"

// checkOrder checks where the supervisor, when present, sits among the
// containers, which the kubelet starts one at a time in the spec's order.
// A native supervisor (an init container) is checked by checkNativeOrder.
// As a regular container, told apart by the supervisor's environment:
//   - without SUPERVISOR_AFTER_APPS (by hand, the kustomize component, the
//     template with holdApplicationUntilProxyStarts, the admission policy
//     where no sidecar follows the apps): the supervisor after every app.
//     With proxyMayFollow, istio-proxy alone may come after it: Istio's
//     injector moves istio-proxy last after running all templates (unless
//     holdApplicationUntilProxyStarts puts it first);
//   - with it, the supervisor first, before every app, and each container
//     named after the apps (SUPERVISOR_APPS), so that one of them starting
//     marks the kubelet's passing of the apps: the template's istio-proxy
//     last, or the admission policy's sidecars.
func checkOrder(t *testing.T, spec corev1.PodSpec, proxyMayFollow bool) {
	t.Helper()
	shape := shapeOf(spec)
	names := shape.Containers
	i := slices.Index(names, supervisorName)
	if i < 0 {
		if slices.Contains(shape.InitContainers, supervisorName) {
			checkNativeOrder(t, spec)
		}
		return
	}
	after, ok := shape.SupervisorEnv[afterAppsVar]
	switch {
	case !ok:
		for _, n := range names[i+1:] {
			if n != standbyName && (n != proxyName || !proxyMayFollow) {
				t.Errorf("container %q comes after %s, which has no %s: %v", n, supervisorName, afterAppsVar, names)
			}
		}
	case i != 0:
		t.Errorf("%s with %s=%s is not first: %v", supervisorName, afterAppsVar, after, names)
	case after == proxyName:
		if names[len(names)-1] != proxyName {
			t.Errorf("%s has %s=%s: want %s last, got %v", supervisorName, afterAppsVar, proxyName, proxyName, names)
		}
	default:
		for _, s := range strings.Split(after, ",") {
			j := slices.Index(names, s)
			for _, a := range strings.Split(shape.SupervisorEnv["SUPERVISOR_APPS"], ",") {
				if k := slices.Index(names, a); j < 0 || k > j {
					t.Errorf("%s=%s: %s does not come after app %s: %v", afterAppsVar, after, s, a, names)
				}
			}
		}
	}
}

// checkStandby: a standby supervisor comes right after the supervisor, in
// the same list, and is the same container but for its name.
func checkStandby(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	for _, l := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		i := slices.IndexFunc(l, func(c corev1.Container) bool { return c.Name == standbyName })
		if i < 0 {
			continue
		}
		if i == 0 || l[i-1].Name != supervisorName {
			t.Errorf("%s does not come right after %s", standbyName, supervisorName)
			continue
		}
		twin := *l[i].DeepCopy()
		twin.Name = supervisorName
		if diff := cmp.Diff(l[i-1], twin); diff != "" {
			t.Errorf("%s differs from %s but for its name (-supervisor +standby):\n%s", standbyName, supervisorName, diff)
		}
	}
}

// supervisorBasics are the settings every way of adding the supervisor must
// give it, whatever the pod.
type supervisorBasics struct {
	Image                    string
	ImagePullPolicy          corev1.PullPolicy
	TerminationMessagePolicy corev1.TerminationMessagePolicy
	Requests, Limits         map[string]string
	ReadOnlyRootFilesystem   bool
	AllowPrivilegeEscalation bool
	RunAsNonRoot             bool
	CapsDrop                 []string
	Seccomp                  corev1.SeccompProfileType
}

func basicsOf(c corev1.Container) supervisorBasics {
	b := supervisorBasics{
		Image:                    c.Image,
		ImagePullPolicy:          c.ImagePullPolicy,
		TerminationMessagePolicy: c.TerminationMessagePolicy,
		Requests:                 map[string]string{},
		Limits:                   map[string]string{},
	}
	for k, v := range c.Resources.Requests {
		b.Requests[string(k)] = v.String()
	}
	for k, v := range c.Resources.Limits {
		b.Limits[string(k)] = v.String()
	}
	if sc := c.SecurityContext; sc != nil {
		b.ReadOnlyRootFilesystem = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
		b.AllowPrivilegeEscalation = sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation
		b.RunAsNonRoot = sc.RunAsNonRoot != nil && *sc.RunAsNonRoot
		if sc.Capabilities != nil {
			for _, cp := range sc.Capabilities.Drop {
				b.CapsDrop = append(b.CapsDrop, string(cp))
			}
		}
		if sc.SeccompProfile != nil {
			b.Seccomp = sc.SeccompProfile.Type
		}
	}
	return b
}

// wantBasics returns the settings shared by all deploy methods. Only the
// ptrace variant runs as root.
func wantBasics(ptrace bool) supervisorBasics {
	return supervisorBasics{
		Image:                    supervisorRef,
		ImagePullPolicy:          corev1.PullIfNotPresent,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Requests:                 map[string]string{"cpu": "5m", "memory": "16Mi"},
		Limits:                   map[string]string{"cpu": "200m", "memory": "32Mi"},
		ReadOnlyRootFilesystem:   true,
		AllowPrivilegeEscalation: false,
		RunAsNonRoot:             !ptrace,
		CapsDrop:                 []string{"ALL"},
		Seccomp:                  corev1.SeccompProfileTypeRuntimeDefault,
	}
}

// checkSupervisorBasics checks the supervisor, in either shape, and the
// hold's install init container, if the pod has them: both are the
// supervisor's image, hardened alike. The supervisor's shape and its state
// directory are checked too (checkSupervisorShape, checkStateDir).
func checkSupervisorBasics(t *testing.T, spec corev1.PodSpec, want supervisorBasics) {
	t.Helper()
	if c := findEither(spec, supervisorName); c != nil {
		if diff := cmp.Diff(want, basicsOf(*c)); diff != "" {
			t.Errorf("supervisor container settings (-want +got):\n%s", diff)
		}
		env := shapeOf(spec).SupervisorEnv
		checkSupervisorShape(t, spec, c, env)
		checkStateDir(t, spec, c, env)
	}
	if c := findInit(spec, installName); c != nil {
		want := want
		want.RunAsNonRoot = true // never ptrace
		if diff := cmp.Diff(want, basicsOf(*c)); diff != "" {
			t.Errorf("%s init container settings (-want +got):\n%s", installName, diff)
		}
	}
}

// checkSupervised checks a pod as the supervisor was added to it: its shape
// is want (a difference is reported as what's, with shown after it), and
// it passes checkOrder, checkSupervisorBasics with basics, checkValid, and
// checkPodSecurity (ptrace where basics are wantBasics(true)'s).
func checkSupervised(t *testing.T, spec corev1.PodSpec, want podShape, basics supervisorBasics, proxyMayFollow bool, what, shown string) {
	t.Helper()
	if diff := cmp.Diff(want, shapeOf(spec)); diff != "" {
		t.Errorf("%s (-want +got):\n%s\n%s", what, diff, shown)
	}
	checkOrder(t, spec, proxyMayFollow)
	checkStandby(t, spec)
	checkSupervisorBasics(t, spec, basics)
	checkValid(t, spec)
	checkPodSecurity(t, spec, want.SupervisorCapsAdd)
}
