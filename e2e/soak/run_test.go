package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// fakeSoak is a soak on a fake API with pods, each with the soak's
// finalizer after another.
func fakeSoak(pods ...string) *soak {
	c := fake.NewClientset()
	for _, name := range pods {
		c.Tracker().Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Finalizers: []string{"other", finalizer}}})
	}
	return &soak{c: &cluster.Cluster{Client: c}, ns: "ns"}
}

// unfinalize removes the soak's finalizer and keeps the others, reading
// the pod again when the one it has is stale.
func TestUnfinalize(t *testing.T) {
	s := fakeSoak("p1")
	p, _ := s.c.Client.CoreV1().Pods("ns").Get(t.Context(), "p1", metav1.GetOptions{})
	unfinalize(t.Context(), s.c, *p)
	unfinalize(t.Context(), s.c, *p)
	if p, _ = s.c.Client.CoreV1().Pods("ns").Get(t.Context(), "p1", metav1.GetOptions{}); !slices.Equal(p.Finalizers, []string{"other"}) {
		t.Errorf("finalizers %q, want other only", p.Finalizers)
	}
}

// deleteMidRun deletes the pod in which every app's first instance has
// stamped its start, and none while the apps' starts are in two pods.
func TestDeleteMidRun(t *testing.T) {
	for _, tc := range []struct {
		stamps  [2]string // app1's, app2's
		deleted bool
	}{
		{[2]string{"start 1 p1", "start 1 p1"}, true},
		{[2]string{"start 1 p1", ""}, false},
		{[2]string{"start 1 p1", "start 1 p2"}, false},
	} {
		dir := t.TempDir()
		for i, st := range tc.stamps {
			if st != "" {
				os.WriteFile(filepath.Join(dir, []string{"app1", "app2"}[i]+".times"), []byte(st+" status: 8193 time.tv_sec: 1 time.tv_usec: 0\n"), 0o644)
			}
		}
		tl := timeline{restart: corev1.RestartPolicyNever, deletePod: 1, apps: []appPlan{
			{name: "app1", steps: []step{{time.Minute, 0}}}, {name: "app2", steps: []step{{time.Minute, 0}}}}}
		tl.want = tl.oracle()
		s := fakeSoak("p1", "p2")
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := s.deleteMidRun(ctx, tl, dir)
		cancel()
		l, _ := s.c.Client.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{})
		if (err == nil) != tc.deleted || (len(l.Items) == 1) != tc.deleted || l.Items[len(l.Items)-1].Name != "p2" {
			t.Errorf("stamps %q: %v, %d pods left", tc.stamps, err, len(l.Items))
		}
	}
}
