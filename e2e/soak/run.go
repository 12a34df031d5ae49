package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// nsLabel marks the soak's namespaces, so that the next run removes one a
// killed run left (its pods hold the soak's finalizer): jobprog's Leftovers.
const nsLabel = "sidecar-supervisor-e2e/soak"

// soak is one run's shared state.
type soak struct {
	o   options
	c   *cluster.Cluster
	ns  string
	dir string // the Jobs' directories on the node
	out string // the details of the Jobs failed, killed or late
	rec *recorder

	mu       sync.Mutex
	inflight map[int]bool
}

// result is one Job's run.
type result struct {
	t        timeline
	v        verdict
	took     time.Duration
	across   []string        // the daemons restarted while it ran
	startLat []time.Duration // per pod: first seen to its first app's start
	pods     int
	detail   string // where its details went: failed, killed or late
}

// restart is one restart of a node daemon mid-soak.
type restart struct {
	daemon string
	at     time.Time
	took   time.Duration
	err    error
	jobs   []int // running across it
}

func run(ctx context.Context, o options, out io.Writer) (bool, error) {
	started := time.Now()
	load0 := measure.LoadAvg()
	idx := o.only
	if len(idx) == 0 {
		for i := 0; i < o.jobs; i++ {
			idx = append(idx, i)
		}
	}
	tls := make([]timeline, len(idx))
	for k, i := range idx {
		tls[k] = generate(o.seed, i)
	}
	logf("seed %d: %d Jobs, %d at a time", o.seed, len(tls), o.parallel)

	e, err := jobprog.Open(ctx, jobprog.Program{Name: "soak", Leftovers: nsLabel, BeforeDelete: unfinalizeAll})
	if err != nil {
		return false, err
	}
	defer e.Close()
	s := &soak{o: o, c: e.Cluster, ns: e.NS, inflight: map[int]bool{}}
	if s.dir, err = os.MkdirTemp("", "sidecar-supervisor-soak-"); err != nil {
		return false, err
	}
	defer os.RemoveAll(s.dir)
	s.out = o.out
	s.out = cmp.Or(s.out, fmt.Sprintf("%s-seed%d-failures", s.dir, o.seed))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.rec = newRecorder(e.Client, s.ns)
	if err := s.rec.start(rctx); err != nil {
		return false, err
	}

	// The restarts come before the Jobs at a third and two thirds start.
	at := map[int]string{}
	if o.restarts && len(tls) >= 3 {
		at[len(tls)/3], at[2*len(tls)/3] = "kubelet", "containerd"
	}
	results := make([]result, len(tls))
	var restarts []restart
	var rmu sync.Mutex
	// One restart at a time, in order: each waits for the one before.
	prev := make(chan struct{})
	close(prev)
	slots := make(chan struct{}, o.parallel)
	var wg sync.WaitGroup
	for k, t := range tls {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if d := at[k]; d != "" {
			// Once the window is busy again, while the Jobs keep coming.
			before, done := prev, make(chan struct{})
			wg.Go(func() {
				defer close(done)
				<-before
				s.busy(ctx)
				r := s.restart(ctx, d)
				rmu.Lock()
				restarts = append(restarts, r)
				rmu.Unlock()
			})
			prev = done
		}
		wg.Go(func() {
			defer func() { <-slots }()
			results[k] = s.runJob(ctx, t)
			r := results[k]
			state := "ok"
			if !r.v.ok() {
				state = "FAILED (" + r.detail + ")"
			}
			logf("%s %s in %s: %s", t.name(), state, r.took.Round(time.Second), t)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	for _, r := range restarts {
		for _, i := range r.jobs {
			for k := range results {
				if results[k].t.index == i {
					results[k].across = append(results[k].across, r.daemon)
				}
			}
		}
	}
	rep := report{
		o:        o,
		results:  results,
		restarts: restarts,
		started:  started,
		took:     time.Since(started),
		loads:    [2]string{load0, measure.LoadAvg()},
		images:   [2]string{e.SupervisorImage, e.ProxyImage},
		out:      s.out,
	}
	return rep.ok(), rep.write(out)
}

// unfinalizeAll removes the soak's finalizer from every pod of namespace ns,
// which could not go otherwise.
func unfinalizeAll(ctx context.Context, c *cluster.Cluster, ns string) {
	if pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			unfinalize(ctx, c, p)
		}
	}
}

func unfinalize(ctx context.Context, c *cluster.Cluster, p corev1.Pod) {
	pods := c.Client.CoreV1().Pods(p.Namespace)
	for try := 0; ; try++ {
		keep := slices.DeleteFunc(slices.Clone(p.Finalizers), func(f string) bool { return f == finalizer })
		if len(keep) == len(p.Finalizers) {
			return
		}
		// A JSON patch with a test: the Job controller removes its own
		// finalizer concurrently.
		patch, _ := json.Marshal([]map[string]any{{"op": "test", "path": "/metadata/finalizers", "value": p.Finalizers},
			{"op": "replace", "path": "/metadata/finalizers", "value": keep}})
		_, err := pods.Patch(ctx, p.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		if err == nil || apierrors.IsNotFound(err) {
			return
		}
		if try == 10 {
			logf("remove the finalizer of pod %s: %v", p.Name, err)
			return
		}
		cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) {
				logf("remove the finalizer of pod %s: %v", p.Name, err)
			}
			return
		}
		p = *cur
	}
}

