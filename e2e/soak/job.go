package main

import (
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

const (
	// finalizer keeps the soak's pods in the API once deleted (by the soak,
	// or by the Job controller at a deadline or a failure), with their last
	// status, until the soak has checked them.
	finalizer = "soak.sidecar-supervisor.io/checked"
	// stateMount is where each app finds the Job's directory on the node (a
	// hostPath: this is a one-node cluster): its instance counter and the
	// times it stamps.
	stateMount = "/soak"
	// exitStatusAnnotation forces the supervisor's exit-status method, and
	// shapeAnnotation its shape (deploy/istio/supervisor.tmpl).
	exitStatusAnnotation = "supervisor.sidecar-supervisor.io/exit-status"
	shapeAnnotation      = "supervisor.sidecar-supervisor.io/shape"
	standbyAnnotation    = "supervisor.sidecar-supervisor.io/standby"
	supervisorName       = "sidecar-supervisor"
	standbyName          = "sidecar-supervisor-standby"
	proxyName            = "istio-proxy"
)

// appScript is each app container's script. It counts its instance n in
// the Job's directory (across the Job's pods and the kubelet's restarts),
// stamps its start, runs step n of $PLAN ("seconds:code ..."), stamps its
// end and exits. The stamps are adjtimex(2)'s wall clock (busybox's date
// has no %N here): nanoseconds, comparable with the supervisor's log times.
// Everything but the stamps is a shell builtin, so a run of 0 ms takes a
// few.
const appScript = `n=0; [ -e ` + stateMount + `/$APP.n ] && read n < ` + stateMount + `/$APP.n; n=$((n+1)); echo $n > ` + stateMount + `/$APP.n
echo "start $n $POD_NAME" $(adjtimex) >> ` + stateMount + `/$APP.times
set -- $PLAN; i=$n; [ $i -le $# ] || i=$#; eval "s=\${$i}"; d=${s%:*}; c=${s#*:}
echo "$APP instance $n in $POD_NAME: ${d}s, then exit $c"
[ "$d" = 0 ] || sleep "$d"
echo "end $n $POD_NAME $c" $(adjtimex) >> ` + stateMount + `/$APP.times
exit "$c"`

func (a appPlan) plan() string {
	var s []string
	for _, st := range a.steps {
		if st.d == 0 {
			s = append(s, fmt.Sprintf("0:%d", st.code))
			continue
		}
		s = append(s, fmt.Sprintf("%.3f:%d", st.d.Seconds(), st.code))
	}
	return strings.Join(s, " ")
}

// job is the timeline's Job as a user writes it: busybox apps, the label
// that asks Istio for its sidecar, nothing about the supervisor but, for
// some, the exit-status and shape annotations. dir is the Job's directory
// on the node.
func (t timeline) job(dir string) *batchv1.Job {
	var apps []corev1.Container
	for _, a := range t.apps {
		apps = append(apps, corev1.Container{
			Name:    a.name,
			Image:   cluster.BusyboxImage,
			Command: []string{"sh", "-c", appScript},
			Env: []corev1.EnvVar{
				{Name: "APP", Value: a.name},
				{Name: "PLAN", Value: a.plan()},
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			},
			VolumeMounts: []corev1.VolumeMount{{Name: "soak", MountPath: stateMount}},
		})
	}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels:     map[string]string{"sidecar.istio.io/inject": "true"},
			Finalizers: []string{finalizer},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: t.restart,
			Containers:    apps,
			Volumes: []corev1.Volume{{Name: "soak", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectory)},
			}}},
		},
	}
	if t.exitStatus() != "" || t.native {
		tmpl.Annotations = map[string]string{}
	}
	if m := t.exitStatus(); m != "" {
		tmpl.Annotations[exitStatusAnnotation] = m
	}
	if t.native {
		tmpl.Annotations[shapeAnnotation] = "native"
	}
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: t.name()},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To(t.backoffLimit),
			Template:     tmpl,
		},
	}
	if t.deadline > 0 {
		j.Spec.ActiveDeadlineSeconds = ptr.To(t.deadline)
	}
	return j
}
