package k8sjobs

import (
	"context"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

const (
	supervisorName = "sidecar-supervisor"
	proxyName      = injector.ProxyContainer
)

// env is what every case shares: the cluster, the images the injected pods
// must run, and Istio's injector serving the cluster.
type env struct {
	c               *cluster.Cluster
	supervisorImage string
	proxyImage      string
	hook            *injector.Served
	// cloudSQLImage builds and imports the cloud-sql-proxy image once, for
	// the cases that need it, and returns the name it runs under.
	cloudSQLImage func() (string, error)
}

// setUp starts (or joins) the cluster, builds and imports the supervisor and
// istio-proxy images, and registers Istio's injector, running in this
// process, as the API server's mutating webhook for the run's namespaces,
// under owner: TestJobs and TestAdmission run at once, each with its own.
func setUp(ctx context.Context, t *testing.T, owner string) *env {
	t.Helper()
	t0 := time.Now()
	c, err := cluster.Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{c: c}
	if e.supervisorImage, e.proxyImage, err = c.ProductImages(ctx); err != nil {
		t.Fatal(err)
	}
	e.cloudSQLImage = sync.OnceValues(func() (string, error) {
		_, alias, err := c.CloudSQLProxyImage(ctx)
		return alias, err
	})
	t.Logf("cluster and images ready in %s: supervisor %s, istio-proxy %s",
		time.Since(t0).Round(time.Second), e.supervisorImage, e.proxyImage)

	in, err := injector.ClusterInstall(e.proxyImage)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range in.Warnings {
		t.Logf("helm render warning: %s", w)
	}
	e.hook, err = injector.Serve(ctx, c.Client, in, owner, log.New(testWriter{t}, "injector: ", 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.hook.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("set up in %s; Istio's injector serves %s for namespaces labelled %s=%s",
		time.Since(t0).Round(time.Second), e.hook.URL, e.hook.Label, e.hook.Value)
	return e
}

// testWriter sends the HTTP server's own error log (TLS handshake errors,
// ...) to the test log while the test runs.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// namespace creates a namespace for one case (deleted at cleanup): under the
// injector, with the istio-ca-root-cert ConfigMap istiod would publish, and a
// dump of its pods, logs and events if the case fails. It returns once the
// API server sends the namespace's pods to the injector.
func (e *env) namespace(ctx context.Context, t *testing.T, prefix string) string {
	t.Helper()
	ns := e.c.Namespace(ctx, t, prefix)
	e.c.DumpOnFailure(t, ns, "")
	if err := e.hook.PrepareNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

func containerNames(cs []corev1.Container) []string {
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	return names
}

func findContainer(spec corev1.PodSpec, name string) *corev1.Container {
	return injector.Find(spec.Containers, name)
}
