package k8sjobs

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
)

// waitJob waits, up to limit, until the Job is Complete or Failed, and
// returns the condition it reached.
func (e *env) waitJob(ctx context.Context, t *testing.T, ns, name string, limit time.Duration) batchv1.JobCondition {
	t.Helper()
	var cond *batchv1.JobCondition
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		j, err := e.c.Client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("active %d, succeeded %d, failed %d, conditions %+v", j.Status.Active, j.Status.Succeeded, j.Status.Failed, j.Status.Conditions)
		cond = jobprog.Finished(j)
		return cond != nil, nil
	})
	if err != nil {
		t.Fatalf("job %s/%s reached neither Complete nor Failed within %s (%s): %v%s", ns, name, limit, last, err, e.diagnose(t, ns, name))
	}
	t.Logf("job %s: %s (%s) after %s", name, cond.Type, cond.Reason, cond.LastTransitionTime.Sub(jobStart(ctx, e, ns, name)).Round(time.Second))
	return *cond
}

// waitComplete is waitJob bounded by jobLimit, for a Job that must
// complete: the test fails if it ends otherwise.
func (e *env) waitComplete(ctx context.Context, t *testing.T, ns, name string) batchv1.JobCondition {
	t.Helper()
	cond := e.waitJob(ctx, t, ns, name, jobLimit)
	if cond.Type != batchv1.JobComplete {
		t.Fatalf("job %s ended %s (%s: %s), want Complete%s", name, cond.Type, cond.Reason, cond.Message, e.failedPods(ctx, t, ns, name))
	}
	return cond
}

// failedPods says, for each failed pod of a Job, how each of its containers
// ended and what the supervisor's termination message says: on one line, so
// that the end of a run's output, which may be all a reader has, shows it.
func (e *env) failedPods(ctx context.Context, t *testing.T, ns, job string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range e.jobPods(ctx, t, ns, job) {
		if p.Status.Phase != corev1.PodFailed {
			continue
		}
		fmt.Fprintf(&b, "; pod %s Failed:", p.Name)
		for i, s := range p.Status.ContainerStatuses {
			if i > 0 {
				b.WriteString(",")
			}
			term := s.State.Terminated
			if term == nil {
				fmt.Fprintf(&b, " %s %s", s.Name, cluster.StateString(s.State))
				continue
			}
			fmt.Fprintf(&b, " %s exit %d (%s)", s.Name, term.ExitCode, term.Reason)
			if s.Name == supervisorName && term.Message != "" {
				fmt.Fprintf(&b, " %q", term.Message)
			}
		}
	}
	return b.String()
}

// runcInit is the comm runc gives its init process, which stands in a
// created container until the runtime starts it and it execs the
// entrypoint (keeping its PID).
const runcInit = `"comm":"runc:[2:INIT]"`

// diagnose looks, in the supervisor logs of a Job that did not finish, for a
// known product bug: the supervisor took istio-proxy's container, caught
// while still in runc's init, for an app, and waits for pilot-agent to exit.
func (e *env) diagnose(t *testing.T, ns, job string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var b strings.Builder
	for _, p := range e.jobPods(ctx, t, ns, job) {
		if findContainer(p.Spec, supervisorName) == nil {
			continue
		}
		raw, err := e.c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: supervisorName}).DoRaw(ctx)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, `"message":"app found"`) && strings.Contains(line, runcInit) {
				fmt.Fprintf(&b, "\nPRODUCT BUG in pod %s: the supervisor adopted as an app a container still in runc's init "+
					"(it then execs its entrypoint; here istio-proxy's pilot-agent), so it waits for the proxy to exit: %s", p.Name, line)
			}
		}
	}
	return b.String()
}

// jobStart is when the Job was created, for the log.
func jobStart(ctx context.Context, e *env, ns, name string) time.Time {
	j, err := e.c.Client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return time.Now()
	}
	return j.CreationTimestamp.Time
}

// jobPods returns the Job's pods, oldest first.
func (e *env) jobPods(ctx context.Context, t *testing.T, ns, job string) []corev1.Pod {
	t.Helper()
	l, err := e.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		t.Fatalf("list the pods of job %s/%s: %v", ns, job, err)
	}
	pods := l.Items
	sort.Slice(pods, func(i, j int) bool { return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) })
	return pods
}

// onePod returns the Job's only pod.
func (e *env) onePod(ctx context.Context, t *testing.T, ns, job string) corev1.Pod {
	t.Helper()
	pods := e.jobPods(ctx, t, ns, job)
	if len(pods) != 1 {
		t.Fatalf("job %s/%s has %d pods, want 1", ns, job, len(pods))
	}
	return pods[0]
}

