package k8sjobs

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// sidecarInjectors is a mutating admission webhook of the tests' own, served
// to the cluster's API server like Istio's (e2e/inject/injector), that adds
// sidecars as two injectors that still add regular containers do, with
// podsim's stand-ins for their programs (e2e/images/standins):
//
//   - vault-k8s (v1.7.6; agent-inject/agent/agent.go Patch,
//     container_sidecar.go, container_init_sidecar.go, config.go), for pods
//     annotated vault.hashicorp.com/agent-inject: the init container
//     vault-agent-init and the sidecar vault-agent, `/bin/sh -ec '... &&
//     vault agent -config=...'` as uid 100, its configuration in
//     VAULT_CONFIG (base64 JSON) with a listener on 127.0.0.1:<the
//     agent-cache-listener-port annotation, 8200> serving /agent/v1/quit
//     only with the agent-enable-quit annotation; the secrets' memory volume
//     mounted in every container; the pod annotated
//     vault.hashicorp.com/agent-inject-status: injected, which keeps a
//     second call from injecting again;
//   - Dapr's sidecar injector (pkg/injector/patcher), for pods annotated
//     dapr.io/enabled: daprd appended to the containers, `/daprd --mode
//     kubernetes --dapr-http-port <dapr.io/http-port, 3500> ...` as its
//     image's uid 65532, unless the pod has a daprd already.
//
// Each container as its injector makes it where the supervisor's work
// depends on it (name, process, uid, command line, what enables the stop);
// not their probes, ports or resources (small requests here: the node has
// two cores for every case at once).
//
// It records each call, per Job, so that a test can see that the API server
// called it again after the admission policy's change (reinvocationPolicy
// IfNeeded) and what it saw then.
type sidecarInjectors struct {
	image string
	mu    sync.Mutex
	calls map[string][]injectorCall
}

// injectorCall is what one call saw and did.
type injectorCall struct {
	// supervisor: the pod already had the sidecar-supervisor container.
	supervisor bool
	// injected names what the call added.
	injected []string
}

// Calls returns the calls for the pods of the Job with this UID.
func (h *sidecarInjectors) Calls(jobUID string) []injectorCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]injectorCall(nil), h.calls[jobUID]...)
}

