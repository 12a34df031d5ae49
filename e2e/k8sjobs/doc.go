// Package k8sjobs proves the product on a real Kubernetes: Jobs and CronJobs
// whose pods get istio-proxy and sidecar-supervisor from Istio's own injector
// complete on the one-node cluster of e2e/cluster. The package has only tests.
//
// How the pods are injected: the test process serves Istio's injection
// webhook (istio.io/istio/pkg/kube/inject, from the module pinned in
// e2e/go.mod, set up by e2e/inject/injector) over HTTPS on 127.0.0.1, and
// registers it with the real kube-apiserver as a MutatingWebhookConfiguration
// for the test's namespaces. The Job and CronJob controllers create the pods;
// the API server sends each one to the webhook, as it would to istiod. The
// webhook's configuration is what `helm install istiod -f
// deploy/istio/values-supervisor.yaml` renders from Istio's own chart (Istio's
// "sidecar" template unchanged, then our "supervisor" template), plus the
// settings of this cluster:
//
//   - global.hub/global.tag (and proxy.image): the istio-proxy image built
//     locally (real pilot-agent, stand-in envoy), as e2e/cluster names it;
//   - the supervisor image is the template's default,
//     ghcr.io/sidecar-supervisor/sidecar-supervisor:v0.1.0, built from the
//     repository's Dockerfile and imported into the node under that name;
//   - meshConfig.defaultConfig.interceptionMode NONE: no istio-init. Traffic
//     interception is iptables set up by an init container before any app
//     container starts; the proxy image here has no iptables and the stand-in
//     envoy proxies nothing. NONE changes only that: no init container, and
//     ISTIO_META_INTERCEPTION_MODE in istio-proxy's environment. istio-proxy
//     still runs as uid 1337 with no capabilities, exactly as under the
//     default REDIRECT mode (only TPROXY would make it root), so the
//     processes, uids, signals and exit codes the supervisor deals with are
//     the ones of a production pod. The CNI alternative (pilot.cni.enabled)
//     would add an istio-validation init container that fails without Istio's
//     CNI plugin;
//   - ENABLE_NATIVE_SIDECARS=false (istiod's feature flag, set in this
//     process): under the default "auto", istiod makes istio-proxy a native
//     sidecar on kubelets >= 1.33, such as this 1.37 node, and our template
//     then (correctly) adds nothing. The supervisor is for the classic
//     sidecar, which is what clusters with native sidecars turned off, older
//     kubelets and older Istio versions run.
//
// Every namespace gets the istio-ca-root-cert ConfigMap istiod would publish
// (a throw-away self-signed root): istio-proxy mounts it. No istiod runs;
// pilot-agent retries it forever and the stand-in envoy makes it ready.
//
// TestAdmission runs deploy/admission's MutatingAdmissionPolicy, bound to
// its own namespaces only, with a second webhook served the same way: the
// tests' own vault-k8s- and Dapr-shaped sidecar injectors
// (injectors_test.go), whose sidecars are podsim's stand-ins
// (e2e/images/standins). On a 1.34 or 1.35 cluster
// (SUPERVISOR_E2E_KUBERNETES_VERSION) it takes the policy's v1beta1 copy.
package k8sjobs