// busy waits, up to 3 minutes, until the window is full but for the slot
// just taken, and at least half of its Jobs have an app running or done
// (its stamps exist): a restart then hits Jobs at every stage.
func (s *soak) busy(ctx context.Context) {
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		started := 0
		for i := range s.inflight {
			if m, _ := filepath.Glob(filepath.Join(s.dir, timeline{index: i}.name(), "*.times")); len(m) > 0 {
				started++
			}
		}
		return len(s.inflight) >= s.o.parallel-1 && 2*started >= len(s.inflight), nil
	})
}

// restart restarts a node daemon and notes the Jobs running across it.
func (s *soak) restart(ctx context.Context, daemon string) restart {
	r := restart{daemon: daemon, at: time.Now()}
	s.mu.Lock()
	for i := range s.inflight {
		r.jobs = append(r.jobs, i)
	}
	s.mu.Unlock()
	sort.Ints(r.jobs)
	logf("restarting %s with %d Jobs running", daemon, len(r.jobs))
	r.err = s.c.RestartDaemon(ctx, daemon)
	r.took = time.Since(r.at)
	if r.err != nil {
		logf("restart %s: %v", daemon, r.err)
	} else {
		logf("%s restarted in %s", daemon, r.took.Round(100*time.Millisecond))
	}
	return r
}

