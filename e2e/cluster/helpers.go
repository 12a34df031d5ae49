package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Namespace creates a fresh namespace (deleted at cleanup) and waits until its
// default ServiceAccount exists, before which pods are refused.
func (c *Cluster) Namespace(ctx context.Context, t testing.TB, prefix string) string {
	t.Helper()
	ns, err := c.CreateNamespace(ctx, prefix, nil)
	if ns != "" {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete namespace %s: %v", ns, err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// CreateNamespace creates a namespace named prefix-<random>, with labels,
// and waits (at most a minute) for its default ServiceAccount: pods are
// refused until it exists. The name is returned with an error past the
// wait, so that the caller can delete the namespace.
func (c *Cluster) CreateNamespace(ctx context.Context, prefix string, labels map[string]string) (string, error) {
	ns, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-", Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create namespace: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return ns.Name, fmt.Errorf("namespace %s got no default ServiceAccount within 1m: %w", ns.Name, err)
	}
	return ns.Name, nil
}

// DumpOnFailure registers a cleanup that, if the test failed, logs the status
// and container logs of the pod named name in ns (every pod if name is ""),
// the namespace's events and the tail of the kubelet's log.
func (c *Cluster) DumpOnFailure(t testing.TB, ns, name string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t.Log(c.Describe(ctx, ns, name))
		t.Logf("kubelet log (tail):\n%s", c.DaemonLog("kubelet", 40))
	})
}

// Describe renders the status and container logs of the pod name in ns (of
// every pod in ns if name is ""), and the namespace's events.
func (c *Cluster) Describe(ctx context.Context, ns, name string) string {
	var b strings.Builder
	var pods []corev1.Pod
	if name != "" {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			fmt.Fprintf(&b, "get pod %s/%s: %v\n", ns, name, err)
		} else {
			pods = append(pods, *p)
		}
	} else if l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		fmt.Fprintf(&b, "list pods in %s: %v\n", ns, err)
	} else {
		pods = l.Items
	}
	for _, p := range pods {
		fmt.Fprintf(&b, "pod %s/%s: phase %s, node %q, reason %q %s\n", ns, p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
		for _, cond := range p.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s %s %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "  container %s (%s): ready=%v restarts=%d state: %s\n", s.Name, s.Image, s.Ready, s.RestartCount, StateString(s.State))
			if s.RestartCount > 0 {
				fmt.Fprintf(&b, "    last state: %s\n", StateString(s.LastTerminationState))
				logs, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name, Previous: true}).DoRaw(ctx)
				if err != nil {
					fmt.Fprintf(&b, "    logs of the previous instance: %v\n", err)
				} else {
					fmt.Fprintf(&b, "    logs of the previous instance:\n%s\n", indent(string(logs), "      "))
				}
			}
			logs, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name}).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(&b, "    logs: %v\n", err)
				continue
			}
			fmt.Fprintf(&b, "    logs:\n%s\n", indent(string(logs), "      "))
		}
	}
	if ev, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range ev.Items {
			fmt.Fprintf(&b, "event %s %s/%s: %s %s\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

// StateString renders a container state as kubectl describe would put it on
// one line: running since when, waiting why, or terminated with exit code,
// reason, signal, times and the termination message.
func StateString(st corev1.ContainerState) string {
	switch {
	case st.Terminated != nil:
		t := st.Terminated
		s := fmt.Sprintf("terminated exit %d reason %q", t.ExitCode, t.Reason)
		if t.Signal != 0 {
			s += fmt.Sprintf(" signal %d", t.Signal)
		}
		s += fmt.Sprintf(" started %s finished %s", t.StartedAt.Format(time.RFC3339), t.FinishedAt.Format(time.RFC3339))
		if t.Message != "" {
			s += fmt.Sprintf(" message %q", t.Message)
		}
		return s
	case st.Running != nil:
		return "running since " + st.Running.StartedAt.Format(time.RFC3339)
	case st.Waiting != nil:
		return fmt.Sprintf("waiting reason %q %s", st.Waiting.Reason, st.Waiting.Message)
	}
	return "none"
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n")
}

// WaitTerminated waits, up to limit, until container in pod ns/name has
// terminated, and returns how. A pod that cannot start the container (image
// missing, bad command) ends the wait early with an error naming the reason.
func (c *Cluster) WaitTerminated(ctx context.Context, ns, name, container string, limit time.Duration) (*corev1.ContainerStateTerminated, error) {
	var term *corev1.ContainerStateTerminated
	var last string
	err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if s.Name != container {
				continue
			}
			if s.State.Terminated != nil {
				term = s.State.Terminated
				return true, nil
			}
			if w := s.State.Waiting; w != nil {
				last = w.Reason + ": " + w.Message
				switch w.Reason {
				case "ErrImageNeverPull", "InvalidImageName", "CreateContainerError", "CreateContainerConfigError", "RunContainerError":
					return false, fmt.Errorf("container %s of pod %s/%s cannot start: %s", container, ns, name, last)
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("container %s of pod %s/%s did not terminate within %s (last waiting reason %q): %w", container, ns, name, limit, last, err)
	}
	return term, nil
}
