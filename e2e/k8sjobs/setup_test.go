package k8sjobs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"istio.io/istio/pilot/pkg/features"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

const (
	supervisorName = "sidecar-supervisor"
	proxyName      = "istio-proxy"
	// webhookOwnerLabel marks the MutatingWebhookConfigurations this package
	// registers, so that one left by a killed run is removed by the next.
	webhookOwnerLabel = "sidecar-supervisor-e2e/owner"
	webhookOwner      = "k8sjobs"
	// injectionLabel selects the namespaces the webhook injects; its value is
	// unique to the run.
	injectionLabel = "sidecar-supervisor-e2e/k8sjobs-injection"
)

// env is what every case shares: the cluster, the images the injected pods
// must run, and the label that puts a namespace under the injector.
type env struct {
	c               *cluster.Cluster
	supervisorImage string
	proxyImage      string
	runID           string
	rootPEM         []byte
}

// setUp starts (or joins) the cluster, builds and imports the supervisor and
// istio-proxy images, and registers Istio's injector, running in this
// process, as the API server's mutating webhook for the run's namespaces.
func setUp(ctx context.Context, t *testing.T) *env {
	t.Helper()
	t0 := time.Now()
	c, err := cluster.Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{c: c}
	for _, b := range []struct {
		build func(context.Context) (cluster.Image, error)
		ref   *string
	}{
		{c.BuildSupervisorImage, &e.supervisorImage},
		{c.BuildIstioProxyImage, &e.proxyImage},
	} {
		img, err := b.build(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if img.Ref == "" || img.Archive == "" {
			t.Fatalf("image build printed no reference or archive: %+v", img)
		}
		if err := c.ImportImage(ctx, img.Archive); err != nil {
			t.Fatal(err)
		}
		*b.ref = img.Ref
	}
	t.Logf("cluster and images ready in %s: supervisor %s, istio-proxy %s",
		time.Since(t0).Round(time.Second), e.supervisorImage, e.proxyImage)

	in := renderInjector(t, e.proxyImage)
	// istiod's ENABLE_NATIVE_SIDECARS (see the package comment). The flag is
	// read once at istiod's start; this process is that istiod.
	features.EnableNativeSidecars = features.NativeSidecarModeDisabled
	hook, err := injector.NewWebhook(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	url, caPEM := serveTLS(t, hook)
	id := make([]byte, 6)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	e.runID = hex.EncodeToString(id)
	registerWebhook(ctx, t, c, url, caPEM, e.runID)
	if e.rootPEM, err = selfSignedPEM("sidecar-supervisor e2e istio root", nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("set up in %s; Istio's injector serves %s for namespaces labelled %s=%s",
		time.Since(t0).Round(time.Second), url, injectionLabel, e.runID)
	return e
}

// renderInjector renders istiod's injector configuration from Istio's chart
// with deploy/istio/values-supervisor.yaml and this cluster's settings, and
// checks that they took.
func renderInjector(t *testing.T, proxyRef string) injector.Install {
	t.Helper()
	slash := strings.LastIndex(proxyRef, "/")
	colon := strings.LastIndex(proxyRef, ":")
	if slash < 0 || colon < slash {
		t.Fatalf("istio-proxy image %q is not HUB/IMAGE:TAG", proxyRef)
	}
	hub, image, tag := proxyRef[:slash], proxyRef[slash+1:colon], proxyRef[colon+1:]
	in, err := injector.RenderHelm(map[string]any{
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
		t.Fatal(err)
	}
	for _, w := range in.Warnings {
		t.Logf("helm render warning: %s", w)
	}
	if got := in.Mesh.GetDefaultConfig().GetInterceptionMode().String(); got != "NONE" {
		t.Fatalf("rendered mesh config has interceptionMode %s, want NONE", got)
	}
	if got := in.Config.DefaultTemplates; len(got) != 2 || got[0] != "sidecar" || got[1] != "supervisor" {
		t.Fatalf("rendered injector runs templates %v, want [sidecar supervisor]", got)
	}
	return in
}

// serveTLS serves h over HTTPS on a loopback port (the API server runs on
// this host's loopback too) with a throw-away self-signed certificate, and
// returns the webhook URL and the certificate as the caBundle.
func serveTLS(t *testing.T, h http.Handler) (url string, caPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := selfSignedPEM("sidecar-supervisor e2e injector", key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(testWriter{t}, "injector: ", 0),
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("injector server: %v", err)
		}
	})
	return "https://" + ln.Addr().String() + "/inject", certPEM
}

// testWriter sends the HTTP server's own error log (TLS handshake errors,
// ...) to the test log while the test runs.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// selfSignedPEM makes a self-signed certificate valid for a day, for
// 127.0.0.1 and as a CA; with a nil key it makes one of its own (the key is
// then thrown away: the istio root is only ever read, never signs).
func selfSignedPEM(cn string, key *ecdsa.PrivateKey) ([]byte, error) {
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, err
		}
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"sidecar-supervisor e2e"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// registerWebhook registers the injector as istiod's chart registers its own
// (pods, CREATE, failurePolicy Fail, reinvocationPolicy Never, no side
// effects, pods labelled sidecar.istio.io/inject=false left out), for the
// namespaces labelled with this run's ID only, and removes it at cleanup.
func registerWebhook(ctx context.Context, t *testing.T, c *cluster.Cluster, url string, caPEM []byte, runID string) {
	t.Helper()
	api := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	// A configuration left by a killed run points at a dead port; it selects
	// only that run's namespaces, but goes all the same.
	if err := api.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
		LabelSelector: webhookOwnerLabel + "=" + webhookOwner,
	}); err != nil {
		t.Fatalf("remove old webhook configurations: %v", err)
	}
	fail := admissionregistrationv1.Fail
	never := admissionregistrationv1.NeverReinvocationPolicy
	none := admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "sidecar-supervisor-e2e-k8sjobs-" + runID,
			Labels: map[string]string{webhookOwnerLabel: webhookOwner},
		},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "sidecar-injector.k8sjobs.sidecar-supervisor.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
				},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{injectionLabel: runID}},
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "sidecar.istio.io/inject", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"false"},
			}}},
			FailurePolicy:           &fail,
			ReinvocationPolicy:      &never,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	if _, err := api.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register the injection webhook: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := api.Delete(ctx, cfg.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("remove the injection webhook: %v", err)
		}
	})
}

