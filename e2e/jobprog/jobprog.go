// Package jobprog is the skeleton the cluster programs k8sbench and soak
// share: both run Jobs on the one-node Kubernetes of e2e/cluster, in a
// namespace of their own where Istio's injector (served by this process)
// puts istio-proxy and the supervisor into the pods, and both stamp the
// moments their pods and Jobs finish as the API server's watch delivers them.
// What each measures or checks stays in the program; what is here is what
// they would otherwise each get right, and keep right, on their own: the
// process's exit codes and logging, the cluster and injector set up and torn
// down in order, the namespace's life and the informers.
package jobprog

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

// Logf logs progress to stderr, which the programs keep for it: stdout
// carries their report. Not the standard logger: Istio's packages redirect
// that one into their own.
var Logf = log.New(os.Stderr, "", log.Ltime).Printf

// Main runs a program's body once its flags are parsed; flagErr is what
// checking them found. A bad flag exits 2; an error, or a run that is not
// ok (an invariant broken), exits 1. Istio's packages log to stdout, which
// carries the report, so they are sent to stderr first; SIGINT and SIGTERM
// cancel run's context, so that the deferred clean-up (the namespace, the
// webhook, the cluster) still runs.
func Main(name string, flagErr error, run func(ctx context.Context) (ok bool, err error)) {
	if flagErr != nil {
		Logf("%v", flagErr)
		os.Exit(2)
	}
	if err := injector.LogToStderr(); err != nil {
		Logf("configure istio's log: %v", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ok, err := run(ctx)
	stop()
	if err != nil {
		Logf("%s: %v", name, err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// Program says how a program's Env differs from the other's.
type Program struct {
	// Name is the program's: its namespace's prefix and the injector's
	// owner.
	Name string
	// Leftovers, if set, is a label put on the run's namespace: namespaces
	// carrying it, left by a killed run, are removed before the new one is
	// made (the soak's, whose pods hold a finalizer, would stay forever).
	Leftovers string
	// BeforeDelete, if set, runs before a namespace is deleted: the soak
	// removes its pods' finalizers there.
	BeforeDelete func(ctx context.Context, c *cluster.Cluster, ns string)
}

// Env is a program's cluster, with Istio's injector registered for its
// namespace NS. Close undoes it.
type Env struct {
	*cluster.Cluster
	NS                          string
	SupervisorImage, ProxyImage string

	p    Program
	hook *injector.Served
}

// Open opens (or joins) the cluster, serves Istio's injector with the
// cluster's product images, and makes the run's namespace under it. On an
// error what was set up is already undone.
func Open(ctx context.Context, p Program) (e *Env, err error) {
	e = &Env{p: p}
	defer func() {
		if err != nil {
			e.Close()
			e = nil
		}
	}()
	if e.Cluster, err = cluster.Open(ctx, Logf); err != nil {
		return e, err
	}
	if e.SupervisorImage, e.ProxyImage, err = e.ProductImages(ctx); err != nil {
		return e, err
	}
	in, err := injector.ClusterInstall(e.ProxyImage)
	if err != nil {
		return e, err
	}
	if e.hook, err = injector.Serve(ctx, e.Client, in, p.Name, log.New(os.Stderr, "injector: ", log.Ltime)); err != nil {
		return e, err
	}
	var labels map[string]string
	if p.Leftovers != "" {
		labels = map[string]string{p.Leftovers: "true"}
		e.removeLeftovers(ctx)
	}
	if e.NS, err = e.CreateNamespace(ctx, p.Name, labels); err != nil {
		return e, err
	}
	return e, e.hook.PrepareNamespace(ctx, e.NS)
}

// Close deletes the namespace, unregisters the injector and stops the
// cluster (unless another user holds it), logging what fails: a program
// calls it on its way out, with nothing left to return an error to.
func (e *Env) Close() {
	if e.NS != "" {
		e.deleteNamespace(e.NS)
	}
	if e.hook != nil {
		if err := e.hook.Close(); err != nil {
			Logf("%v", err)
		}
	}
	if e.Cluster != nil {
		if err := e.Stop(); err != nil {
			Logf("stop the cluster: %v", err)
		}
	}
}

// removeLeftovers removes the namespaces a killed run left.
func (e *Env) removeLeftovers(ctx context.Context) {
	l, err := e.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: e.p.Leftovers})
	if err != nil {
		Logf("list the namespaces of earlier runs: %v", err)
		return
	}
	for _, ns := range l.Items {
		Logf("removing namespace %s, left by an earlier run", ns.Name)
		e.deleteNamespace(ns.Name)
	}
}

// deleteNamespace deletes a namespace without waiting for it to go: the
// next run's is a new one.
func (e *Env) deleteNamespace(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.p.BeforeDelete != nil {
		e.p.BeforeDelete(ctx, e.Cluster, ns)
	}
	if err := e.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		Logf("delete namespace %s: %v", ns, err)
	}
}

// Watch runs informers on the pods and Jobs of namespace ns until ctx ends,
// and returns once their caches have synced. Each pod or Job added or
// updated goes to pod or job with the moment its event arrived: the
// programs time the ends of pods and Jobs by these, the API's own
// timestamps having whole seconds only.
func Watch(ctx context.Context, client kubernetes.Interface, ns string, pod func(time.Time, *corev1.Pod), job func(time.Time, *batchv1.Job)) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	if _, err := f.Core().V1().Pods().Informer().AddEventHandler(stamped(pod)); err != nil {
		return err
	}
	if _, err := f.Batch().V1().Jobs().Informer().AddEventHandler(stamped(job)); err != nil {
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

// stamped is the handler that passes added and updated objects of type T
// to f with the time of their arrival (deletions matter to neither
// program: their pods' last status comes as an update).
func stamped[T any](f func(time.Time, T)) cache.ResourceEventHandlerFuncs {
	on := func(o any) {
		if v, ok := o.(T); ok {
			f(time.Now(), v)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, o any) { on(o) }}
}

// Finished returns the Job's Complete or Failed condition, if it has one.
func Finished(j *batchv1.Job) *batchv1.JobCondition {
	for i, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

// PodDone tells whether the pod is in a final phase (every container
// terminated, as the kubelet sees it).
func PodDone(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
