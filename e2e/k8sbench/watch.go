package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// stamps are the moments this process learned, from its watches, that a
// Job's pod and the Job itself had finished: the API's own timestamps have
// whole seconds only.
type stamps struct {
	pod     string
	podDone time.Time // phase Succeeded or Failed first seen
	phase   corev1.PodPhase
	jobDone time.Time // condition Complete or Failed first seen
	cond    batchv1.JobConditionType
	done    chan struct{} // closed at jobDone
}

// recorder stamps the arrival of the pod and Job events of one namespace,
// as informers deliver them (a watch each, from the API server).
type recorder struct {
	mu   sync.Mutex
	jobs map[string]*stamps // by Job name
}

func newRecorder() *recorder { return &recorder{jobs: map[string]*stamps{}} }

// expect registers a Job about to be created.
func (r *recorder) expect(job string) *stamps {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &stamps{done: make(chan struct{})}
	r.jobs[job] = s
	return s
}

// get returns a copy of a Job's stamps taken under the lock.
func (r *recorder) get(job string) stamps {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *r.jobs[job]
}

// start runs the informers of namespace ns until ctx ends; it returns once
// their caches have synced.
func (r *recorder) start(ctx context.Context, client kubernetes.Interface, ns string) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	pods, jobs := f.Core().V1().Pods().Informer(), f.Batch().V1().Jobs().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.pod(time.Now(), o) },
		UpdateFunc: func(_, o any) { r.pod(time.Now(), o) },
	}); err != nil {
		return err
	}
	if _, err := jobs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.job(time.Now(), o) },
		UpdateFunc: func(_, o any) { r.job(time.Now(), o) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	return nil
}

func (r *recorder) pod(now time.Time, o any) {
	p, ok := o.(*corev1.Pod)
	if !ok || (p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.jobs[p.Labels[batchv1.JobNameLabel]]
	if s == nil || !s.podDone.IsZero() {
		return
	}
	s.pod, s.podDone, s.phase = p.Name, now, p.Status.Phase
}

func (r *recorder) job(now time.Time, o any) {
	j, ok := o.(*batchv1.Job)
	if !ok {
		return
	}
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue || (c.Type != batchv1.JobComplete && c.Type != batchv1.JobFailed) {
			continue
		}
		r.mu.Lock()
		if s := r.jobs[j.Name]; s != nil && s.jobDone.IsZero() {
			s.jobDone, s.cond = now, c.Type
			close(s.done)
		}
		r.mu.Unlock()
		return
	}
}
