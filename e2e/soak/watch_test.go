package main

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The recorder fetches the log of a restarted supervisor's instance before
// as soon as the restart shows, and a done pod's log; the pod's fetch is
// over only once both are in.
func TestRecorderFetches(t *testing.T) {
	client, release := fake.NewClientset(), make(chan struct{})
	client.PrependReactor("get", "pods/log", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GenericAction).GetValue().(*corev1.PodLogOptions).Previous {
			<-release
			return true, &runtime.Unknown{Raw: []byte(`{"before"}`)}, nil
		}
		return true, &runtime.Unknown{Raw: []byte(`{"after"}`)}, nil
	})
	r := newRecorder(client, "ns")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", UID: "u1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
		InitContainerStatuses: []corev1.ContainerStatus{{Name: supervisorName, RestartCount: 1}}}}
	r.pod(t.Context(), t0, p)
	p = p.DeepCopy()
	p.Status.Phase = corev1.PodSucceeded
	r.pod(t.Context(), t0, p)
	r.mu.Lock()
	s := r.pods["u1"]
	fetched := s.fetched
	r.mu.Unlock()
	select {
	case <-fetched:
		t.Fatal("the pod's fetch over before the log of the instance before is in")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-fetched
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.log != `{"after"}` || s.prevLog != `{"before"}` || s.logErr != nil || s.prevErr != nil {
		t.Errorf("log %q (%v), previous %q (%v)", s.log, s.logErr, s.prevLog, s.prevErr)
	}
}