// runJob runs one timeline's Job to its end, checks it, and removes it.
func (s *soak) runJob(ctx context.Context, t timeline) result {
	res := result{t: t}
	name := t.name()
	dir := filepath.Join(s.dir, name)
	if err := os.Mkdir(dir, 0o777); err != nil {
		res.v.add(invCondition, "job directory: %v", err)
		return res
	}
	s.mu.Lock()
	s.inflight[t.index] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.inflight, t.index)
		s.mu.Unlock()
	}()
	created := time.Now()
	j := t.job(dir)
	if s.o.standby {
		a := j.Spec.Template.Annotations
		if a == nil {
			a = map[string]string{}
		}
		a[standbyAnnotation] = "true"
		j.Spec.Template.Annotations = a
	}
	if _, err := s.c.Client.BatchV1().Jobs(s.ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		res.v.add(invCondition, "create: %v", err)
		return res
	}
	defer s.removeJob(name)
	var deletion error
	var dwg sync.WaitGroup
	if t.deletePod > 0 {
		dwg.Go(func() { deletion = s.deleteMidRun(ctx, t, dir) })
	}
	var o observed
	// The kill's moment passes before the Job's end, or never will.
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	if t.kill != nil {
		dwg.Go(func() {
			k := s.killSupervisor(kctx, t, dir)
			o.kill = &k
		})
	}

	s.rec.wait(ctx, s.o.jobTimeout, func() bool {
		j := s.rec.jobs[name]
		return j != nil && jobprog.Finished(j) != nil
	})
	kcancel()
	s.rec.mu.Lock()
	if j := s.rec.jobs[name]; j != nil {
		if c := jobprog.Finished(j); c != nil {
			cc := *c
			o.cond = &cc
			res.took = s.rec.jobDone[name].Sub(created)
		}
	}
	s.rec.mu.Unlock()
	if o.cond == nil {
		res.took = time.Since(created)
	}
	dwg.Wait()
	// The Job's condition may come before its pods' final status.
	s.rec.wait(ctx, 2*time.Minute, func() bool {
		for _, p := range s.rec.jobPodsLocked(name) {
			if !p.done {
				return false
			}
		}
		return true
	})
	s.rec.mu.Lock()
	seen := s.rec.jobPodsLocked(name)
	s.rec.mu.Unlock()
	for _, p := range seen {
		s.rec.mu.Lock()
		fetched, sbFetched := p.fetched, p.sbFetched
		s.rec.mu.Unlock()
		for _, ch := range []chan struct{}{fetched, sbFetched} {
			if ch != nil {
				// Bounded by fetch's tries.
				select {
				case <-ch:
				case <-ctx.Done():
				}
			}
		}
		s.rec.mu.Lock()
		obs := p.podObs
		s.rec.mu.Unlock()
		if fetched == nil {
			// The pod never reached a final phase: its supervisor's log as
			// it is now (seed 20261217, Job 64, had none to read).
			obs.log, obs.logErr = s.rec.supervisorLog(ctx, obs.pod.Name, supervisorName, false)
			if status(statuses(obs.pod), standbyName) != nil {
				obs.sbLog, obs.sbErr = s.rec.supervisorLog(ctx, obs.pod.Name, standbyName, false)
			}
		}
		obs.running, obs.crictlErr = s.running(ctx, obs.pod.UID)
		o.pods = append(o.pods, obs)
	}
	o.inst, o.stampErr = readStamps(dir, t.apps)
	for _, p := range seen {
		var first time.Time
		for _, in := range all(o.inst) {
			if in.pod == p.pod.Name && (first.IsZero() || in.start.Before(first)) {
				first = in.start
			}
		}
		if !first.IsZero() {
			res.startLat = append(res.startLat, first.Sub(p.seen))
		}
	}
	res.pods = len(o.pods)
	res.v = checkJob(t, o)
	if deletion != nil {
		res.v.add(invCondition, "deleting pod %d mid-run: %v", t.deletePod, deletion)
	}
	if !res.v.ok() || t.kill != nil || len(res.v.late()) > 0 {
		res.detail = s.writeDetail(ctx, t, o, res.v)
	}
	return res
}

