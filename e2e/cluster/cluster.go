// Package cluster gives the e2e tests a real one-node Kubernetes: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet on
// containerd (with runc and a host-only bridge network), all on 127.0.0.1,
// started by e2e/scripts/cluster-up.sh from binaries built at
// KUBERNETES_VERSION (e2e/versions.env) and stopped by cluster-down.sh.
//
//	c, err := cluster.Start(ctx, t) // skips the test when not root
//	if err != nil { t.Fatal(err) }
//	// c.Client (client-go), c.Kubeconfig, c.ImportImage(ctx, archive)
//	// Stop runs by itself in t.Cleanup.
//
// A program (e2e/k8sbench) calls Open instead, and Stop itself.
//
// A cold start builds the Kubernetes binaries (about ten minutes on two
// cores): run such tests with `go test -timeout 40m`.
//
// The cluster is shared: Start reuses a healthy cluster started by another
// test or test binary (packages run in parallel under `go test ./...`), and the
// last user's Stop tears it down. Two lock files next to the state directory
// arbitrate (locks.go): a start lock, held exclusively while starting, tearing
// down or restarting a daemon, and a users lock that every Cluster holds
// shared while it is in use. Start waits for the start lock as long as its
// holder works, bounded by its ctx only; Stop never waits for it. Set
// SUPERVISOR_E2E_KEEP_CLUSTER=1 to leave the cluster running after the tests
// (cluster-down.sh removes it).
package cluster

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
)

// Cluster is a running one-node cluster in use by one test.
type Cluster struct {
	// Kubeconfig is the path of an admin kubeconfig for the cluster.
	Kubeconfig string
	// Dir is the cluster's state directory (configs, logs under Dir/logs).
	Dir string
	// NodeName is the name of the one node.
	NodeName string
	// Config and Client talk to the API server as an admin.
	Config *rest.Config
	Client kubernetes.Interface
	// Env holds what cluster-up.sh printed: CRICTL, CONTAINERD_SOCK,
	// PAUSE_IMAGE, BUSYBOX_IMAGE, ...
	Env map[string]string

	scripts  string
	log      func(format string, args ...any)
	users    *os.File // holds the shared lock while in use
	stopOnce sync.Once
	stopErr  error
}

// BusyboxImage is the app image every cluster has: Debian's static busybox with
// its applets under /bin. It also answers to busybox:1.37, the name deploy/ uses.
const BusyboxImage = "localhost/sidecar-supervisor-e2e/busybox:debian"

// Start returns a running cluster, starting one if none is up, and registers
// Stop with t.Cleanup. It skips the test when not run as root; anything
// missing as root (packages, binaries, images) is installed or built.
func Start(ctx context.Context, t testing.TB) (*Cluster, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("a real cluster needs root (containerd, kubelet, network namespaces); running as uid %d", os.Geteuid())
	}
	c, err := Open(ctx, t.Logf)
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Errorf("stop cluster: %v", err)
			}
		})
	}
	return c, err
}

// Open is Start for a program (a benchmark) rather than a test: it logs with
// logf, fails rather than skips when not root, and leaves calling Stop to
// the caller. A non-nil Cluster comes back whenever Stop must be called, with
// an error too if it is not usable.
func Open(ctx context.Context, logf func(format string, args ...any)) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("a real cluster needs root (containerd, kubelet, network namespaces); running as uid %d", os.Geteuid())
	}
	scriptsDir, err := scripts.Dir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{scripts: scriptsDir, log: logf}
	dir := stateDir()

	start, err := waitLock(ctx, dir+startLock, syscall.LOCK_EX, logf)
	if err != nil {
		return nil, err
	}
	defer start.Close()
	noteHolder(start)

	// A cluster another test uses is waited for if it is unhealthy for now,
	// never torn down (cluster-up.sh). New users need the start lock, held
	// here: the answer can only turn from yes to no meanwhile.
	free, err := tryLock(dir+usersLock, syscall.LOCK_EX)
	if err != nil {
		return nil, err
	}
	var env []string
	if free == nil {
		env = append(env, "SUPERVISOR_E2E_CLUSTER_IN_USE=1")
	} else {
		free.Close()
	}

	t0 := time.Now()
	out, err := c.runScriptEnv(ctx, env, "cluster-up.sh")
	if err != nil {
		return nil, fmt.Errorf("cluster-up.sh: %w", err)
	}
	c.Env = parseEnv(out)
	c.Kubeconfig, c.Dir, c.NodeName = c.Env["KUBECONFIG"], c.Env["CLUSTER_DIR"], c.Env["NODE_NAME"]
	if c.Kubeconfig == "" || c.NodeName == "" {
		return nil, fmt.Errorf("cluster-up.sh printed no KUBECONFIG or NODE_NAME: %q", out)
	}
	logf("cluster ready in %s (kubeconfig %s)", time.Since(t0).Round(time.Second), c.Kubeconfig)

	// Shared lock: held while this Cluster is in use, so that another user's
	// Stop leaves the cluster up. Exclusive holders only try without waiting,
	// so this waits for nothing in practice.
	c.users, err = waitLock(ctx, dir+usersLock, syscall.LOCK_SH, logf)
	if err != nil {
		return nil, err
	}

	c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return c, fmt.Errorf("load kubeconfig %s: %w", c.Kubeconfig, err)
	}
	c.Config.QPS, c.Config.Burst = 50, 100
	c.Client, err = kubernetes.NewForConfig(c.Config)
	if err != nil {
		return c, fmt.Errorf("client for %s: %w", c.Kubeconfig, err)
	}
	return c, nil
}

