package injector

import (
	istiolog "istio.io/istio/pkg/log"

	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"istio.io/istio/pilot/pkg/features"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/selfsigned"
)

// ProxyContainer is the name Istio's injector gives the sidecar.
const ProxyContainer = "istio-proxy"

// webhookOwnerLabel marks the MutatingWebhookConfigurations Serve registers,
// with the owner's name as its value, so that one left by a killed run is
// removed by the owner's next run.
const webhookOwnerLabel = "sidecar-supervisor-e2e/owner"

// ClusterInstall renders istiod's injector configuration as `helm install
// istiod istio/istiod -f deploy/istio/values-supervisor.yaml` would for the
// e2e cluster (e2e/cluster): the istio-proxy image built for it
// (proxyImage, HUB/IMAGE:TAG) and interceptionMode NONE, since that image
// has no iptables (e2e/k8sjobs's package comment says what NONE changes).
// It checks that the settings took.
func ClusterInstall(proxyImage string) (Install, error) {
	slash := strings.LastIndex(proxyImage, "/")
	colon := strings.LastIndex(proxyImage, ":")
	if slash < 0 || colon < slash {
		return Install{}, fmt.Errorf("istio-proxy image %q is not HUB/IMAGE:TAG", proxyImage)
	}
	hub, image, tag := proxyImage[:slash], proxyImage[slash+1:colon], proxyImage[colon+1:]
	in, err := RenderHelm(map[string]any{
		"global": map[string]any{
			"hub":   hub,
			"tag":   tag,
			"proxy": map[string]any{"image": image},
		},
		"meshConfig": map[string]any{
			"defaultConfig": map[string]any{"interceptionMode": "NONE"},
		},
	})
	if err != nil {
		return Install{}, err
	}
	if got := in.Mesh.GetDefaultConfig().GetInterceptionMode().String(); got != "NONE" {
		return Install{}, fmt.Errorf("rendered mesh config has interceptionMode %s, want NONE", got)
	}
	if got := in.Config.DefaultTemplates; len(got) != 2 || got[0] != "sidecar" || got[1] != "supervisor" {
		return Install{}, fmt.Errorf("rendered injector runs templates %v, want [sidecar supervisor]", got)
	}
	return in, nil
}

// Served is a mutating admission webhook serving a real API server (Istio's
// injector, as istiod does; or a test's own): over HTTPS on a loopback port
// of this host (where the e2e cluster's API server runs), registered as a
// MutatingWebhookConfiguration for the namespaces labelled Label=Value.
type Served struct {
	// URL is the webhook's address.
	URL string
	// Label and Value select the namespaces the API server sends to the
	// webhook; Value is unique to the run.
	Label, Value string
	// RootPEM is a throw-away self-signed root, published in each namespace
	// as the istio-ca-root-cert ConfigMap istiod would publish (istio-proxy
	// mounts it; no istiod runs and nothing is ever signed with it).
	RootPEM []byte

	client kubernetes.Interface
	config string
	srv    *http.Server
	done   chan error
}

// Serve serves Istio's injection webhook with the installation in, and
// registers it for the namespaces PrepareNamespace prepares. owner names the
// caller ("k8sjobs"): configurations a killed run of the same owner left are
// removed first. It also sets istiod's ENABLE_NATIVE_SIDECARS to false for
// this process (see e2e/k8sjobs's package comment): istio-proxy is a classic
// sidecar unless a pod asks otherwise (sidecar.istio.io/nativeSidecar).
// errorLog gets the HTTP server's own errors (TLS handshakes, ...). Close
// undoes it all.
func Serve(ctx context.Context, client kubernetes.Interface, in Install, owner string, errorLog *log.Logger) (*Served, error) {
	// istiod reads the flag for each pod it injects; this process is that
	// istiod.
	features.EnableNativeSidecars = features.NativeSidecarModeDisabled
	hook, err := NewWebhook(in, nil)
	if err != nil {
		return nil, err
	}
	// As istiod's chart registers its own: reinvocationPolicy Never, pods
	// labelled sidecar.istio.io/inject=false left out.
	return ServeWebhook(ctx, client, hook, Registration{
		Owner:              owner,
		Name:               "sidecar-injector",
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "sidecar.istio.io/inject", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"false"},
		}}},
	}, errorLog)
}

// Registration is how a webhook served by ServeWebhook is registered: for
// pods, CREATE, failurePolicy Fail, no side effects, in the namespaces
// labelled with the Served's Label and Value only.
type Registration struct {
	// Owner names the caller (configurations a killed run of the same
	// owner left are removed); Name the webhook within it.
	Owner, Name        string
	ReinvocationPolicy admissionregistrationv1.ReinvocationPolicyType
	ObjectSelector     *metav1.LabelSelector
}

