package main

import (
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
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
// as jobprog.Watch's informers deliver them.
type recorder struct {
	mu   sync.Mutex
	jobs map[string]*stamps // by Job name
}

func newRecorder() *recorder { return &recorder{jobs: map[string]*stamps{}} }

func (r *recorder) expect(job string) *stamps {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &stamps{done: make(chan struct{})}
	r.jobs[job] = s
	return s
}

func (r *recorder) get(job string) stamps {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *r.jobs[job]
}

// pod and job are jobprog.Watch's handlers.
func (r *recorder) pod(now time.Time, p *corev1.Pod) {
	if !jobprog.PodDone(p) {
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

func (r *recorder) job(now time.Time, j *batchv1.Job) {
	c := jobprog.Finished(j)
	if c == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.jobs[j.Name]; s != nil && s.jobDone.IsZero() {
		s.jobDone, s.cond = now, c.Type
		close(s.done)
	}
}