func readStamps(dir string, apps []appPlan) (map[string][]instance, error) {
	out := map[string][]instance{}
	var errs []error
	for _, a := range apps {
		b, err := os.ReadFile(filepath.Join(dir, a.name+".times"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		list, err := parseStamps(a.name, string(b))
		if err != nil {
			errs = append(errs, err)
		}
		out[a.name] = list
	}
	return out, errors.Join(errs...)
}

// deleteMidRun deletes the timeline's pod to delete once all its apps have
// stamped their start, deleteAfter later.
func (s *soak) deleteMidRun(ctx context.Context, t timeline, dir string) error {
	want := t.want.pods[t.deletePod-1].first
	var pod string
	pctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := pollStamps(pctx, dir, t, 200*time.Millisecond, func(inst map[string][]instance) bool {
		pod = ""
		for _, a := range t.apps {
			x := find(inst[a.name], want[a.name])
			if x == nil || (pod != "" && x.pod != pod) {
				return false
			}
			pod = x.pod
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("its apps did not all start within 3m: %w", err)
	}
	select {
	case <-time.After(t.deleteAfter):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := s.c.Client.CoreV1().Pods(s.ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete pod %s: %w", pod, err)
	}
	logf("%s: deleted pod %s", t.name(), pod)
	return nil
}

func (s *soak) running(ctx context.Context, uid types.UID) (ids []string, err error) {
	err = retry(ctx, func() error {
		out, err := s.crictl(ctx, "ps", "-q", "--state", "running", "--label", "io.kubernetes.pod.uid="+string(uid))
		ids = strings.Fields(out)
		return err
	})
	return ids, err
}

// retry calls f until it succeeds, up to 30 times a second apart:
// containerd may be restarting.
func retry(ctx context.Context, f func() error) error {
	var err error
	for try := 0; try < 30; try++ {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
	return err
}

func (s *soak) crictl(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"--runtime-endpoint", "unix://" + s.c.Env["CONTAINERD_SOCK"], "--timeout", "10s"}, args...)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, s.c.Env["CRICTL"], args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("crictl %s: %w: %s", strings.Join(args[4:], " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

func (s *soak) removeJob(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bg := metav1.DeletePropagationBackground
	if err := s.c.Client.BatchV1().Jobs(s.ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		logf("delete job %s: %v", name, err)
	}
	l, err := s.c.Client.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
	if err != nil {
		logf("list the pods of job %s: %v", name, err)
		return
	}
	for _, p := range l.Items {
		unfinalize(ctx, s.c, p)
	}
}

// writeDetail writes what a failed Job's report needs: its timeline, the
// problems, its pods' statuses and logs, the apps' stamps, and returns the
// file's path.
func (s *soak) writeDetail(ctx context.Context, t timeline, o observed, v verdict) string {
	if err := os.MkdirAll(s.out, 0o755); err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, Job %d (%s): %s\n\n", s.o.seed, t.index, t.name(), t)
	for i, ps := range v.problems {
		for _, p := range ps {
			fmt.Fprintf(&b, "%s: %s\n", invariantNames[i], p)
		}
	}
	for _, u := range v.unchecked {
		fmt.Fprintf(&b, "unchecked: %s\n", u)
	}
	if k := o.kill; k != nil {
		fmt.Fprintf(&b, "kill: pod %s, container %s, pid %d, planned %s, sent %s, err %v\n",
			k.pod, k.id, k.pid, clock(k.planned), clock(k.at), k.err)
	}
	if k := v.kill; k != nil {
		fmt.Fprintf(&b, "kill outcome: %s\n", k)
	}
	b.WriteString("\n== stamps\n")
	for _, a := range t.apps {
		for _, in := range o.inst[a.name] {
			fmt.Fprintf(&b, "%s\n", in)
		}
	}
	for _, p := range o.pods {
		fmt.Fprintf(&b, "\n== pod %s (uid %s, deletion %v)\n", p.pod.Name, p.pod.UID, p.pod.DeletionTimestamp)
		for _, st := range statuses(p.pod) {
			fmt.Fprintf(&b, "  %s: restarts %d, %s; last %s\n", st.Name, st.RestartCount, cluster.StateString(st.State), cluster.StateString(st.LastTerminationState))
		}
		if p.prevLog != "" || p.prevErr != nil {
			fmt.Fprintf(&b, "-- supervisor log, the instance before its restart (err %v)\n%s\n", p.prevErr, p.prevLog)
		}
		fmt.Fprintf(&b, "-- supervisor log (err %v)\n%s\n", p.logErr, p.log)
		if p.sbLog != "" || p.sbErr != nil {
			fmt.Fprintf(&b, "-- standby's log (err %v)\n%s\n", p.sbErr, p.sbLog)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, p := range o.pods {
		for _, st := range p.pod.Status.ContainerStatuses {
			if st.Name == supervisorName {
				continue
			}
			for _, prev := range []bool{true, false} {
				if prev && st.RestartCount == 0 {
					continue
				}
				logs, err := s.c.Client.CoreV1().Pods(s.ns).GetLogs(p.pod.Name, &corev1.PodLogOptions{Container: st.Name, Previous: prev}).DoRaw(dctx)
				fmt.Fprintf(&b, "\n-- %s/%s log (previous %v, err %v)\n%s", p.pod.Name, st.Name, prev, err, logs)
			}
		}
	}
	if ev, err := s.c.Client.CoreV1().Events(s.ns).List(dctx, metav1.ListOptions{}); err == nil {
		b.WriteString("\n== events\n")
		for _, e := range ev.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, t.name()) {
				fmt.Fprintf(&b, "%s %s %s/%s: %s %s\n", e.LastTimestamp.UTC().Format(time.TimeOnly), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	fmt.Fprintf(&b, "\n== kubelet log (tail)\n%s\n", s.c.DaemonLog("kubelet", 60))
	path := filepath.Join(s.out, t.name()+".txt")
	switch {
	case v.ok() && t.kill != nil:
		path = filepath.Join(s.out, t.name()+"-killed.txt")
	case v.ok():
		path = filepath.Join(s.out, t.name()+"-late.txt")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err.Error()
	}
	return path
}
