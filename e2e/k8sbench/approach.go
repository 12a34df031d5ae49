package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

const (
	appName        = "app"
	supervisorName = "sidecar-supervisor"
	proxyName      = injector.ProxyContainer
	// supervisorPrefix is the injection template's annotation prefix.
	supervisorPrefix = "supervisor.sidecar-supervisor.io/"
	// quitURL is pilot-agent's quit endpoint on its status port (Istio's
	// default, 15020); only loopback POSTs are accepted.
	quitURL = "http://127.0.0.1:15020/quitquitquit"
	// stamp prints the app's exit time: busybox's date has no %N here, and
	// adjtimex(2) (read-only, no privilege needed) gives the time with
	// nanoseconds (status STA_NANO) or microseconds.
	stamp = "adjtimex"
)

// shape is how the pods of an approach must come out of Istio's injector.
type shape int

const (
	// classic: istio-proxy among the containers, no supervisor.
	classic shape = iota
	// native: istio-proxy an init container with restartPolicy Always, and
	// our template kept out (no supervisor anywhere).
	native
	// supervised: the template added the supervisor before the app
	// (istio-proxy last).
	supervised
	// supervisedNative: the template added the supervisor as a native
	// sidecar (an init container with restartPolicy Always), istio-proxy
	// last.
	supervisedNative
)

// hasSupervisor: the pod has our supervisor, in either shape.
func (s shape) hasSupervisor() bool { return s == supervised || s == supervisedNative }

// approach is one way of getting the same Job to complete.
type approach struct {
	key   string // Job name prefix
	title string // the table's row; %s takes the supervisor's success action
	// script is the app container's shell script (default: the app), or
	// argv if direct.
	script string
	argv   []string
	// restart is the pod's restartPolicy (default: Never).
	restart     corev1.RestartPolicy
	annotations map[string]string
	// sharePID: shareProcessNamespace set by the Job itself (the template
	// sets it for the supervisor).
	sharePID bool
	shape    shape
	// onSuccess is the SUPERVISOR_ON_SUCCESS the supervisor must get ("":
	// whatever the template gives, shown in the title).
	onSuccess string
	// istio: istio-proxy runs the stand-in that follows this Istio
	// release's pilot-agent (e2e/cmd/podsim/pilotagent.go, in the
	// istio-proxy image) in place of the real, newest one: the releases
	// whose quit and drain differ, which cannot be built here.
	istio string
}

// standInDrain is the stand-in's drain: Istio's default
// terminationDrainDuration.
const standInDrain = "5s"

