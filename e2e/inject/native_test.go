package inject

import (
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"istio.io/istio/pilot/pkg/features"
)

// The supervisor's native shape (shape_test.go says what it is): chosen by
// the pod's supervisor.sidecar-supervisor.io/shape, else istiod's
// SIDECAR_SUPERVISOR_SHAPE, else where istiod makes native sidecars itself
// (.NativeSidecars, ENABLE_NATIVE_SIDECARS=true), else never.

const shapeAnnotation = annotationPrefix + "shape"

// nativeEnv is supervisorEnv for the native shape.
func nativeEnv(restart, apps string, extra ...string) map[string]string {
	return supervisorEnv(restart, apps, append([]string{shapeVar, "native"}, extra...)...)
}

// nativeSupervised is a pod with the native supervisor after the pod's own
// init containers (inits) and before istio-init, the apps, then istio-proxy.
func nativeSupervised(inits []string, env map[string]string, apps ...string) podShape {
	return podShape{
		InitContainers:        slices.Concat(inits, []string{supervisorName, "istio-init"}),
		Containers:            append(slices.Clone(apps), proxyName),
		ShareProcessNamespace: true,
		SupervisorEnv:         env,
		SupervisorUser:        "1337",
	}
}

// containerSupervised is a one-app Job with the supervisor as a container,
// as the template makes it by default.
func containerSupervised() podShape { return supervised(supervisorEnv("Never", "app"), "app") }

// nativeJob is a one-app Job with the native supervisor, as the template
// makes it.
func nativeJob() podShape { return nativeSupervised(nil, nativeEnv("Never", "app"), "app") }

// nativeProxyFirst is a one-app Job with the native supervisor where
// holdApplicationUntilProxyStarts puts istio-proxy first: istio-proxy starts
// before the apps, nothing marks the kubelet's passing of them, so the look
// is long (SUPERVISOR_APP_START_TIMEOUT: look).
func nativeProxyFirst(look string) podShape {
	s := withPostStart(nativeJob(), "pilot-agent", "wait")
	s.SupervisorEnv = withoutAfterApps(nativeEnv("Never", "app", "SUPERVISOR_APP_START_TIMEOUT", look))
	s.Containers = []string{proxyName, "app"}
	return s
}

// withInits is s with these init containers.
func withInits(s podShape, inits ...string) podShape {
	s.InitContainers = inits
	return s
}

// shapeJob is a one-app Job "sleep" with the shape annotation and further
// pod annotations (name, value...).
func shapeJob(shape string, kv ...string) *batchv1.Job {
	return job("sleep", corev1.RestartPolicyNever, setPairs(map[string]string{shapeAnnotation: shape}, kv...), "app")
}

func nativeCases(t *testing.T) []injectCase {
	var handWritten batchv1.Job
	decodeStrict(t, readDeploy(t, "job-native.yaml"), &handWritten)
	handWritten.Namespace = namespace

	const proxyConfig, holdConfig = "proxy.istio.io/config", `{"holdApplicationUntilProxyStarts": true}`
	optOut := func(kv ...string) *batchv1.Job {
		return job("classic", corev1.RestartPolicyNever, setPairs(map[string]string{"sidecar.istio.io/nativeSidecar": "false"}, kv...), "app")
	}
	return []injectCase{
		{name: "native shape by pod annotation", in: shapeJob("native"), want: nativeJob()},
		{name: "native shape: after the pod's own init containers, istio-init last", in: edit(shapeJob("native"), withMigrate),
			want: nativeSupervised([]string{"migrate"}, nativeEnv("Never", "app"), "app")},
		// (A Job: kube-inject reads a CronJob's annotations from its
		// jobTemplate, not from the pod template.)
		{name: "native shape, restartPolicy OnFailure, two apps",
			in:   job("native-retry", corev1.RestartPolicyOnFailure, map[string]string{shapeAnnotation: "native"}, "app", "uploader"),
			want: nativeSupervised(nil, nativeEnv("OnFailure", "app,uploader"), "app", "uploader")},
		{name: "native shape with holdApplicationUntilProxyStarts: istio-proxy first, the look 1h",
			in: shapeJob("native", proxyConfig, holdConfig), want: nativeProxyFirst("1h")},
		{name: "native shape with holdApplicationUntilProxyStarts: app-start-timeout annotation wins",
			in: shapeJob("native", proxyConfig, holdConfig, annotationPrefix+"app-start-timeout", "10m"), want: nativeProxyFirst("10m")},
		{name: "native shape, exit-status ptrace: root with SYS_PTRACE and KILL", ptrace: true,
			in: shapeJob("native", annotationPrefix+"exit-status", "ptrace"), want: asRoot(nativeSupervised(nil, nativeEnv("Never", "app", "SUPERVISOR_EXIT_STATUS", "ptrace"), "app"))},
		{name: "native shape, interceptionMode NONE: no istio-init, the supervisor alone",
			in: shapeJob("native", "sidecar.istio.io/interceptionMode", "NONE"), want: withInits(nativeJob(), supervisorName)},
		// The default from a fact: istiod makes native sidecars, so every
		// kubelet runs them; this pod opted out of Istio's.
		{name: "native sidecars mesh-wide, pod opts out: the supervisor native", in: optOut(), nativeSidecars: true, want: nativeJob()},
		{name: "native sidecars mesh-wide, pod opts out, shape container: a container",
			in: optOut(shapeAnnotation, "container"), nativeSidecars: true, want: containerSupervised()},
		// Only "native" asks for the shape that needs new kubelets.
		{name: "shape annotation other than native: a container", in: shapeJob("Native"), want: containerSupervised()},
		{name: "shape native, istio-proxy native too: nothing", in: shapeJob("native", "sidecar.istio.io/nativeSidecar", "true"), want: native("app")},
		// The template sees the supervisor among the init containers and
		// adds nothing; Istio puts istio-init after it.
		{name: "hand-written deploy/job-native.yaml keeps its own supervisor", in: &handWritten,
			want: nativeSupervised(nil, nativeEnv("Never", "app", "SUPERVISOR_ON_FAILURE", "SIGKILL",
				"SUPERVISOR_STOP_TIMEOUT", "30s", "SUPERVISOR_EXIT_STATUS", "auto"), "app")},
		{name: "shape native on a deployment: the hold, as without it",
			in: annotate(deployment("web", "web"), shapeAnnotation, "native"), want: held("20s")},
		// A standby: the supervisor twice, the second right after the
		// first (checkStandby), in either shape and either order.
		{name: "standby by pod annotation", in: shapeJob("container", standbyAnnotation, "true"), want: withStandby(containerSupervised())},
		{name: "standby, native shape", in: shapeJob("native", standbyAnnotation, "true"), want: withStandby(nativeJob())},
		{name: "standby with holdApplicationUntilProxyStarts: both after the app",
			in: shapeJob("container", standbyAnnotation, "true", proxyConfig, holdConfig), want: withStandby(proxyFirstJob())},
		{name: "standby annotation other than true: none", in: shapeJob("container", standbyAnnotation, "yes"), want: containerSupervised()},
	}
}

