// Package inject checks, without a cluster, every way the repository ships to
// put sidecar-supervisor into a pod (see deploy/README.md):
//
//   - the hand-written manifests deploy/*.yaml;
//   - the "supervisor" injection template (deploy/istio), rendered by Istio's
//     own injector (istio.io/istio/pkg/kube/inject) after Istio's default
//     "sidecar" template, both as istiod's admission webhook and as
//     istioctl kube-inject, with the injector configuration produced by
//     Istio's own charts from our Helm values file and IstioOperator overlay;
//   - the kustomize component deploy/kustomize/supervisor, built with
//     kustomize's Go API.
//
// Every result is decoded strictly into the Kubernetes API types and checked
// for the same structure: the supervisor present or absent as it should be,
// after the app containers, with a shared PID namespace and the right
// environment. The package has only tests.
package inject
