package k8sjobs

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// An app that must be seen by the supervisor before it ends is gated: each
// run waits for the test's go-ahead, the file /gate/NAME in an emptyDir,
// and removes it as it passes, so that the next run (a restart) waits for
// its own. The test creates the file (release) only once the supervisor
// has logged the run as found. A timed app (sleep 10) raced the
// supervisor's start instead, on a node running every case at once.
const (
	gateVolume = "gate"
	gateDir    = "/gate"
)

// gate makes the named containers of spec gated apps. Each must run
// `sh -c SCRIPT`, as the busybox apps here and in deploy/ do.
func gate(t *testing.T, spec *corev1.PodSpec, names ...string) {
	t.Helper()
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == gateVolume }) {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: gateVolume,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	for _, name := range names {
		c := findContainer(*spec, name)
		if c == nil || len(c.Command) != 3 || c.Command[0] != "sh" || c.Command[1] != "-c" {
			t.Fatalf("gate %s: want a container running sh -c SCRIPT, have %+v", name, c)
		}
		file := gateDir + "/" + name
		c.Command[2] = fmt.Sprintf("until [ -e %[1]s ]; do sleep 0.1; done; rm -f %[1]s; %s", file, c.Command[2])
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: gateVolume, MountPath: gateDir})
	}
}

// release lets the run-th run of gated app container in pod p go, once the
// supervisor has logged "app found" for it run times (each run, a restart
// too, is found anew) and, for the first run, istio-proxy runs: the app
// then ends while the proxy runs, as one that works for more than a moment
// does. It creates the run's gate file with kubectl exec, once the kubelet
// too has the run running (the supervisor may find it earlier, in the
// runtime's init, where exec finds no container yet). Each wait is bounded
// by jobLimit, a hang guard.
func (e *env) release(ctx context.Context, t *testing.T, p corev1.Pod, container string, run int) {
	t.Helper()
	if run == 1 && findContainer(p.Spec, proxyName) != nil {
		e.waitRunning(ctx, t, p, proxyName, 0)
		if anchors(p) {
			e.waitLogged(ctx, t, p, supervisorName, logAnchored, proxyName, 1)
		}
	}
	e.waitLogged(ctx, t, p, supervisorName, logFound, container, run)
	e.waitRunning(ctx, t, p, container, run-1)
	deadline := time.Now().Add(jobLimit)
	for {
		out, err := e.c.Exec(ctx, p.Namespace, p.Name, container, "touch", gateDir+"/"+container)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: release %s's run %d: %v\n%s", p.Name, container, run, err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// anchors reports whether p's supervisor anchors accounting through
// istio-proxy (exit-status ptrace, which the manifest and the template
// pair with the state volume mounted in istio-proxy): it looks for
// istio-proxy while the apps run, and the first run is released only once
// it said so.
func anchors(p corev1.Pod) bool {
	c := findContainer(p.Spec, supervisorName)
	return c != nil && slices.ContainsFunc(c.Env, func(v corev1.EnvVar) bool {
		return v.Name == "SUPERVISOR_EXIT_STATUS" && v.Value == "ptrace"
	})
}

// gated reports whether container of p is a gated app (gate).
func gated(p corev1.Pod, container string) bool {
	c := findContainer(p.Spec, container)
	return c != nil && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == gateVolume })
}

// waitRunning waits, up to jobLimit, until container (an ephemeral one
// too) of pod p runs, restarted at least restarts times.
func (e *env) waitRunning(ctx context.Context, t *testing.T, p corev1.Pod, container string, restarts int) {
	t.Helper()
	deadline := time.Now().Add(jobLimit)
	state := "not seen"
	for time.Now().Before(deadline) {
		got, err := e.c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err == nil {
			for _, s := range append(got.Status.ContainerStatuses, got.Status.EphemeralContainerStatuses...) {
				if s.Name != container {
					continue
				}
				if s.State.Running != nil && int(s.RestartCount) >= restarts {
					return
				}
				state = fmt.Sprintf("%d restarts, %s", s.RestartCount, cluster.StateString(s.State))
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("pod %s: %s not running after %d restarts within %s (%s)", p.Name, container, restarts, jobLimit, state)
}

// waitLogged waits, up to jobLimit, until the supervisor of pod p in
// container from (its standby's too) has logged message n times for
// container ("": a line about none), and returns its log.
func (e *env) waitLogged(ctx context.Context, t *testing.T, p corev1.Pod, from, message, container string, n int) string {
	t.Helper()
	var log string
	deadline := time.Now().Add(jobLimit)
	for time.Now().Before(deadline) {
		// The supervisor's container may not be started yet: no log so far.
		if b, err := e.c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name,
			&corev1.PodLogOptions{Container: from}).DoRaw(ctx); err == nil {
			log = string(b)
			if countLogged(log, message, container) >= n {
				return log
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s: waiting for %s's %q for %s: %v", p.Name, from, message, container, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	t.Fatalf("pod %s: %s did not log %q for %s %d times within %s:\n%s", p.Name, from, message, container, n, jobLimit, log)
	return ""
}

// countLogged counts the lines of a supervisor log whose message is
// message and whose container is container.
func countLogged(log, message, container string) int {
	lines, _ := measure.ParseLog(log) // a line being written is left out
	return len(slices.DeleteFunc(lines, func(l measure.LogLine) bool { return l.Message != message || l.Container != container }))
}

// nthPod waits, up to jobLimit, until job has n pods, and returns the
// n-th (from 1, oldest first).
func (e *env) nthPod(ctx context.Context, t *testing.T, ns, job string, n int) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(jobLimit)
	for time.Now().Before(deadline) {
		if pods := e.jobPods(ctx, t, ns, job); len(pods) >= n {
			return pods[n-1]
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("job %s/%s: no pod %d within %s%s", ns, job, n, jobLimit, e.diagnose(t, ns, job))
	return corev1.Pod{}
}