// standbyAnnotation asks for a standby supervisor.
const standbyAnnotation = annotationPrefix + "standby"

// withStandby is s with the standby supervisor right after the supervisor.
func withStandby(s podShape) podShape {
	for _, l := range []*[]string{&s.Containers, &s.InitContainers} {
		if i := slices.Index(*l, supervisorName); i >= 0 {
			*l = slices.Insert(slices.Clone(*l), i+1, standbyName)
		}
	}
	return s
}

// nativeValuesCases are the mesh-wide switch, SIDECAR_SUPERVISOR_SHAPE in
// istiod's pilot.env, and the native shape beside Istio's CNI.
func nativeValuesCases() []injectCase {
	return []injectCase{
		{name: "pilot.env.SIDECAR_SUPERVISOR_SHAPE native: native mesh-wide", values: pilotEnv("SIDECAR_SUPERVISOR_SHAPE", "native"),
			in: job("sleep", corev1.RestartPolicyNever, nil, "app"), want: nativeJob()},
		{name: "pilot.env.SIDECAR_SUPERVISOR_SHAPE native, pod shape container: a container", values: pilotEnv("SIDECAR_SUPERVISOR_SHAPE", "native"),
			in: shapeJob("container"), want: containerSupervised()},
		{name: "pilot.env.SIDECAR_SUPERVISOR_SHAPE container, pod shape native: native", values: pilotEnv("SIDECAR_SUPERVISOR_SHAPE", "container"),
			in: shapeJob("native"), want: nativeJob()},
		{name: "pilot.cni.enabled, native: istio-validation first, the pod's, then the supervisor", values: cniValues,
			in: edit(shapeJob("native"), withMigrate), want: withInits(nativeJob(), "istio-validation", "migrate", supervisorName)},
		{name: "global.proxy.holdApplicationUntilProxyStarts, native: istio-proxy first, the look 1h", values: proxyFirstValues,
			in: shapeJob("native"), want: nativeProxyFirst("1h")},
		{name: "pilot.env.SIDECAR_SUPERVISOR_STANDBY true: a standby mesh-wide", values: pilotEnv("SIDECAR_SUPERVISOR_STANDBY", "true"),
			in: job("sleep", corev1.RestartPolicyNever, nil, "app"), want: withStandby(containerSupervised())},
		{name: "pilot.env.SIDECAR_SUPERVISOR_STANDBY true, pod standby false: none", values: pilotEnv("SIDECAR_SUPERVISOR_STANDBY", "true"),
			in: shapeJob("container", standbyAnnotation, "false"), want: containerSupervised()},
	}
}

// TestNativeSidecarAutoDetection: under istiod's default,
// ENABLE_NATIVE_SIDECARS=auto, with one Node, istio-proxy is native once
// every kubelet is 1.33 or newer, and then neither the supervisor nor the
// hold is added; a Job that opts out of Istio's native sidecar gets the
// supervisor native from 1.33, the fact istiod found for its own.
func TestNativeSidecarAutoDetection(t *testing.T) {
	setNativeSidecarMode(t, features.NativeSidecarModeAuto)
	in := installs(t)[0]
	plain := job("auto", corev1.RestartPolicyNever, nil, "app")
	optedOut := job("opted-out", corev1.RestartPolicyNever, map[string]string{"sidecar.istio.io/nativeSidecar": "false"}, "app")
	for _, tc := range []struct {
		name, kubelet string
		obj           runtime.Object
		want          podShape
	}{
		{"job", "v1.32.9", plain, containerSupervised()},
		{"job", "v1.37.2", plain, native("app")},
		{"deployment", "v1.32.9", deployment("web", "web"), held("20s")},
		{"deployment", "v1.37.2", deployment("web", "web"), native("web")},
		{"job opted out", "v1.32.9", optedOut, containerSupervised()},
		{"job opted out", "v1.33.0", optedOut, nativeJob()},
		{"job opted out", "v1.37.2", optedOut, nativeJob()},
	} {
		t.Run(tc.name+"/kubelet "+tc.kubelet, func(t *testing.T) {
			pod := admit(t, webhookWithNode(t, in, tc.kubelet), podFor(tc.obj.DeepCopyObject()))
			checkSupervised(t, pod.Spec, tc.want, wantBasics(false), true, "injected pod", dump(pod))
		})
	}
}
