package main

import (
	"context"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
)

// podSeen is what the soak keeps of one pod: its last status, when it was
// first seen, and the supervisor's log, fetched as soon as the pod is done
// (the kubelet may remove a deleted pod's containers, logs and all, within
// a minute of its end); for a supervisor the kubelet restarted, the log of
// the instance before too, fetched as soon as the restart shows: once the
// second instance has exited too, the kubelet keeps one dead instance per
// container and removes the older (seen on the cluster: "unable to
// retrieve container logs" for a native supervisor killed during the
// stop, asked after the pod's end).
type podSeen struct {
	podObs // its pod and logs
	seen   time.Time
	done   bool // the pod is in a final phase
	// fetched is closed once log, and prevLog if its fetch had begun by
	// then, are in; prevFetched once prevLog is; sbFetched once sbLog
	// (the standby's) is. nil: not begun.
	fetched, prevFetched, sbFetched chan struct{}
}

// recorder follows the namespace's Jobs and pods through informers.
type recorder struct {
	client kubernetes.Interface
	ns     string

	mu      sync.Mutex
	pods    map[types.UID]*podSeen
	jobs    map[string]*batchv1.Job
	jobDone map[string]time.Time // when a Job's Complete or Failed condition arrived
	changed chan struct{}        // closed and replaced at each change
}

func newRecorder(client kubernetes.Interface, ns string) *recorder {
	return &recorder{client: client, ns: ns, pods: map[types.UID]*podSeen{},
		jobs: map[string]*batchv1.Job{}, jobDone: map[string]time.Time{}, changed: make(chan struct{})}
}

// start runs jobprog.Watch's informers until ctx ends and returns once
// they have synced.
func (r *recorder) start(ctx context.Context) error {
	return jobprog.Watch(ctx, r.client, r.ns, func(now time.Time, p *corev1.Pod) { r.pod(ctx, now, p) }, r.job)
}

func (r *recorder) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) pod(ctx context.Context, now time.Time, p *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.pods[p.UID]
	if s == nil {
		s = &podSeen{seen: now}
		r.pods[p.UID] = s
	}
	s.pod = p.DeepCopy()
	s.done = jobprog.PodDone(p)
	if st := status(statuses(p), supervisorName); st != nil && st.RestartCount > 0 && s.prevFetched == nil {
		s.prevFetched = r.fetch(ctx, p.Name, supervisorName, true, &s.prevLog, &s.prevErr, nil)
	}
	if s.done && s.fetched == nil {
		s.fetched = r.fetch(ctx, p.Name, supervisorName, false, &s.log, &s.logErr, &s.prevFetched)
		if status(statuses(p), standbyName) != nil {
			s.sbFetched = r.fetch(ctx, p.Name, standbyName, false, &s.sbLog, &s.sbErr, nil)
		}
	}
	r.notify()
}

func (r *recorder) job(now time.Time, j *batchv1.Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.jobs[j.Name] = j.DeepCopy()
	if jobprog.Finished(j) != nil && r.jobDone[j.Name].IsZero() {
		r.jobDone[j.Name] = now
	}
	r.notify()
}

// logTries bounds the fetch of a supervisor's log: the API server asks the
// kubelet, which may be restarting (the soak restarts it once).
const (
	logTries    = 40
	logInterval = time.Second
)

// fetch fetches, in the background, a supervisor's log (container's;
// previous: its instance's before its restart) into *log and *err, which the lock
// guards. The channel it returns is closed once they are in and, if after
// points to a fetch begun by then, once that one's are too.
func (r *recorder) fetch(ctx context.Context, name, container string, previous bool, log *string, err *error, after *chan struct{}) chan struct{} {
	done := make(chan struct{})
	go func() {
		l, e := r.supervisorLog(ctx, name, container, previous)
		r.mu.Lock()
		*log, *err = l, e
		var wait chan struct{}
		if after != nil {
			wait = *after
		}
		r.mu.Unlock()
		if wait != nil {
			<-wait // bounded: supervisorLog tries logTries times
		}
		close(done)
	}()
	return done
}

func (r *recorder) supervisorLog(ctx context.Context, name, container string, previous bool) (string, error) {
	var err error
	for i := 0; i < logTries; i++ {
		var b []byte
		b, err = r.client.CoreV1().Pods(r.ns).GetLogs(name, &corev1.PodLogOptions{Container: container, Previous: previous}).DoRaw(ctx)
		// The kubelet's own line is tried again: containerd may be
		// restarting (the soak restarts it once). Past the tries, it is
		// the answer: the log is gone. So is an empty answer: a supervisor
		// logs "starting" first, and a kubelet starting up answered a
		// finished one's log with nothing (seed 20261207, Job 47).
		if err == nil && ((len(b) > 0 && !kubeletLine(string(b))) || i == logTries-1) {
			return string(b), nil
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(logInterval):
		}
	}
	return "", err
}

// wait blocks until cond (called with the lock held) holds, ctx ends or
// limit passes; it reports whether cond held.
func (r *recorder) wait(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok, ch := cond(), r.changed
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// jobPodsLocked returns what is seen of the Job's pods (lock held).
func (r *recorder) jobPodsLocked(job string) []*podSeen {
	var out []*podSeen
	for _, s := range r.pods {
		if s.pod.Labels[batchv1.JobNameLabel] == job {
			out = append(out, s)
		}
	}
	return out
}
