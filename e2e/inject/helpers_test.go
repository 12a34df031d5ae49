package inject

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	// deployDir is the repository's deploy/ seen from this package.
	deployDir = "../../deploy"

	supervisorName = "sidecar-supervisor"
	proxyName      = "istio-proxy"
	supervisorRef  = "ghcr.io/sidecar-supervisor/sidecar-supervisor:v0.1.0"

	// annotationPrefix is the prefix of the injection template's per-pod
	// settings.
	annotationPrefix = "supervisor.sidecar-supervisor.io/"
)

// settingAnnotations maps each SUPERVISOR_* variable that can be tuned per
// pod to its annotation (after annotationPrefix). The injection template and
// the kustomize component must both honour exactly these.
var settingAnnotations = map[string]string{
	"SUPERVISOR_APP_CONTAINERS":        "app-containers",
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
}

func shapeOf(spec corev1.PodSpec) podShape {
	s := podShape{
		ShareProcessNamespace: spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace,
	}
	for _, c := range spec.InitContainers {
		s.InitContainers = append(s.InitContainers, c.Name)
	}
	for _, c := range spec.Containers {
		s.Containers = append(s.Containers, c.Name)
	}
	c := findContainer(spec, supervisorName)
	if c == nil {
		return s
	}
	s.SupervisorEnv = map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			v = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ResourceFieldRef != nil:
			v = "resourceFieldRef:" + e.ValueFrom.ResourceFieldRef.Resource
		default:
			v = "valueFrom:?"
		}
		s.SupervisorEnv[e.Name] = v
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

func findContainer(spec corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// checkOrder checks that the supervisor, when present, comes after every
// application container. With proxyMayFollow, istio-proxy alone may come
// after it: Istio's injector moves istio-proxy to the end after running all
// templates (unless holdApplicationUntilProxyStarts puts it first).
func checkOrder(t *testing.T, spec corev1.PodSpec, proxyMayFollow bool) {
	t.Helper()
	names := shapeOf(spec).Containers
	i := slices.Index(names, supervisorName)
	if i < 0 {
		return
	}
	for _, after := range names[i+1:] {
		if after != proxyName || !proxyMayFollow {
			t.Errorf("container %q comes after %s: %v", after, supervisorName, names)
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
		Limits:                   map[string]string{"cpu": "50m", "memory": "32Mi"},
		ReadOnlyRootFilesystem:   true,
		AllowPrivilegeEscalation: false,
		RunAsNonRoot:             !ptrace,
		CapsDrop:                 []string{"ALL"},
		Seccomp:                  corev1.SeccompProfileTypeRuntimeDefault,
	}
}

// checkSupervisorBasics checks the supervisor container, if the pod has one.
func checkSupervisorBasics(t *testing.T, spec corev1.PodSpec, want supervisorBasics) {
	t.Helper()
	c := findContainer(spec, supervisorName)
	if c == nil {
		return
	}
	if diff := cmp.Diff(want, basicsOf(*c)); diff != "" {
		t.Errorf("supervisor container settings (-want +got):\n%s", diff)
	}
}
