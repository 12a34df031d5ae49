// Command k8sbench measures, on the one-node Kubernetes of e2e/cluster, how
// soon the same busybox Job completes after its app exits, and what the pod's
// containers other than the app cost, for each way of ending Istio's
// sidecar (issue 20): istio-proxy as a native sidecar, the seeds' wrappers in
// the app's command, and the supervisor added by Istio's own injector with
// our template (deploy/istio/supervisor.tmpl). The approaches run
// round-robin, one Job at a time, so that a drift in the machine's load hits
// them alike. It prints one markdown document: the run's conditions, one
// table, and how each figure is measured. Progress goes to stderr.
//
//	sudo e2e/k8sbench.sh > BENCHMARKS-k8s.md
//	go -C e2e run ./k8sbench -h        # the options
//
// As root: it starts (or joins) the cluster and reads the containers'
// cgroups on this node. The cluster is torn down at the end unless another
// user holds it (e2e/cluster).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

type options struct {
	jobs       int
	warmup     int
	appSeconds int
	jobTimeout time.Duration
	cgroup     string
	only       string
}

func main() {
	var o options
	flag.IntVar(&o.jobs, "jobs", 10, "measured Jobs per approach")
	flag.IntVar(&o.warmup, "warmup", 1, "rounds run first and not counted (images and binaries into the page cache)")
	flag.IntVar(&o.appSeconds, "app-seconds", 3, "how long the app works before it exits")
	flag.DurationVar(&o.jobTimeout, "job-timeout", 3*time.Minute, "bound on one Job; past it the run counts as failed")
	flag.StringVar(&o.cgroup, "cgroup-parent", "k8s.io", "directory of every cgroup hierarchy where containerd puts the containers' cgroups")
	flag.StringVar(&o.only, "only", "", "comma-separated approach keys to run (default: all)")
	flag.Parse()
	jobprog.Main("k8sbench", validate(o), func(ctx context.Context) (bool, error) {
		return true, run(ctx, o, os.Stdout)
	})
}

func validate(o options) error {
	switch {
	case o.jobs < 1:
		return fmt.Errorf("-jobs %d: want at least 1", o.jobs)
	case o.warmup < 0:
		return fmt.Errorf("-warmup %d: want 0 or more", o.warmup)
	case o.appSeconds < 1:
		return fmt.Errorf("-app-seconds %d: want at least 1 (the wrappers' POST needs pilot-agent up)", o.appSeconds)
	case o.jobTimeout < 30*time.Second:
		return fmt.Errorf("-job-timeout %s: want at least 30s", o.jobTimeout)
	}
	return nil
}

// logf is jobprog.Logf: progress to stderr, stdout being the report's.
var logf = jobprog.Logf

// bench is one run's shared state.
type bench struct {
	o    options
	c    *cluster.Cluster
	ns   string
	rec  *recorder
	acct *acct
	// proxyImage is the istio-proxy image, for the stand-in's approaches.
	proxyImage string
}

// result is one Job's measurement.
type result struct {
	approach  int
	job, pod  string
	failure   string    // why the run failed; "" for a Job that completed
	onSuccess string    // the supervisor's SUPERVISOR_ON_SUCCESS
	summary   string    // the supervisor's termination message
	proxy     string    // how istio-proxy ended: exit code, signal, reason
	supStart  time.Time // the supervisor's first log line ("starting")
	created   time.Time
	appExit   time.Time
	podDone   time.Time
	jobDone   time.Time
	other     usage // the containers other than the app, summed
	super     usage // the supervisor alone
	sampled   int   // containers read from the periodic sample, not at exit
}

