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
// Every result is decoded strictly into the Kubernetes API types and checked
// for the same structure: for Jobs, the supervisor present or absent as it
// should be, in the shape it should have (a regular container, or a native
// sidecar: an init container with restartPolicy Always and its startup
// probe), placed as it should be (first, with SUPERVISOR_AFTER_APPS
// naming istio-proxy, where the injection template puts istio-proxy last;
// otherwise after the app containers; native, after the pod's own init
// containers), with a shared PID namespace, its state volume and the right
// environment, and nothing the API server's validation would refuse; for
// Deployments and other restartPolicy Always pods, the hold (the install
// init container, its volume, istio-proxy's preStop hook, mount and
// SUPERVISOR_HOLD_TIMEOUT, a shared PID namespace) present or absent as it
// should be, and never in place of a preStop hook istio-proxy already has. The tests live here; package injector holds what the
// real-cluster tests share with them.
package inject