// waitRestarted waits (bounded by jobLimit) until a container of the Job's
// pod runs again after its first instance ended, and returns how that one
// ended: read while the pod runs, which every kubelet reports.
func (e *env) waitRestarted(ctx context.Context, t *testing.T, ns, job, container string) corev1.ContainerStateTerminated {
	t.Helper()
	deadline := time.Now().Add(jobLimit)
	for {
		for _, p := range e.jobPods(ctx, t, ns, job) {
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == container && s.RestartCount >= 1 && s.State.Running != nil && s.LastTerminationState.Terminated != nil {
					return *s.LastTerminationState.Terminated
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of job %s/%s did not run again within %s:\n%s", container, ns, job, jobLimit, e.diagnose(t, ns, job))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// status returns a container's status in p (an init container's too).
func status(t *testing.T, p corev1.Pod, name string) corev1.ContainerStatus {
	t.Helper()
	for _, s := range slices.Concat(p.Status.ContainerStatuses, p.Status.InitContainerStatuses) {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("pod %s has no status for container %s", p.Name, name)
	return corev1.ContainerStatus{}
}

// terminated returns how a container of p ended; the test fails if it has not.
func terminated(t *testing.T, p corev1.Pod, name string) corev1.ContainerStateTerminated {
	t.Helper()
	s := status(t, p, name)
	if s.State.Terminated == nil {
		t.Fatalf("container %s of pod %s has not terminated: %s", name, p.Name, cluster.StateString(s.State))
	}
	return *s.State.Terminated
}

// wantExit checks a container's exit code.
func wantExit(t *testing.T, p corev1.Pod, name string, code int32) corev1.ContainerStateTerminated {
	t.Helper()
	term := terminated(t, p, name)
	if term.ExitCode != code {
		t.Errorf("pod %s: %s exited %d (%s), want %d", p.Name, name, term.ExitCode, term.Reason, code)
	}
	return term
}

// logs returns a container's log (of its previous instance with previous).
func (e *env) logs(ctx context.Context, t *testing.T, p corev1.Pod, container string, previous bool) string {
	t.Helper()
	b, err := e.c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name,
		&corev1.PodLogOptions{Container: container, Previous: previous}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s in pod %s: %v", container, p.Name, err)
	}
	return string(b)
}

// shape is what an injected pod must look like.
type shape struct {
	apps []string
	// supervisor: a sidecar-supervisor container, after the apps and before
	// istio-proxy (the injector moves istio-proxy last).
	supervisor bool
	// supervisorEnv: settings the supervisor must have (others may be there).
	supervisorEnv map[string]string
	// proxyFirst: istio-proxy first (holdApplicationUntilProxyStarts), the
	// supervisor last.
	proxyFirst bool
}

// checkInjected checks that Istio's injector ran on p: no init container
// (interceptionMode NONE), the containers in the injected order, the images
// built for the cluster, and a shared PID namespace where the supervisor is.
func (e *env) checkInjected(t *testing.T, p corev1.Pod, want shape) {
	t.Helper()
	// The template puts the supervisor first, telling it that istio-proxy
	// (last) starts after the apps; the manifests by hand put it after the
	// apps.
	sup := findContainer(p.Spec, supervisorName)
	first := sup != nil && slices.ContainsFunc(sup.Env, func(v corev1.EnvVar) bool {
		return v.Name == "SUPERVISOR_AFTER_APPS" && v.Value == proxyName
	})
	var wantNames []string
	if want.proxyFirst {
		wantNames = append(wantNames, proxyName)
	}
	if want.supervisor && first {
		wantNames = append(wantNames, supervisorName)
	}
	wantNames = append(wantNames, want.apps...)
	if want.supervisor && !first {
		wantNames = append(wantNames, supervisorName)
	}
	if !want.proxyFirst {
		wantNames = append(wantNames, proxyName)
	}
	if got := containerNames(p.Spec.Containers); !slices.Equal(got, wantNames) {
		t.Errorf("pod %s has containers %v, want %v", p.Name, got, wantNames)
	}
	if len(p.Spec.InitContainers) != 0 {
		t.Errorf("pod %s has init containers %v, want none (interceptionMode NONE)", p.Name, containerNames(p.Spec.InitContainers))
	}
	if p.Annotations["sidecar.istio.io/status"] == "" {
		t.Errorf("pod %s lacks the annotation sidecar.istio.io/status the injector writes", p.Name)
	}
	if c := findContainer(p.Spec, proxyName); c != nil && c.Image != e.proxyImage {
		t.Errorf("pod %s: istio-proxy image %s, want %s", p.Name, c.Image, e.proxyImage)
	}
	if sup == nil {
		return
	}
	if sup.Image != e.supervisorImage {
		t.Errorf("pod %s: supervisor image %s, want %s", p.Name, sup.Image, e.supervisorImage)
	}
	if p.Spec.ShareProcessNamespace == nil || !*p.Spec.ShareProcessNamespace {
		t.Errorf("pod %s does not share its PID namespace", p.Name)
	}
	env := map[string]string{}
	for _, v := range sup.Env {
		env[v.Name] = v.Value
	}
	for k, v := range want.supervisorEnv {
		if env[k] != v {
			t.Errorf("pod %s: supervisor %s=%q, want %q", p.Name, k, env[k], v)
		}
	}
}

// checkSupervisor checks that the supervisor exited 0, once, with a
// termination message starting with summary (where {NAME} is the name of
// container NAME), and that its log has each message in order; it returns
// the log.
func (e *env) checkSupervisor(ctx context.Context, t *testing.T, p corev1.Pod, summary string, messages ...string) string {
	t.Helper()
	term := wantExit(t, p, supervisorName, 0)
	// The supervisor knows every container by its Kubernetes name (the
	// kubelet's termination-message mount): {NAME} is the name itself.
	for _, s := range p.Status.ContainerStatuses {
		summary = strings.ReplaceAll(summary, "{"+s.Name+"}", s.Name)
	}
	if msg := strings.TrimSpace(term.Message); !strings.HasPrefix(msg, summary) {
		t.Errorf("pod %s: supervisor termination message %q, want it to start with %q", p.Name, msg, summary)
	}
	if s := status(t, p, supervisorName); s.RestartCount != 0 {
		t.Errorf("pod %s: supervisor restarted %d times", p.Name, s.RestartCount)
	}
	log := e.logs(ctx, t, p, supervisorName, false)
	inOrder(t, p, log, messages...)
	return log
}

// inOrder checks that the supervisor's log has each message, in this order
// (zerolog JSON lines: matched on "message":"...").
func inOrder(t *testing.T, p corev1.Pod, log string, messages ...string) {
	t.Helper()
	inSequence(t, p, supervisorName, log, `"message":"`, messages)
}

// inOrderLines checks that a container's log has each text, in this order.
func inOrderLines(t *testing.T, p corev1.Pod, container, log string, texts ...string) {
	t.Helper()
	inSequence(t, p, container, log, "", texts)
}

func inSequence(t *testing.T, p corev1.Pod, container, log, prefix string, texts []string) {
	t.Helper()
	rest := log
	for _, m := range texts {
		i := strings.Index(rest, prefix+m)
		if i < 0 {
			t.Errorf("pod %s: %s log lacks %q after %q:\n%s", p.Name, container, m, texts, log)
			return
		}
		rest = rest[i+1:]
	}
}

// watchPodFor watches pod p for d and returns the first non-empty verdict of
// bad on the pod as it changes ("" when it never objected). The window is
// the point: it ends the watch, not an event.
func (e *env) watchPodFor(ctx context.Context, t *testing.T, p corev1.Pod, d time.Duration, bad func(*corev1.Pod) string) string {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if v := bad(&p); v != "" {
		return v
	}
	rv := p.ResourceVersion
	for wctx.Err() == nil {
		w, err := e.c.Client.CoreV1().Pods(p.Namespace).Watch(wctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", p.Name).String(),
			ResourceVersion: rv,
		})
		if err != nil {
			if wctx.Err() != nil {
				break
			}
			t.Fatalf("watch pod %s: %v", p.Name, err)
		}
		for ev := range w.ResultChan() {
			switch got := ev.Object.(type) {
			case *corev1.Pod:
				rv = got.ResourceVersion
				if v := bad(got); v != "" {
					w.Stop()
					return v
				}
				if ev.Type == watch.Deleted {
					w.Stop()
					return "pod deleted"
				}
			case *metav1.Status:
				// The watch expired (410 Gone): start again from now.
				if cur, err := e.c.Client.CoreV1().Pods(p.Namespace).Get(wctx, p.Name, metav1.GetOptions{}); err == nil {
					rv = cur.ResourceVersion
					if v := bad(cur); v != "" {
						w.Stop()
						return v
					}
				}
			}
		}
		w.Stop()
	}
	// The state at the end of the window counts too.
	cur, err := e.c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", p.Name, err)
	}
	return bad(cur)
}