func (h *sidecarInjectors) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	var pod corev1.Pod
	if err := json.Unmarshal(review.Request.Object.Raw, &pod); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Message: "decode pod: " + err.Error()}
	} else if patch, err := h.inject(&pod); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Message: err.Error()}
	} else if patch != nil {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	review.Response, review.Request = resp, nil
	out, err := json.Marshal(review)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// inject adds what each injector would to pod, and returns the JSON patch
// that makes the change (nil for none): each changed field replaced whole.
func (h *sidecarInjectors) inject(pod *corev1.Pod) ([]byte, error) {
	call := injectorCall{supervisor: hasContainer(pod.Spec.Containers, supervisorName)}
	before := pod.DeepCopy()
	if name, err := h.vault(pod); err != nil {
		return nil, err
	} else if name != "" {
		call.injected = append(call.injected, name)
	}
	if name := h.dapr(pod); name != "" {
		call.injected = append(call.injected, name)
	}
	if uid := pod.Labels["batch.kubernetes.io/controller-uid"]; uid != "" {
		h.mu.Lock()
		if h.calls == nil {
			h.calls = map[string][]injectorCall{}
		}
		h.calls[uid] = append(h.calls[uid], call)
		h.mu.Unlock()
	}
	if len(call.injected) == 0 {
		return nil, nil
	}
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	// "add" on a member that exists replaces it (RFC 6902, 4.1).
	ops := []op{
		{"add", "/metadata/annotations", pod.Annotations},
		{"add", "/spec/containers", pod.Spec.Containers},
	}
	if len(pod.Spec.InitContainers) != len(before.Spec.InitContainers) {
		ops = append(ops, op{"add", "/spec/initContainers", pod.Spec.InitContainers})
	}
	if len(pod.Spec.Volumes) != len(before.Spec.Volumes) {
		ops = append(ops, op{"add", "/spec/volumes", pod.Spec.Volumes})
	}
	return json.Marshal(ops)
}

func hasContainer(cs []corev1.Container, name string) bool {
	for _, c := range cs {
		if c.Name == name {
			return true
		}
	}
	return false
}

// vault-k8s's annotations and defaults.
const (
	vaultPrefix      = "vault.hashicorp.com/"
	vaultAgent       = "vault-agent"
	vaultAgentInit   = "vault-agent-init"
	vaultStatus      = vaultPrefix + "agent-inject-status"
	vaultEnableQuit  = vaultPrefix + "agent-enable-quit"
	vaultSecretsPath = "/vault/secrets"
	// vault-k8s's DefaultContainerArg: the agent's shell writes the
	// configuration out, then execs the agent (busybox's sh runs the last
	// command of -c in place of itself).
	vaultArg = "echo ${VAULT_CONFIG?} | base64 -d > /home/vault/config.json && vault agent -config=/home/vault/config.json"
)

// vault injects the Vault agent as vault-k8s would; it returns the
// sidecar's name, or "" when it injects nothing.
func (h *sidecarInjectors) vault(pod *corev1.Pod) (string, error) {
	a := pod.Annotations
	if on, _ := strconv.ParseBool(a[vaultPrefix+"agent-inject"]); !on || a[vaultStatus] == "injected" {
		return "", nil
	}
	port := cmp.Or(a[vaultPrefix+"agent-cache-listener-port"], "8200")
	// config.go newConfig: a listener (with a cache stanza) only where the
	// quit endpoint, the cache or persistence asks for one.
	cfg := map[string]any{
		"auto_auth":       map[string]any{"method": map[string]any{"type": "kubernetes", "config": map[string]any{"role": a[vaultPrefix+"role"]}}},
		"exit_after_auth": false,
		"pid_file":        "/home/vault/.pid",
		"vault":           map[string]any{"address": "https://vault.vault.svc:8200"},
	}
	if quit, _ := strconv.ParseBool(a[vaultEnableQuit]); quit {
		cfg["listener"] = []any{map[string]any{"type": "tcp", "address": "127.0.0.1:" + port, "tls_disable": true,
			"agent_api": map[string]any{"enable_quit": true}}}
		cfg["cache"] = map[string]any{}
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	// The secrets the pod asks for, rendered by the init container (the
	// real one authenticates and templates them; here: a stand-in value).
	var files []string
	for k, v := range a {
		if name, ok := strings.CutPrefix(k, vaultPrefix+"agent-inject-secret-"); ok {
			files = append(files, fmt.Sprintf("echo 'stand-in for %s' > %s/%s", v, vaultSecretsPath, name))
		}
	}
	security := &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](100), RunAsGroup: ptr.To[int64](1000), RunAsNonRoot: ptr.To(true),
		ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	secrets := corev1.VolumeMount{Name: "vault-secrets", MountPath: vaultSecretsPath}
	memory := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}
	resources := corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("10m"), "memory": resource.MustParse("16Mi")}}
	init := corev1.Container{
		Name: vaultAgentInit, Image: h.image, ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/bin/sh", "-ec"},
		Args:            []string{strings.Join(append(files, "true"), " && ")},
		SecurityContext: security, Resources: resources,
		VolumeMounts: []corev1.VolumeMount{{Name: "home-init", MountPath: "/home/vault"}, secrets},
	}
	sidecar := corev1.Container{
		Name: vaultAgent, Image: h.image, ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"/bin/sh", "-ec"},
		Args:    []string{vaultArg},
		Env: []corev1.EnvVar{
			{Name: "VAULT_CONFIG", Value: base64.StdEncoding.EncodeToString(js)},
			{Name: "VAULT_LOG_LEVEL", Value: "info"},
			{Name: "VAULT_LOG_FORMAT", Value: "standard"},
		},
		SecurityContext: security, Resources: resources,
		VolumeMounts: []corev1.VolumeMount{{Name: "home-sidecar", MountPath: "/home/vault"}, secrets},
	}
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].VolumeMounts = append(pod.Spec.Containers[i].VolumeMounts, secrets)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: "home-init", VolumeSource: memory},
		corev1.Volume{Name: "home-sidecar", VolumeSource: memory},
		corev1.Volume{Name: "vault-secrets", VolumeSource: memory})
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, init)
	pod.Spec.Containers = append(pod.Spec.Containers, sidecar)
	pod.Annotations[vaultStatus] = "injected"
	return vaultAgent, nil
}

// dapr injects daprd as Dapr's sidecar injector would; it returns the
// sidecar's name, or "" when it injects nothing.
func (h *sidecarInjectors) dapr(pod *corev1.Pod) string {
	a := pod.Annotations
	if on, _ := strconv.ParseBool(a["dapr.io/enabled"]); !on || hasContainer(pod.Spec.Containers, "daprd") {
		return ""
	}
	port := cmp.Or(a["dapr.io/http-port"], "3500")
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
		Name: "daprd", Image: h.image, ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"/daprd"},
		Args: []string{"--dapr-http-port", port, "--dapr-grpc-port", "50001", "--dapr-internal-grpc-port", "50002",
			"--dapr-listen-addresses", "[::1],127.0.0.1", "--dapr-public-port", "3501",
			"--app-id", a["dapr.io/app-id"], "--app-protocol", "http", "--mode", "kubernetes"},
		Env: []corev1.EnvVar{
			{Name: "NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		},
		// Dapr's image runs as nonroot (65532); this image has no user of
		// its own, so the pod says it.
		SecurityContext: &corev1.SecurityContext{
			RunAsUser: ptr.To[int64](65532), RunAsNonRoot: ptr.To(true),
			ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("10m"), "memory": resource.MustParse("16Mi")}},
	})
	return "daprd"
}
