// Package inject checks, without a cluster, every way the repository ships to
// put sidecar-supervisor into a pod (see deploy/README.md): the hand-written
// manifests deploy/*.yaml; the "supervisor" injection template deploy/istio,
// rendered by Istio's own injector after its "sidecar" template (as istiod's
// webhook and as istioctl kube-inject, configured by Istio's own charts from
// our values) and as every istiod release from 1.20 would execute it; the
// kustomize components deploy/kustomize, built with kustomize's Go API; and
// the MutatingAdmissionPolicy deploy/admission, run by the API server's own
// code, its webhook-added sidecars seen on its second run.
//
// Every result decodes strictly into the Kubernetes API types and gets the
// same checks (checkSupervised, whose checks say why each rule holds). The
// tests live here; package injector holds what the real-cluster tests share
// with them.
package inject
