package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
)

// unfinalize removes the soak's finalizer and keeps the others.
func TestUnfinalize(t *testing.T) {
	for _, tc := range []struct{ before, after []string }{
		{[]string{finalizer}, nil},
		{[]string{"batch.kubernetes.io/job-tracking", finalizer}, []string{"batch.kubernetes.io/job-tracking"}},
		{[]string{"batch.kubernetes.io/job-tracking"}, []string{"batch.kubernetes.io/job-tracking"}},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "ns", Finalizers: tc.before}}
		c := &cluster.Cluster{Client: fake.NewClientset(p)}
		unfinalize(t.Context(), c, *p)
		got, err := c.Client.CoreV1().Pods("ns").Get(t.Context(), "p1", metav1.GetOptions{})
		if err != nil || !slices.Equal(got.Finalizers, tc.after) {
			t.Errorf("%q: finalizers %q (%v), want %q", tc.before, got.Finalizers, err, tc.after)
		}
	}
}

// deleteMidRun deletes the pod in which every app's first instance there
// has stamped its start, and none while the apps' starts are in two pods.
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
				os.WriteFile(filepath.Join(dir, fmt.Sprintf("app%d.times", i+1)), []byte(st+" status: 8193 time.tv_sec: 1 time.tv_usec: 0\n"), 0o644)
			}
		}
		tl := timeline{restart: corev1.RestartPolicyNever, deletePod: 1, apps: []appPlan{
			{name: "app1", steps: []step{{time.Minute, 0}}}, {name: "app2", steps: []step{{time.Minute, 0}}}}}
		tl.want = tl.oracle()
		pods := []runtime.Object{}
		for _, name := range []string{"p1", "p2"} {
			pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}})
		}
		s := &soak{c: &cluster.Cluster{Client: fake.NewClientset(pods...)}, ns: "ns"}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := s.deleteMidRun(ctx, tl, dir)
		cancel()
		l, _ := s.c.Client.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{})
		if (err == nil) != tc.deleted || (len(l.Items) == 1) != tc.deleted || tc.deleted && l.Items[0].Name != "p2" {
			t.Errorf("stamps %q: %v, pods left %v", tc.stamps, err, l.Items)
		}
	}
}