func run(ctx context.Context, o options, out io.Writer) error {
	started := time.Now()
	load0 := measure.LoadAvg()
	code := commit() // what is measured: the tree as the run starts
	all := approaches(o.appSeconds)
	var use []int
	for i, a := range all {
		if o.only == "" || strings.Contains(","+o.only+",", ","+a.key+",") {
			use = append(use, i)
		}
	}
	if len(use) == 0 {
		return fmt.Errorf("-only %q names no approach", o.only)
	}

	e, err := jobprog.Open(ctx, jobprog.Program{Name: "k8sbench"})
	if err != nil {
		return err
	}
	defer e.Close()
	logf("images: supervisor %s, istio-proxy %s", e.SupervisorImage, e.ProxyImage)
	b := &bench{o: o, c: e.Cluster, ns: e.NS, rec: newRecorder(), proxyImage: e.ProxyImage}
	if b.acct, err = newAcct(o.cgroup, 100*time.Millisecond); err != nil {
		return err
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go b.acct.run(actx)
	if err := jobprog.Watch(actx, e.Client, b.ns, b.rec.pod, b.rec.job); err != nil {
		return err
	}

	var results []result
	rounds := o.warmup + o.jobs
	for r := 0; r < rounds; r++ {
		// The order rotates from round to round.
		for k := range use {
			i := use[(k+r)%len(use)]
			res, err := b.runJob(ctx, all[i], i, r)
			if err != nil {
				return err
			}
			tag := "measured"
			if r < o.warmup {
				tag = "warm-up"
			}
			logf("round %d/%d (%s) %s", r+1, rounds, tag, res.line())
			if r >= o.warmup {
				results = append(results, res)
			}
		}
	}
	rep := report{
		o:        o,
		all:      all,
		use:      use,
		results:  results,
		started:  started,
		took:     time.Since(started),
		loads:    [2]string{load0, measure.LoadAvg()},
		versions: e.Env,
		images:   [2]string{e.SupervisorImage, e.ProxyImage},
		commit:   code,
	}
	return rep.write(out)
}

// runJob runs one Job of approach a to its end and measures it. A failed
// run is a result; the error is for what makes the whole benchmark wrong
// (a pod the injector shaped otherwise, the cluster gone).
func (b *bench) runJob(ctx context.Context, a approach, idx, round int) (result, error) {
	name := fmt.Sprintf("%s-%d", a.key, round)
	res := result{approach: idx, job: name}
	jobs := b.c.Client.BatchV1().Jobs(b.ns)
	st := b.rec.expect(name)
	res.created = time.Now()
	if _, err := jobs.Create(ctx, a.job(name, b.proxyImage), metav1.CreateOptions{}); err != nil {
		return res, fmt.Errorf("create job %s: %w", name, err)
	}
	defer b.deleteJob(name)

	select {
	case <-st.done:
	case <-time.After(b.o.jobTimeout):
		res.failure = fmt.Sprintf("neither Complete nor Failed within %s", b.o.jobTimeout)
	case <-ctx.Done():
		return res, ctx.Err()
	}
	pod, err := b.jobPod(ctx, name)
	if err != nil {
		return res, err
	}
	res.pod = pod.Name
	problem, onSuccess := a.check(pod)
	if problem != "" {
		return res, fmt.Errorf("pod %s of approach %s: %s: the benchmark would measure something else", pod.Name, a.key, problem)
	}
	res.onSuccess = onSuccess
	s := b.rec.get(name)
	res.podDone, res.jobDone = s.podDone, s.jobDone
	switch {
	case res.failure != "":
	case s.cond != batchv1.JobComplete:
		res.failure = fmt.Sprintf("Job %s", s.cond)
	case s.phase != corev1.PodSucceeded:
		res.failure = fmt.Sprintf("pod %q", s.phase)
	}
	if res.failure != "" {
		logf("%s failed; its pod:\n%s", name, b.c.Describe(ctx, b.ns, pod.Name))
		return res, nil
	}
	logs, err := b.c.Client.CoreV1().Pods(b.ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: appName}).DoRaw(ctx)
	if err != nil {
		return res, fmt.Errorf("logs of %s: %w", pod.Name, err)
	}
	if res.appExit, err = measure.ParseAdjtimex(string(logs)); err != nil {
		res.failure = fmt.Sprintf("app's exit time: %v", err)
		return res, nil
	}
	if err := b.usage(ctx, pod, &res); err != nil {
		return res, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	if fellBack(res.summary) {
		// A fallback (POST failed, then SIGTERM): worth a look.
		logf("%s: the supervisor fell back; its pod:\n%s", name, b.c.Describe(ctx, b.ns, pod.Name))
	}
	if a.shape.hasSupervisor() {
		logs, err := b.c.Client.CoreV1().Pods(b.ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: supervisorName}).DoRaw(ctx)
		if err != nil {
			return res, fmt.Errorf("supervisor logs of %s: %w", pod.Name, err)
		}
		lines, err := measure.ParseLog(string(logs))
		if err == nil && len(lines) == 0 {
			err = errors.New("no JSON line")
		}
		if err != nil {
			return res, fmt.Errorf("supervisor log of %s: %w", pod.Name, err)
		}
		res.supStart = lines[0].At
	}
	return res, nil
}

// jobPod returns the Job's pod (backoffLimit 0: one).
func (b *bench) jobPod(ctx context.Context, job string) (*corev1.Pod, error) {
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := b.c.Client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil {
			return false, nil
		}
		pods = l.Items
		return len(pods) > 0, nil
	})
	if err != nil {
		return nil, fmt.Errorf("job %s has no pod: %w", job, err)
	}
	if len(pods) != 1 {
		return nil, fmt.Errorf("job %s has %d pods, want 1 (backoffLimit 0)", job, len(pods))
	}
	return &pods[0], nil
}

// usage reads the final cgroup figures of every container of the pod but
// the app.
func (b *bench) usage(ctx context.Context, p *corev1.Pod, res *result) error {
	ids := map[string]string{}
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if s.Name == appName {
			continue
		}
		_, id, ok := strings.Cut(s.ContainerID, "://")
		if !ok {
			return fmt.Errorf("container %s has no ID (%s)", s.Name, cluster.StateString(s.State))
		}
		ids[s.Name] = id
	}
	var list []string
	for _, id := range ids {
		list = append(list, id)
	}
	got, err := b.acct.final(ctx, list, 30*time.Second)
	if err != nil {
		return err
	}
	for name, id := range ids {
		u := got[id]
		res.other.cpu += u.cpu
		res.other.peak += u.peak
		if !u.atExit {
			res.sampled++
		}
		if name == supervisorName {
			res.super = u
		}
	}
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		t := s.State.Terminated
		switch {
		case t == nil:
		case s.Name == supervisorName:
			res.summary = strings.TrimSpace(t.Message)
		case s.Name == proxyName:
			res.proxy = fmt.Sprintf("exit %d (%s)", t.ExitCode, t.Reason)
		}
	}
	return nil
}

// deleteJob deletes a Job with its pod and waits (bounded) until the pod is
// gone, so that the next Job starts on a quiet node.
func (b *bench) deleteJob(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bg := metav1.DeletePropagationBackground
	if err := b.c.Client.BatchV1().Jobs(b.ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		logf("delete job %s: %v", name, err)
		return
	}
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		l, err := b.c.Client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		logf("the pod of job %s still exists 2m after its deletion", name)
	}
}
