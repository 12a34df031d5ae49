package k8sjobs

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// Issue 19 on the real cluster: exit statuses unknown (forced with
// SUPERVISOR_EXIT_STATUS=none, as on a kernel before 6.15 without
// CAP_SYS_PTRACE), under OnFailure. Each instance waits for the restart the
// kubelet would make by its back-off, plus SUPERVISOR_RESTART_MARGIN, not
// SUPERVISOR_RESTART_TIMEOUT (5m30s).

// unknownBound is far below RESTART_TIMEOUT and far above what the design
// gives (back-off + 15 s margin + pilot-agent's 5 s drain): it tells the
// two apart on a loaded machine. The figure itself is logged.
const unknownBound = 2 * time.Minute

func (e *env) onFailureUnknown(ctx context.Context, t *testing.T, name string, fails int) {
	ns := e.namespace(ctx, t, name)
	j := newJob(name, corev1.RestartPolicyOnFailure, 4,
		app("app", `n=$(cat /state/runs 2>/dev/null || echo 0); echo $((n+1)) > /state/runs
if [ "$n" -lt `+string(rune('0'+fails))+` ]; then echo "run $((n+1)): failing"; sleep 10; exit 1; fi; echo "run $((n+1)): succeeding"; sleep 10`))
	j.Spec.Template.Annotations = map[string]string{"supervisor.sidecar-supervisor.io/exit-status": "none"}
	spec := &j.Spec.Template.Spec
	spec.Volumes = []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "state", MountPath: "/state"}}
	e.createJob(ctx, t, ns, j)
	cond := e.waitJob(ctx, t, ns, name, jobLimit)
	if cond.Type != batchv1.JobComplete {
		t.Fatalf("job ended %s (%s: %s), want Complete", cond.Type, cond.Reason, cond.Message)
	}
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
	if !strings.Contains(log, `"method":"none"`) || !strings.Contains(log, "waiting for a restart before taking it as finished") {
		t.Errorf("pod %s: the supervisor did not read statuses as unknown:\n%s", p.Name, log)
	}
	end := app.State.Terminated.FinishedAt.Time
	took := cond.LastTransitionTime.Sub(end)
	t.Logf("job %s: Complete %s after the app's last exit (whole seconds; %d restart(s) before)", name, took, fails)
	if took > unknownBound {
		t.Errorf("job %s: Complete %s after the app's exit, want well under SUPERVISOR_RESTART_TIMEOUT (bound %s)", name, took, unknownBound)
	}
}

func (e *env) onFailureUnknownFirstTry(ctx context.Context, t *testing.T) {
	e.onFailureUnknown(ctx, t, "unknown-first-try", 0)
}

func (e *env) onFailureUnknownTwice(ctx context.Context, t *testing.T) {
	e.onFailureUnknown(ctx, t, "unknown-twice", 2)
}