// namespace creates a namespace for one case (deleted at cleanup): under the
// injector, with the istio-ca-root-cert ConfigMap istiod would publish, and a
// dump of its pods, logs and events if the case fails. It returns once the
// API server sends the namespace's pods to the injector.
func (e *env) namespace(ctx context.Context, t *testing.T, prefix string) string {
	t.Helper()
	ns := e.c.Namespace(ctx, t, prefix)
	e.c.DumpOnFailure(t, ns, "")
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, injectionLabel, e.runID)
	if _, err := e.c.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label namespace %s: %v", ns, err)
	}
	if _, err := e.c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"},
		Data:       map[string]string{"root-cert.pem": string(e.rootPEM)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create istio-ca-root-cert in %s: %v", ns, err)
	}
	e.waitInjecting(ctx, t, ns)
	return ns
}

// waitInjecting waits until a pod created in ns (as a dry run: admission
// webhooks run, nothing is stored) comes back with istio-proxy: the API server
// loads webhook configurations and namespace labels through informers, so
// both take effect a moment after they are written.
func (e *env) waitInjecting(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "injection-probe-", Labels: map[string]string{"sidecar.istio.io/inject": "true"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "app", Image: cluster.BusyboxImage, Command: []string{"true"}}},
		},
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := e.c.Client.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("containers %v", containerNames(got.Spec.Containers))
		return findContainer(got.Spec, proxyName) != nil, nil
	})
	if err != nil {
		t.Fatalf("pods in %s not injected within 30s (last: %s): %v", ns, last, err)
	}
}

func containerNames(cs []corev1.Container) []string {
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	return names
}

func findContainer(spec corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}