// approaches builds the rows for an app that works for appSeconds.
func approaches(appSeconds int) []approach {
	// The app: the same busybox work every time, stamping its own end. The
	// shell exits right after the stamp (microseconds).
	app := fmt.Sprintf("echo working; sleep %d; %s", appSeconds, stamp)
	noSupervisor := map[string]string{supervisorPrefix + "inject": "false"}
	all := []approach{{
		key:         "native",
		title:       "istio-proxy as a native sidecar (`sidecar.istio.io/nativeSidecar: \"true\"`): the kubelet stops it after the app",
		annotations: map[string]string{"sidecar.istio.io/nativeSidecar": "true"},
		shape:       native,
	}, {
		key: "wrap-kill",
		// The seed's `pkill -15 pilot-agent`: Debian's busybox has no
		// pkill; killall signals by name just the same.
		title:       "wrapper in the app's command: `APP; rc=$?; killall -15 pilot-agent; exit $rc` (shareProcessNamespace)",
		script:      app + "; rc=$?; killall -15 pilot-agent; exit $rc",
		annotations: noSupervisor,
		sharePID:    true,
		shape:       classic,
	}, {
		key:         "wrap-quit",
		title:       "wrapper in the app's command: `trap 'wget -q --post-data \"\" " + quitURL + "' EXIT; APP`",
		script:      "trap 'wget -q -O /dev/null --post-data \"\" " + quitURL + "' EXIT; " + app,
		annotations: noSupervisor,
		shape:       classic,
	}, {
		key:         "sup-term",
		title:       "supervisor, success → SIGTERM (annotation `on-success: SIGTERM`)",
		annotations: map[string]string{supervisorPrefix + "on-success": "SIGTERM"},
		shape:       supervised,
		onSuccess:   "SIGTERM",
	}, {
		key:         "sup-quit",
		title:       "supervisor, success → POST /quitquitquit (annotation `on-success: " + quitURL + "`)",
		annotations: map[string]string{supervisorPrefix + "on-success": quitURL},
		shape:       supervised,
		onSuccess:   quitURL,
	}, {
		key:     "sup-onfailure",
		title:   "supervisor under restartPolicy OnFailure (the template's default: success → %s)",
		restart: corev1.RestartPolicyOnFailure,
		shape:   supervised,
	}, {
		// Istio's releases, by how their pilot-agent quits
		// (docs/compatibility.md): 1.20 has no /drain and its quit drains;
		// 1.21-1.25 drain on the quit unless /drain came first; 1.26+
		// quit at once, as the real one above.
		key:   "rel-120",
		title: "supervisor, Istio 1.20's pilot-agent (stand-in): no /drain, its quit drains " + standInDrain + " (the template's default: success → %s)",
		shape: supervised,
		istio: "1.20",
	}, {
		key:   "rel-124",
		title: "supervisor, Istio 1.21-1.25's pilot-agent (stand-in as 1.24): /drain, then the quit (the template's default: success → %s)",
		shape: supervised,
		istio: "1.24",
	}, {
		key:   "rel-126",
		title: "supervisor, Istio 1.26+'s pilot-agent (stand-in, beside the real one above; the template's default: success → %s)",
		shape: supervised,
		istio: "1.26",
	}, {
		key:   "sup-quick",
		title: "supervisor, an app of milliseconds (the app is `" + stamp + "` alone; the template's default: success → %s)",
		argv:  []string{stamp},
		shape: supervised,
	}, {
		// The supervisor's two shapes side by side (issue 32): the native
		// sidecar starts before the app, which the kubelet starts only
		// once its startup probe passes.
		key:         "sup-native",
		title:       "supervisor as a native sidecar (annotation `shape: native`; the template's default: success → %s)",
		annotations: map[string]string{supervisorPrefix + "shape": "native"},
		shape:       supervisedNative,
	}, {
		key:         "sup-native-quick",
		title:       "supervisor as a native sidecar, an app of milliseconds (the app is `" + stamp + "` alone; success → %s)",
		argv:        []string{stamp},
		annotations: map[string]string{supervisorPrefix + "shape": "native"},
		shape:       supervisedNative,
	}}
	for i := range all {
		all[i].restart = cmp.Or(all[i].restart, corev1.RestartPolicyNever)
		if all[i].argv == nil && all[i].script == "" {
			all[i].script = app
		}
	}
	return all
}

// job is the approach's Job: one pod, no retry, the label that asks Istio
// for its sidecar; where the approach runs a stand-in pilot-agent, the
// pod customises istio-proxy (Istio merges a container of that name over
// its own), whose image is proxyImage.
func (a approach) job(name, proxyImage string) *batchv1.Job {
	c := corev1.Container{Name: appName, Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullIfNotPresent}
	if a.argv != nil {
		c.Command = a.argv
	} else {
		c.Command = []string{"sh", "-c", a.script}
	}
	spec := corev1.PodSpec{RestartPolicy: a.restart, Containers: []corev1.Container{c}}
	if a.istio != "" {
		spec.Containers = append(spec.Containers, corev1.Container{
			Name:    proxyName,
			Image:   proxyImage,
			Command: []string{"/usr/local/bin/podsim", "pilot-agent"},
			Env: []corev1.EnvVar{
				{Name: "PILOT_ISTIO", Value: a.istio},
				{Name: "PILOT_DRAIN", Value: standInDrain},
			},
		})
	}
	if a.sharePID {
		spec.ShareProcessNamespace = ptr.To(true)
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      map[string]string{"sidecar.istio.io/inject": "true"},
					Annotations: a.annotations,
				},
				Spec: spec,
			},
		},
	}
}