// ServeWebhook serves the mutating admission webhook h over HTTPS on a
// loopback port and registers it with the API server as reg says. Close
// undoes it.
func ServeWebhook(ctx context.Context, client kubernetes.Interface, h http.Handler, reg Registration, errorLog *log.Logger) (*Served, error) {
	id := make([]byte, 6)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	s := &Served{
		Label:  "sidecar-supervisor-e2e/" + reg.Owner + "-" + reg.Name,
		Value:  hex.EncodeToString(id),
		client: client,
		done:   make(chan error, 1),
	}
	var err error
	if s.RootPEM, err = selfsigned.PEM("sidecar-supervisor e2e istio root", nil); err != nil {
		return nil, err
	}
	caPEM, err := s.listen(h, errorLog)
	if err != nil {
		return nil, err
	}
	if err := s.register(ctx, reg, caPEM); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// listen serves h with a throw-away self-signed certificate, returned as the
// webhook's caBundle.
func (s *Served) listen(h http.Handler, errorLog *log.Logger) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	certPEM, err := selfsigned.PEM("sidecar-supervisor e2e injector", key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.srv = &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          errorLog,
	}
	go func() { s.done <- s.srv.ServeTLS(ln, "", "") }()
	s.URL = "https://" + ln.Addr().String() + "/inject"
	return certPEM, nil
}

// register registers the webhook as reg says, for the namespaces labelled
// with this run's value only.
func (s *Served) register(ctx context.Context, reg Registration, caPEM []byte) error {
	api := s.client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	owner := reg.Owner + "-" + reg.Name
	// A configuration left by a killed run points at a dead port; it selects
	// only that run's namespaces, but goes all the same.
	if err := api.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
		LabelSelector: webhookOwnerLabel + "=" + owner,
	}); err != nil {
		return fmt.Errorf("remove old webhook configurations: %w", err)
	}
	fail := admissionregistrationv1.Fail
	reinvocation := reg.ReinvocationPolicy
	none := admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "sidecar-supervisor-e2e-" + owner + "-" + s.Value,
			Labels: map[string]string{webhookOwnerLabel: owner},
		},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         reg.Name + "." + reg.Owner + ".sidecar-supervisor.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &s.URL, CABundle: caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
				},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{s.Label: s.Value}},
			ObjectSelector:          reg.ObjectSelector,
			FailurePolicy:           &fail,
			ReinvocationPolicy:      &reinvocation,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	if _, err := api.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("register the webhook %s: %w", cfg.Name, err)
	}
	s.config = cfg.Name
	return nil
}

// Close removes the webhook's registration and stops serving it.
func (s *Served) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if s.config != "" {
		err := s.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, s.config, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove the injection webhook: %w", err))
		}
	}
	_ = s.srv.Shutdown(ctx)
	if err := <-s.done; !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("injector server: %w", err))
	}
	return errors.Join(errs...)
}

// PrepareNamespace puts the namespace ns under Istio's injector (the run's
// label) and gives it the istio-ca-root-cert ConfigMap. It returns once the
// API server sends the namespace's pods to the injector.
func (s *Served) PrepareNamespace(ctx context.Context, ns string) error {
	if _, err := s.client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"},
		Data:       map[string]string{"root-cert.pem": string(s.RootPEM)},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create istio-ca-root-cert in %s: %w", ns, err)
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "injection-probe-", Labels: map[string]string{"sidecar.istio.io/inject": "true"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "app", Image: "busybox", Command: []string{"true"}}},
		},
	}
	return s.Select(ctx, ns, probe, func(p *corev1.Pod) bool { return HasContainer(p.Spec, ProxyContainer) })
}

// Select puts the namespace ns under the webhook (the run's label) and
// returns once the API server sends it the namespace's pods: probe, created
// as a dry run, comes back as served says the webhook makes it. The API
// server loads webhook configurations and namespace labels through
// informers, so both take effect a moment after they are written.
func (s *Served) Select(ctx context.Context, ns string, probe *corev1.Pod, served func(*corev1.Pod) bool) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, s.Label, s.Value)
	if _, err := s.client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label namespace %s: %w", ns, err)
	}
	return WaitDryRun(ctx, s.client, ns, probe, served)
}

// WaitDryRun creates probe in ns as a dry run (admission runs, nothing is
// stored, no image is needed) until the pod the API server would store
// satisfies ok, for at most 2 minutes: what admission configuration written
// moments ago needs to take effect.
func WaitDryRun(ctx context.Context, client kubernetes.Interface, ns string, probe *corev1.Pod, ok func(*corev1.Pod) bool) error {
	var last string
	// A hang guard: every case of k8sjobs prepares its namespace at once.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := client.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if ok(got) {
			return true, nil
		}
		var names []string
		for _, c := range got.Spec.Containers {
			names = append(names, c.Name)
		}
		last = fmt.Sprintf("containers %v", names)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("pods in %s not admitted as expected within 2m (last: %s): %w", ns, last, err)
	}
	return nil
}

// HasContainer reports whether spec has a (regular) container named name.
func HasContainer(spec corev1.PodSpec, name string) bool { return Find(spec.Containers, name) != nil }

// Find returns the container called name in cs, in place (so that a test
// may change it), or nil.
func Find(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// LogToStderr sends the log of Istio's packages (the injector), which
// goes to stdout by default, to stderr: for a program whose stdout
// carries its report.
func LogToStderr() error {
	lo := istiolog.DefaultOptions()
	lo.OutputPaths = []string{"stderr"}
	return istiolog.Configure(lo)
}
