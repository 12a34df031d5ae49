// Package inject checks, without a cluster, every way the repository ships to
// put sidecar-supervisor into a pod (see deploy/README.md):
//
//   - the hand-written manifests deploy/*.yaml (Jobs, among them
//     job-native.yaml with the supervisor as a native sidecar, a CronJob, a
//     Deployment with the hold);
//   - the "supervisor" injection template (deploy/istio), rendered by Istio's
//     own injector (istio.io/istio/pkg/kube/inject) after Istio's default
//     "sidecar" template, both as istiod's admission webhook and as
//     istioctl kube-inject, with the injector configuration produced by
//     Istio's own charts from our Helm values file and IstioOperator overlay;
//   - the kustomize components deploy/kustomize/supervisor (Jobs, CronJobs)
//     and deploy/kustomize/hold (Deployments, StatefulSets, DaemonSets),
//     built with kustomize's Go API;
//   - the MutatingAdmissionPolicy deploy/admission, compiled and run by the
//     API server's own code (k8s.io/apiserver's CEL compiler, matcher and
//     JSON patcher), its webhook-added sidecars seen on its second run.
//
// Every result is decoded strictly into the Kubernetes API types and
// checked for the same structure (checkSupervised and the checks it calls,
// which say why each rule holds): the supervisor, or for restartPolicy
// Always pods the hold, present or absent as it should be, in the shape and
// place it should have, never in place of a preStop hook istio-proxy already
// has, and nothing the API server's validation would refuse. The tests live
// here; package injector holds what the real-cluster tests share with them.
package inject