// check returns why pod p is not what the approach must measure, or "".
// It also returns the supervisor's SUPERVISOR_ON_SUCCESS ("" if unset).
func (a approach) check(p *corev1.Pod) (problem, onSuccess string) {
	names := func(cs []corev1.Container) []string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return n
	}
	ctrs, inits := names(p.Spec.Containers), names(p.Spec.InitContainers)
	var want, wantInit []string
	switch a.shape {
	case native:
		want, wantInit = []string{appName}, []string{proxyName}
		if len(p.Spec.InitContainers) == 1 && p.Spec.InitContainers[0].RestartPolicy == nil {
			return "istio-proxy is an init container without restartPolicy Always", ""
		}
	case classic:
		want = []string{appName, proxyName}
	case supervised:
		want = []string{supervisorName, appName, proxyName}
	case supervisedNative:
		want, wantInit = []string{appName, proxyName}, []string{supervisorName}
		if len(p.Spec.InitContainers) == 1 && p.Spec.InitContainers[0].RestartPolicy == nil {
			return "the supervisor is an init container without restartPolicy Always", ""
		}
	}
	if !slices.Equal(ctrs, want) || !slices.Equal(inits, wantInit) {
		return fmt.Sprintf("containers %v and init containers %v, want %v and %v", ctrs, inits, want, wantInit), ""
	}
	if a.istio != "" {
		proxy := p.Spec.Containers[len(p.Spec.Containers)-1]
		istio := ""
		for _, v := range proxy.Env {
			if v.Name == "PILOT_ISTIO" {
				istio = v.Value
			}
		}
		if len(proxy.Command) == 0 || proxy.Command[0] != "/usr/local/bin/podsim" || istio != a.istio {
			return fmt.Sprintf("istio-proxy runs %q with PILOT_ISTIO %q, want the stand-in as %s", proxy.Command, istio, a.istio), ""
		}
	}
	if !a.shape.hasSupervisor() {
		return "", ""
	}
	sup := p.Spec.Containers[0]
	if a.shape == supervisedNative {
		sup = p.Spec.InitContainers[0]
	}
	env := map[string]string{}
	for _, v := range sup.Env {
		env[v.Name] = v.Value
	}
	wantShape := ""
	if a.shape == supervisedNative {
		wantShape = "native"
	}
	if got := env["SUPERVISOR_SHAPE"]; got != wantShape {
		return fmt.Sprintf("supervisor has SUPERVISOR_SHAPE %q, want %q", got, wantShape), ""
	}
	if got := env["SUPERVISOR_RESTART_POLICY"]; got != string(a.restart) {
		return fmt.Sprintf("supervisor has SUPERVISOR_RESTART_POLICY %q, want %q", got, a.restart), ""
	}
	if got := env["SUPERVISOR_AFTER_APPS"]; got != proxyName {
		return fmt.Sprintf("supervisor has SUPERVISOR_AFTER_APPS %q, want %q", got, proxyName), ""
	}
	onSuccess = env["SUPERVISOR_ON_SUCCESS"]
	if a.onSuccess != "" && onSuccess != a.onSuccess {
		return fmt.Sprintf("supervisor has SUPERVISOR_ON_SUCCESS %q, want %q", onSuccess, a.onSuccess), ""
	}
	return "", onSuccess
}

// rowTitle fills in the supervisor's success action where the title wants
// it.
func (a approach) rowTitle(onSuccess string) string {
	if !strings.Contains(a.title, "%s") {
		return a.title
	}
	switch onSuccess {
	case "":
		onSuccess = "SIGTERM, the binary's default"
	case quitURL:
		onSuccess = "POST /quitquitquit"
	}
	return fmt.Sprintf(a.title, onSuccess)
}
