package k8sjobs

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// standbyName is the standby supervisor the template adds with the
// annotation standby: "true".
const standbyName = "sidecar-supervisor-standby"

// The standby's lines (supervisor/lead.go).
const (
	logStandingBy = "standby: another supervisor of the pod leads; carrying on from its journal the moment it ends"
	logLeading    = "standby: the leading supervisor has ended: leading from here"
	logResumed    = "carrying on from the journal of the supervisor before"
)

// killLeader is an app's script that SIGKILLs the pod's leading
// supervisor, as an OOM kill would, then waits for the standby to lead and
// watch it, then exits 0. It reads both from the supervisors' state volume
// (mounted here for the test alone, at stateDir): the leader's PID in the
// lock file, and the ready file, which a supervisor writes again once its
// first scan has taken the journal in and watches the apps again; a wait
// of 30 s at most, then exit 1.
const killLeader = `s=` + stateDir + `; old=$(cat $s/leader); echo "killing the leading supervisor, pid $old"; kill -9 "$old"
n=0; until [ -e $s/ready ] && [ "$(cut -d' ' -f1 $s/ready)" != "$old" ]; do n=$((n+1)); [ $n -le 600 ] || exit 1; sleep 0.05; done
echo "the supervisor in pid $(cut -d' ' -f1 $s/ready) watches; done"`

// stateVolume is the supervisors' state volume, mounted at stateDir.
const stateVolume, stateDir = "sidecar-supervisor-state", "/var/run/sidecar-supervisor-state"

// standby runs a Job with the template's standby: once the standby says it
// stands by, the app kills the leading supervisor, and exits 0 once the
// standby watches it. The standby
// leads at once (no kubelet's restart in between), carries on from the
// journal and stops istio-proxy by its quit; the killed supervisor,
// started again by the kubelet, stands by or finds the work done. Container shape under
// OnFailure, native under Never (the kubelet restarts a native sidecar on
// any death; its exit never fails the pod).
func (e *env) standby(ctx context.Context, t *testing.T, native bool) {
	name, policy := "standby", corev1.RestartPolicyOnFailure
	annotations := map[string]string{"supervisor.sidecar-supervisor.io/standby": "true"}
	if native {
		name, policy = "standby-native", corev1.RestartPolicyNever
		annotations["supervisor.sidecar-supervisor.io/shape"] = "native"
	}
	ns := e.namespace(ctx, t, name)
	a := app("app", killLeader)
	a.VolumeMounts = []corev1.VolumeMount{{Name: stateVolume, MountPath: stateDir, ReadOnly: true}}
	// Under OnFailure the Job controller counts the killed supervisor's
	// restart against backoffLimit, as any container's: it fails the Job
	// once they reach it.
	j := newJob(name, policy, 2, a)
	// Named in the Job (the API server checks its mounts before any
	// injection), then merged with the template's by name.
	j.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: stateVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	gate(t, &j.Spec.Template.Spec, "app")
	j.Spec.Template.Annotations = annotations
	e.createJob(ctx, t, ns, j)
	p := e.nthPod(ctx, t, ns, name, 1)
	e.waitLogged(ctx, t, p, standbyName, logStandingBy, "", 1)
	e.release(ctx, t, p, "app", 1)
	e.waitComplete(ctx, t, ns, name)
	p = e.onePod(ctx, t, ns, name)
	if p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod %s is %s, want Succeeded", p.Name, p.Status.Phase)
	}
	appEnd := wantExit(t, p, "app", 0).FinishedAt
	proxyEnd := wantExit(t, p, proxyName, 0).FinishedAt
	inOrderLines(t, p, proxyName, e.logs(ctx, t, p, proxyName, false), pilotQuit, pilotNoDrain)
	sup, sb := status(t, p, supervisorName), status(t, p, standbyName)
	// The leader killed once, the standby never. The kubelet restarts the
	// killed one unless the pod is ending by then (the native shape: the
	// app ends at once), and then it stands by.
	killed := sup.State.Terminated
	if sup.RestartCount > 0 {
		killed = sup.LastTerminationState.Terminated
	}
	if killed == nil || killed.ExitCode != 137 || sup.RestartCount > 1 || sb.RestartCount != 0 {
		t.Errorf("pod %s: the supervisor %s (%d restarts), the standby %d restarts: want the leader killed once, the standby never",
			p.Name, cluster.StateString(corev1.ContainerState{Terminated: killed}), sup.RestartCount, sb.RestartCount)
	}
	standby := e.logs(ctx, t, p, standbyName, false)
	inOrderLines(t, p, standbyName, standby, logStandingBy, logLeading, logResumed, logStopped)
	// Started again, it leads once the standby has exited, or at once if
	// that came first, and finds the Job done either way; it exits once
	// its postStart hook has returned (a restart near the pod's end
	// otherwise ended it, a failed start: supervisor/hooked.go).
	if sup.RestartCount == 1 && !strings.Contains(e.logs(ctx, t, p, supervisorName, false), logResumed) {
		t.Errorf("pod %s: the killed supervisor, started again, does not carry on from the journal", p.Name)
	}
	t.Logf("pod %s: istio-proxy finished %s after the app, its leading supervisor killed by it", p.Name, proxyEnd.Sub(appEnd.Time).Round(time.Millisecond))
}
