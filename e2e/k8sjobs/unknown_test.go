package k8sjobs

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// Issue 19 on the real cluster: exit statuses unknown (forced with
// SUPERVISOR_EXIT_STATUS=none, as on a kernel before 6.15 without
// CAP_SYS_PTRACE), under OnFailure. Each instance waits for the restart the
// kubelet would make by its back-off, plus SUPERVISOR_RESTART_MARGIN, not
// SUPERVISOR_RESTART_TIMEOUT (5m30s).

// unknownMargin is the pod's restart-margin (SUPERVISOR_RESTART_MARGIN,
// the template's default 15 s): each restart after a failure must be seen
// within the kubelet's back-off plus it, on a node running every case at
// once, so it is generous. What is checked of it is exact all the same:
// the supervisor's logged wait for each restart.
const unknownMargin = time.Minute

// kubeletBackoff is the kubelet's wait before the n-th restart (n from 1),
// as the supervisor counts it: at once, then 10 s, 20 s.
var kubeletBackoff = []time.Duration{0, 0, 10 * time.Second, 20 * time.Second}

// unknownBound is a hang guard on the Job's completion after the app's last
// exit: the design gives the last back-off plus the margin plus pilot-agent's
// 5 s drain, SUPERVISOR_RESTART_TIMEOUT would give 5m30s.
const unknownBound = 4 * time.Minute

// waitingLine is the supervisor's log line for an instance whose status is
// unknown awaiting its restart.
const waitingLine = "app status unknown under restartPolicy OnFailure: waiting for a restart before taking it as finished"

// onFailureUnknown runs a Job (namespace and Job called name) whose app
// fails fails times, then succeeds, its statuses unknown, and checks each
// wait for a restart.
func (e *env) onFailureUnknown(ctx context.Context, t *testing.T, name string, fails int) {
	ns := e.namespace(ctx, t, name)
	j := newJob(name, corev1.RestartPolicyOnFailure, 4,
		app("app", `n=$(cat /state/runs 2>/dev/null || echo 0); echo $((n+1)) > /state/runs
if [ "$n" -lt `+string(rune('0'+fails))+` ]; then echo "run $((n+1)): failing"; exit 1; fi; echo "run $((n+1)): succeeding"`))
	j.Spec.Template.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/exit-status": "none",
		"supervisor.sidecar-supervisor.io/restart-margin": unknownMargin.String()}
	spec := &j.Spec.Template.Spec
	spec.Volumes = []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "state", MountPath: "/state"}}
	gate(t, spec, "app")
	e.createJob(ctx, t, ns, j)
	pod := e.nthPod(ctx, t, ns, name, 1)
	for run := 1; run <= fails+1; run++ {
		e.release(ctx, t, pod, "app", run)
	}
	cond := e.waitComplete(ctx, t, ns, name)
	p := e.onePod(ctx, t, ns, name)
	app := status(t, p, "app")
	if int(app.RestartCount) != fails {
		t.Errorf("app restarted %d times, want %d", app.RestartCount, fails)
	}
	if s := status(t, p, proxyName); s.RestartCount != 0 {
		t.Errorf("istio-proxy restarted %d times, want 0: the same istio-proxy through every restart", s.RestartCount)
	}
	wantExit(t, p, proxyName, 0)
	log := e.logs(ctx, t, p, supervisorName, false)
	if !strings.Contains(log, `"method":"none"`) {
		t.Errorf("pod %s: the supervisor did not read statuses as unknown:\n%s", p.Name, log)
	}
	// Each run's wait is the back-off for its would-be restart plus the
	// margin, not SUPERVISOR_RESTART_TIMEOUT.
	waits := restartWaits(log)
	if len(waits) != fails+1 {
		t.Fatalf("pod %s: the supervisor waited for %d restarts, want %d:\n%s", p.Name, len(waits), fails+1, log)
	}
	for i, w := range waits {
		if want := kubeletBackoff[i+1] + unknownMargin; w != want {
			t.Errorf("pod %s: run %d: the supervisor waits %s for its restart, want %s (back-off %s + margin %s)",
				p.Name, i+1, w, want, kubeletBackoff[i+1], unknownMargin)
		}
	}
	// The Job completes no sooner than the last wait (whole seconds), and
	// long before RESTART_TIMEOUT would have ended it.
	end := app.State.Terminated.FinishedAt.Time
	took := cond.LastTransitionTime.Sub(end)
	t.Logf("job %s: Complete %s after the app's last exit (whole seconds; %d restart(s) before)", name, took, fails)
	if last := waits[len(waits)-1]; took < last-time.Second {
		t.Errorf("job %s: Complete %s after the app's exit, before its would-be restart was overdue (%s)", name, took, last)
	}
	if took > unknownBound {
		t.Errorf("job %s: Complete %s after the app's exit, want well under SUPERVISOR_RESTART_TIMEOUT (bound %s)", name, took, unknownBound)
	}
}

// restartWaits are the waits of the supervisor's waitingLine lines for
// container app, in order.
func restartWaits(log string) []time.Duration {
	var waits []time.Duration
	lines, _ := measure.ParseLog(log)
	for _, l := range lines {
		if l.Message == waitingLine && l.Container == "app" {
			waits = append(waits, l.Waited().Round(time.Millisecond))
		}
	}
	return waits
}
