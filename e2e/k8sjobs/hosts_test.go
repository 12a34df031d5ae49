package k8sjobs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// hostsRewritten shows the root cause of cloud-sql-proxy's failed starts
// on this cluster (pinHosts), on the kubelet itself: the /etc/hosts of a
// running container is written again, in place, when the kubelet starts a
// later container of the pod; a container that mounts an /etc/hosts of its
// own keeps it. The pod's first container holds the kubelet back in its
// postStart hook (the kubelet starts the next container only once the hook
// is done) until the test watches the pod's hosts file on the node with
// inotify; then the later containers start, and each start modifies it.
func (e *env) hostsRewritten(ctx context.Context, t *testing.T) {
	ns := e.namespace(ctx, t, "hosts")
	e.hostsConfigMap(ctx, t, ns)
	sleeper := func(name string) corev1.Container {
		return corev1.Container{Name: name, Image: cluster.BusyboxImage, Command: []string{"sleep", "3600"}}
	}
	first := sleeper("first")
	first.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
		Command: []string{"sh", "-c", "until [ -e /gate/go ]; do sleep 0.1; done"}}}}
	first.VolumeMounts = []corev1.VolumeMount{{Name: gateVolume, MountPath: gateDir}}
	spec := corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Containers:                    []corev1.Container{first, sleeper("pinned"), sleeper("later1"), sleeper("later2")},
		Volumes: []corev1.Volume{{Name: gateVolume,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}
	pinHostsOf(&spec, 1)
	p, err := e.c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hosts"}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}

	// The kubelet makes the pod's hosts file as it starts the first
	// container, whose hook then waits.
	podDir := filepath.Join(e.c.Dir, "kubelet", "pods", string(p.UID))
	hosts := filepath.Join(podDir, "etc-hosts")
	gateGo := filepath.Join(podDir, "volumes", "kubernetes.io~empty-dir", gateVolume, "go")
	deadline := time.Now().Add(jobLimit)
	for {
		_, errHosts := os.Stat(hosts)
		_, errGate := os.Stat(filepath.Dir(gateGo))
		if errHosts == nil && errGate == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: no %s and %s within %s: %v, %v", p.Name, hosts, filepath.Dir(gateGo), jobLimit, errHosts, errGate)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatalf("inotify_init1: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, hosts, unix.IN_MODIFY); err != nil {
		t.Fatalf("inotify_add_watch %s: %v", hosts, err)
	}
	if err := os.WriteFile(gateGo, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// Each later container's start is done once it runs: its hosts file
	// was written before.
	e.waitRunning(ctx, t, *p, "later2", 0)
	modified := 0
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatalf("read inotify: %v", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if ev.Mask&unix.IN_MODIFY != 0 {
				modified++
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	if modified == 0 {
		t.Errorf("pod %s: the kubelet's hosts file %s was not modified while later1 and later2 started", p.Name, hosts)
	} else {
		t.Logf("pod %s: the kubelet's hosts file, mounted in the running container first, modified as later1 and later2 started (%d inotify event(s): repeated ones merge)", p.Name, modified)
	}

	// What each container reads: first the kubelet's file, pinned its own.
	for _, c := range []struct{ name, want string }{{"first", "Kubernetes-managed hosts file"}, {"pinned", hostsContent}} {
		out, err := e.c.Exec(ctx, ns, p.Name, c.name, "cat", "/etc/hosts")
		if err != nil {
			t.Fatalf("exec cat /etc/hosts in %s: %v\n%s", c.name, err, out)
		}
		if !strings.Contains(out, c.want) || (c.name == "pinned" && out != c.want) {
			t.Errorf("container %s reads /etc/hosts %q, want %q", c.name, out, c.want)
		}
	}
}