// Stop ends this test's use of the cluster and tears the cluster down if no
// other user (in this or another process) holds it. Safe to call twice.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := stateDir()
	if c.users != nil {
		c.users.Close() // releases our shared lock
	}
	// A start lock that is held means another process is starting the
	// cluster (it will use it, and stop it in turn), restarting a daemon (a
	// user) or tearing it down: the cluster is in other hands either way.
	// Waiting would race work of unknown length, a cold start above all.
	start, err := tryLock(dir+startLock, syscall.LOCK_EX)
	if err != nil {
		return err
	}
	if start == nil {
		c.log("the cluster start lock is held by %s: leaving the cluster to it", holder(dir+startLock))
		return nil
	}
	defer start.Close()
	noteHolder(start)
	last, err := tryLock(dir+usersLock, syscall.LOCK_EX)
	if err != nil {
		return err
	}
	if last == nil {
		c.log("cluster still in use by another test; leaving it up")
		return nil
	}
	defer last.Close()
	if os.Getenv("SUPERVISOR_E2E_KEEP_CLUSTER") == "1" {
		c.log("SUPERVISOR_E2E_KEEP_CLUSTER=1: leaving the cluster up in %s", c.Dir)
		return nil
	}
	if _, err := c.runScript(ctx, "cluster-down.sh"); err != nil {
		return fmt.Errorf("cluster-down.sh: %w", err)
	}
	return nil
}

// Exec runs argv in a container of a running pod as kubectl exec does
// (through the API server and the kubelet, over a WebSocket) and returns its
// stdout, then its stderr. A non-zero exit is an error.
func (c *Cluster) Exec(ctx context.Context, ns, pod, container string, argv ...string) (string, error) {
	req := c.Client.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	if err == nil {
		var stdout, stderr bytes.Buffer
		err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
		out := stdout.String() + stderr.String()
		if err == nil {
			return out, nil
		}
		return out, fmt.Errorf("exec %q in %s/%s, container %s: %w: %s", argv, ns, pod, container, err, strings.TrimSpace(out))
	}
	return "", fmt.Errorf("exec %q in %s/%s, container %s: %w", argv, ns, pod, container, err)
}

// RestartDaemon restarts the node's kubelet or containerd as a service
// manager would (e2e/scripts/cluster-restart.sh): stopped with SIGTERM,
// started again as it was, and waited for until the node is Ready. The
// pods' containers keep running. Only for a caller that has the cluster to
// itself: other users' pods see the restart too. It holds the start lock
// meanwhile, so that another test's Start waits for the node to be Ready
// again instead of finding it NotReady.
func (c *Cluster) RestartDaemon(ctx context.Context, name string) error {
	start, err := waitLock(ctx, stateDir()+startLock, syscall.LOCK_EX, c.log)
	if err != nil {
		return err
	}
	defer start.Close()
	noteHolder(start)
	if _, err := c.runScript(ctx, "cluster-restart.sh", name); err != nil {
		return fmt.Errorf("cluster-restart.sh %s: %w", name, err)
	}
	return nil
}

// DaemonLog returns the last n lines of a daemon's log (kubelet, containerd,
// kube-apiserver, ...), for failure reports.
func (c *Cluster) DaemonLog(name string, n int) string {
	b, err := os.ReadFile(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runScript runs e2e/scripts/NAME, logging its stderr to the test log as it
// comes, and returns its stdout.
func (c *Cluster) runScript(ctx context.Context, name string, args ...string) (string, error) {
	return c.runScriptEnv(ctx, nil, name, args...)
}

// runScriptEnv is runScript with env added to this process's environment.
func (c *Cluster) runScriptEnv(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(c.scripts, name)}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	// On cancellation, SIGTERM the script's whole process group (bash and
	// whatever it waits for), so that cluster-up.sh's EXIT trap still tears
	// down what it started; the daemons run in sessions of their own. Past
	// WaitDelay, bash is killed. Should this process die (a go test killed
	// at its -timeout), bash gets the same SIGTERM (Pdeathsig): a
	// cluster-up.sh left running would race the next run's cluster.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var tail []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		c.log("%s: %s", name, sc.Text())
		tail = append(tail, sc.Text())
		if len(tail) > 40 {
			tail = tail[1:]
		}
	}
	_, _ = io.Copy(io.Discard, stderr)
	if err := cmd.Wait(); err != nil {
		return stdout.String(), fmt.Errorf("%w (last output: %s)", err, strings.Join(tail, " | "))
	}
	return stdout.String(), nil
}

// parseEnv reads NAME=VALUE lines.
func parseEnv(s string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && k != "" && !strings.ContainsAny(k, " \t") {
			env[k] = v
		}
	}
	return env
}

// stateDir mirrors CLUSTER_DIR in e2e/scripts/cluster-lib.sh.
func stateDir() string {
	return cmp.Or(os.Getenv("SUPERVISOR_E2E_CLUSTER_DIR"), "/tmp/sidecar-supervisor-e2e-cluster")
}
