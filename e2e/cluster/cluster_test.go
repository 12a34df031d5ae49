package cluster

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// startCluster is Start for a test, failing it on an error, and returns the
// cluster with the test's context: 35 minutes, room for a first start that
// installs and builds what is missing.
func startCluster(t *testing.T) (context.Context, *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	t.Cleanup(cancel)
	c, err := Start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, c
}

// TestSmoke proves the cluster is a working Kubernetes for what the product
// needs: the scheduler places a pod (no nodeName is set), containerd runs it
// with a shared PID namespace in which one container sees the other's process
// and the pause process as PID 1, and the Job controller of
// kube-controller-manager marks a Job that exits 0 Complete.
func TestSmoke(t *testing.T) {
	ctx, c := startCluster(t)
	ns := c.Namespace(ctx, t, "smoke")

	t.Run("SharedProcessNamespace", func(t *testing.T) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "shared-pid"},
			Spec: corev1.PodSpec{
				ShareProcessNamespace:         ptr.To(true),
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{
					{
						Name:    "app",
						Image:   BusyboxImage,
						Command: []string{"sleep", "3600"},
					},
					{
						// Waits until the app's sleep shows up, then prints the
						// process table and exits 0. WaitTerminated bounds the
						// wait; the pod's log then shows what was visible.
						Name:  "watcher",
						Image: BusyboxImage,
						Command: []string{"sh", "-c", `until ps -o pid,args | grep -q '[s]leep 3600'; do sleep 0.2; done
ps -o pid,args; exit 0`},
					},
				},
			},
		}
		c.DumpOnFailure(t, ns, pod.Name)
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod: %v", err)
		}
		watcher, err := c.WaitTerminated(ctx, ns, pod.Name, "watcher", 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		logs, err := c.Client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "watcher"}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs of the watcher container: %v", err)
		}
		t.Logf("watcher saw:\n%s", logs)
		if watcher.ExitCode != 0 {
			t.Fatalf("watcher exited %d (reason %q): it did not see the app's process", watcher.ExitCode, watcher.Reason)
		}
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^\s*1\s+/pause\b`), // the sandbox is PID 1
			regexp.MustCompile(`(?m)^\s*\d+\s+sleep 3600$`),
			regexp.MustCompile(`(?m)^\s*\d+\s+sh -c until ps`), // the watcher itself
		} {
			if !want.Match(logs) {
				t.Errorf("watcher's process table has no line matching %s", want)
			}
		}
	})

	t.Run("JobCompletes", func(t *testing.T) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "exit-zero"},
			Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"test": "exit-zero"}},
					Spec: corev1.PodSpec{
						RestartPolicy:                 corev1.RestartPolicyNever,
						TerminationGracePeriodSeconds: ptr.To[int64](1),
						Containers: []corev1.Container{{
							Name:    "main",
							Image:   BusyboxImage,
							Command: []string{"sh", "-c", "echo job ran; exit 0"},
						}},
					},
				},
			},
		}
		c.DumpOnFailure(t, ns, "")
		if _, err := c.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create job: %v", err)
		}
		var conds []batchv1.JobCondition
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			j, err := c.Client.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds = j.Status.Conditions
			for _, cond := range conds {
				if cond.Status == corev1.ConditionTrue && (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("job reached neither Complete nor Failed within 2m (conditions %+v): %v", conds, err)
		}
		if !hasCondition(conds, batchv1.JobComplete) {
			t.Fatalf("job did not complete; conditions: %+v", conds)
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "test=exit-zero"})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("want the job's one pod, got %d (err %v)", len(pods.Items), err)
		}
		logs, err := c.Client.CoreV1().Pods(ns).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs of the job's pod: %v", err)
		}
		if got := strings.TrimSpace(string(logs)); got != "job ran" {
			t.Errorf("job pod's log = %q, want %q", got, "job ran")
		}
	})
}

// TestImages imports the product image and the istio-proxy image with
// ImportImage and runs each once: the name resolves on the node without a
// pull (imagePullPolicy Never), the entrypoint exists, and the static binary
// runs as uid 1337 on an empty filesystem.
func TestImages(t *testing.T) {
	ctx, c := startCluster(t)
	ns := c.Namespace(ctx, t, "images")

	for _, tc := range []struct {
		name     string
		build    func(context.Context) (Image, error)
		args     []string
		wantExit int32
		wantLog  string
	}{
		// probe-exit: the supervisor's start-up probe child, which exits 7 at once.
		{name: "supervisor", build: c.BuildSupervisorImage, args: []string{"probe-exit"}, wantExit: 7},
		{name: "istio-proxy", build: c.BuildIstioProxyImage, args: []string{"version", "--short"}, wantExit: 0, wantLog: "version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := tc.build(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.ImportImage(ctx, img.Archive); err != nil {
				t.Fatal(err)
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name:            "main",
						Image:           img.Ref,
						ImagePullPolicy: corev1.PullNever,
						Args:            tc.args,
					}},
				},
			}
			c.DumpOnFailure(t, ns, pod.Name)
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod: %v", err)
			}
			term, err := c.WaitTerminated(ctx, ns, pod.Name, "main", 2*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			logs, err := c.Client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
			if err != nil {
				t.Fatalf("logs: %v", err)
			}
			if term.ExitCode != tc.wantExit {
				t.Errorf("%s %v exited %d (%s), want %d; log:\n%s", img.Ref, tc.args, term.ExitCode, term.Reason, tc.wantExit, logs)
			}
			if !strings.Contains(string(logs), tc.wantLog) {
				t.Errorf("log of %s %v lacks %q:\n%s", img.Ref, tc.args, tc.wantLog, logs)
			}
		})
	}
}

func hasCondition(conds []batchv1.JobCondition, typ batchv1.JobConditionType) bool {
	for _, c := range conds {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// TestRestartDaemons: the soak restarts the node's kubelet and containerd
// mid-run (Cluster.RestartDaemon, scripts/cluster-restart.sh); each must
// come back: the kubelet healthy, containerd's CRI runtime ready (its
// RuntimeReady condition, whatever the order crictl prints its keys in),
// the node Ready.
func TestRestartDaemons(t *testing.T) {
	ctx, c := startCluster(t)
	for _, d := range []string{"kubelet", "containerd"} {
		if err := c.RestartDaemon(ctx, d); err != nil {
			t.Errorf("restart %s: %v\n%s", d, err, c.DaemonLog(d, 30))
		}
	}
}
