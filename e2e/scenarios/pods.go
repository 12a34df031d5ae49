// Package scenarios describes the pods the end-to-end tests and the demo
// run — a Job's app containers, istio-proxy and the supervisor — once, and
// builds them for each backend of package pod: BuildNamespaces over the
// host's filesystem, BuildRunc with a root filesystem per container (the
// supervisor's unpacked from the image the Dockerfile builds).
package scenarios

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"golang.org/x/sys/unix"
)

// ProxyKind says what runs in the istio-proxy container.
type ProxyKind int

// The proxies.
const (
	// StandIn is podsim's pilot-agent: fast, and records every signal.
	StandIn ProxyKind = iota
	// NoProxy leaves istio-proxy out.
	NoProxy
	// RealPilot is Istio's own pilot-agent (e2e/scripts/build-tools.sh)
	// with the stand-in envoy, laid out by package istioproxy; its
	// postStart hook for HoldApp is Istio's `pilot-agent wait`.
	RealPilot
)

// App is one application container running podsim app with Args.
type App struct {
	Name string
	Args []string
	UID  int
	// Cued: the app works until the test releases it (Built.Release), then
	// ends as Args say (--exit, --kill). A test can so let the supervisor,
	// the pod's last container, find it first however slowly the machine
	// starts containers, instead of betting on a --sleep.
	Cued bool
	// DrainCued: on SIGTERM the app drains (calling what its --get names)
	// until the test releases DrainCue(Name), then exits (--term-exit).
	DrainCued bool
	// CgroupDelay keeps every run's main process that long out of its
	// container's cgroup, in the pod already (pod.Container.CgroupDelay;
	// namespaces backend only).
	CgroupDelay time.Duration
	// CgroupHold holds every run's main process out of its container's
	// cgroup until it returns (pod.Container.CgroupHold; namespaces
	// backend only).
	CgroupHold func(ctx context.Context, p *pod.Pod, attempt int) error
	// Native and Ephemeral make it a native sidecar or an ephemeral
	// container (pod.Container): not an app, not named in SUPERVISOR_APPS.
	Native, Ephemeral bool
}

// Desc describes a pod independently of the backend.
type Desc struct {
	Name   string
	Policy pod.RestartPolicy
	Apps   []App
	Proxy  ProxyKind
	// ProxyEnv configures the stand-in (PILOT_DRAIN, PILOT_IGNORE_TERM...)
	// or is added to the real pilot-agent's environment.
	ProxyEnv []string
	// ProxyDrain is how long the proxy drains after SIGTERM: the real
	// pilot-agent's terminationDrainDuration (default DefaultRealDrain
	// here, 5s in Istio), the stand-in's PILOT_DRAIN.
	ProxyDrain time.Duration
	// ProxyReadyDelay keeps the proxy unready this long after it starts:
	// the stand-in envoy's ENVOY_STANDIN_READY_DELAY under the real
	// pilot-agent, the stand-in's PILOT_READY_DELAY.
	ProxyReadyDelay time.Duration
	// ProxyStartAfter holds istio-proxy's start back, and the supervisor's
	// after it, until it returns (pod.Container.StartAfter).
	ProxyStartAfter func(context.Context, *pod.Pod) error
	// ProxyHandlerCued: the stand-in asks for SIGTERM (signal.Notify) and
	// starts envoy only once the test releases HandlerCue (Built.Release).
	ProxyHandlerCued bool
	// ProxyDrainCued: the stand-in's drain lasts until the test releases
	// ProxyDrainCue (Built.Release), instead of ProxyDrain.
	ProxyDrainCued bool
	// HoldApp puts istio-proxy first with a postStart hook that waits for
	// its readiness, as Istio's holdApplicationUntilProxyStarts does.
	HoldApp bool
	// Sidecars are the pod's other sidecars, after the apps.
	Sidecars []Sidecar
	// NoSupervisor leaves the supervisor out (the control).
	NoSupervisor bool
	// SupervisorEnv adds SUPERVISOR_* settings (after supervisorEnv's).
	SupervisorEnv []string
	// NoNames runs the pod without the kubelet's termination-message
	// mounts (pod.Spec.NoNames): the supervisor cannot read names there.
	NoNames bool
	// NoAppNames leaves SUPERVISOR_APPS out, as a hand-written manifest
	// may; by default it names the apps, as the injection template does.
	NoAppNames bool
	// SupervisorOwnPIDNS runs the supervisor without the shared PID
	// namespace (shareProcessNamespace: false).
	SupervisorOwnPIDNS bool
	// SupervisorState gives the supervisor a state directory that
	// outlives its restarts, as the template's emptyDir does
	// (SUPERVISOR_STATE_DIR): its journal.
	SupervisorState bool
	// SupervisorAccounting runs the supervisor as root with KILL and
	// SYS_PACCT, as deploy/job-ptrace.yaml does: process accounting on,
	// its records in the state directory (it needs SupervisorState).
	SupervisorAccounting bool
	// SupervisorNative runs the supervisor as a native sidecar, before
	// the apps (SUPERVISOR_SHAPE=native; it has SupervisorState).
	SupervisorNative bool
	// SupervisorFirst puts the supervisor before the apps with its
	// postStart hook, `sidecar-supervisor wait`, as the injection template
	// does with istio-proxy last (it has SupervisorState).
	SupervisorFirst bool
	// SupervisorStandby adds a second supervisor, "standby", the same but
	// for its name and termination message, right after the first: it
	// leads once the first dies (supervisor/lead.go; it needs a state
	// directory).
	SupervisorStandby bool
	Grace             time.Duration
}

// HandlerCue is the name Built.Release takes for the stand-in's handler
// (Desc.ProxyHandlerCued), ProxyDrainCue for the end of its drain
// (Desc.ProxyDrainCued).
const (
	HandlerCue    = "pilot-agent-handler"
	ProxyDrainCue = "pilot-agent-drain"
)

// Built is a pod spec ready to start, and where its records land.
type Built struct {
	Spec    pod.Spec
	Backend pod.Backend
	// Dir is the pod's directory (Spec.Dir).
	Dir string
	// Shared is the host directory the containers share (records, the
	// sidecars' Sidecar.RecordFile).
	Shared string
	// PilotRecord is the stand-in pilot-agent's record file on the host
	// (StandIn).
	PilotRecord string
	// Proxy is the real pilot-agent's tree (RealPilot); its stand-in envoy
	// keeps a record (Proxy.Record).
	Proxy *istioproxy.Proxy
	// sharedIn is the shared directory as the containers see it.
	sharedIn string
	// cues are the host paths of the cued apps' FIFOs, by app name.
	cues map[string]string
}

// DefaultRealDrain is the real pilot-agent's terminationDrainDuration when
// Desc.ProxyDrain is unset: Istio's 5s would slow every test down.
const DefaultRealDrain = time.Second

// ProxyUID is istio-proxy's uid, as Istio's injector sets it; the
// supervisor runs as the same non-root uid in our manifests.
const ProxyUID = 1337

// Patient sets every supervisor bound a test does not test far out of
// reach: each stands between an event the test expects (an app seen, a
// sidecar's exit after its signal, its handler) and a fallback, so it is
// only a hang guard, and a loaded machine must never reach it. A test
// whose outcome is a timeout sets that one short itself, after these (the
// last setting wins).
var Patient = []string{"SUPERVISOR_STOP_TIMEOUT=2m", "SUPERVISOR_SIDECAR_START_TIMEOUT=2m", "SUPERVISOR_APP_START_TIMEOUT=2m"}

// EventBound bounds the tests' waits for an event: a hang guard.
const EventBound = 2 * time.Minute

// Builder builds a Desc into a startable pod on one backend of package pod.
type Builder struct {
	Name  string // "namespaces" or "runc"
	Build func(Desc) (Built, error)
}

// MustBuild is b.Build for a test: it fails the test if d cannot be built.
func (b Builder) MustBuild(t testing.TB, d Desc) Built {
	t.Helper()
	built, err := b.Build(d)
	if err != nil {
		t.Fatal(err)
	}
	return built
}

// Builders returns a Builder for each backend, for a test: the tools built
// (pod.MustTools) and runc installed by e2e/scripts/install-deps.sh if need
// be. It skips the test when not root: the pod simulation creates
// namespaces and cgroups (CI runs as root).
func Builders(t testing.TB) []Builder {
	t.Helper()
	pod.NeedRoot(t)
	tl := pod.MustTools(t)
	runc := pod.MustRunc(t, tl)
	return []Builder{
		{"namespaces", func(d Desc) (Built, error) { return BuildNamespaces(d, tl) }},
		{"runc", func(d Desc) (Built, error) { return BuildRunc(d, tl, runc.Path) }},
	}
}

// Start starts b's pod for a test and closes it when the test ends, failing
// the test if it does not close cleanly; a failed test gets the pod's
// description and every record (Records).
func Start(t testing.TB, b Built) *pod.Pod {
	t.Helper()
	return pod.MustStart(t, b.Backend, b.Spec, b.Records)
}

// Records are the proxy's record (the stand-in pilot-agent's, or the stand-in
// envoy's under the real one) and each app's, for a failing test to print.
func (b Built) Records() string {
	var out strings.Builder
	if b.Proxy != nil {
		events, err := b.Proxy.Record()
		fmt.Fprintf(&out, "--- envoy record (%s, err=%v):\n%s", b.Proxy.RecordFile(), err, record.Format(events))
	} else {
		fmt.Fprintf(&out, "--- pilot-agent record:\n%s", strings.Join(Record(b.PilotRecord), "\n"))
	}
	for _, c := range b.Spec.Containers {
		if rec := Record(appRecord(b, c.Name)); len(rec) > 0 {
			fmt.Fprintf(&out, "\n--- %s record:\n%s", c.Name, strings.Join(rec, "\n"))
		}
	}
	return out.String()
}

// BuildNamespaces builds d for the namespaces backend: every container runs
// over the host's filesystem, the supervisor is the binary of pod.Tools.
func BuildNamespaces(d Desc, tl pod.Tools) (Built, error) { return build(d, tl, "") }

// build builds d for the runc backend (runc is its binary) or, with runc
// "", for the namespaces backend. Each backend's own is said where it
// differs: the files of a runc container sit in its root filesystem under
// Built.Dir/rootfs, and the pod's shared directory is mounted at
// SharedMount; a namespaces container sees the host's files where they are.
func build(d Desc, tl pod.Tools, runc string) (Built, error) {
	dir, err := os.MkdirTemp("", "podsim-"+d.Name+"-")
	if err != nil {
		return Built{}, err
	}
	b := Built{Dir: dir, Shared: dir, sharedIn: dir, Backend: pod.Namespaces{Podsim: tl.Podsim}}
	if runc != "" {
		b.Shared, b.sharedIn, b.Backend = filepath.Join(dir, "shared"), SharedMount, pod.Runc{Path: runc, Podsim: tl.Podsim}
	}
	if err := os.MkdirAll(b.Shared, 0o777); err != nil {
		return Built{}, err
	}
	// Containers of several uids write records in the shared directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		return Built{}, err
	}
	if err := os.Chmod(b.Shared, 0o777); err != nil {
		return Built{}, err
	}
	var apps, injected []pod.Container
	for _, a := range d.Apps {
		podsim, err := b.install(tl.Podsim, a.Name, "bin/podsim")
		if err != nil {
			return Built{}, err
		}
		cue, err := b.appCues(a)
		if err != nil {
			return Built{}, err
		}
		argv := append([]string{podsim, "app", "--record", b.sharedIn + "/" + a.Name + ".record"}, cue...)
		// CgroupDelay and CgroupHold: the runc backend has no such window.
		apps = append(apps, b.onRoot(pod.Container{Name: a.Name, Argv: append(argv, a.Args...), UID: a.UID, GID: a.UID,
			CgroupDelay: a.CgroupDelay, CgroupHold: a.CgroupHold, Native: a.Native, Ephemeral: a.Ephemeral}, false))
	}
	for _, s := range d.Sidecars {
		if err := vaultDir(b.Shared, s); err != nil {
			return Built{}, err
		}
		root, bin := "", filepath.Join(dir, "bin")
		if runc != "" {
			root, bin = b.rootfs(s.name()), ""
		}
		c, err := sidecarContainer(s, tl, root, bin, b.sharedIn)
		if err != nil {
			return Built{}, fmt.Errorf("sidecar %s: %w", s.name(), err)
		}
		if c = b.onRoot(c, true); s.Injected {
			injected = append(injected, c)
		} else {
			apps = append(apps, c)
		}
	}
	var proxy *pod.Container
	switch d.Proxy {
	case StandIn:
		// Named pilot-agent, so that its comm is.
		pilot, err := b.install(tl.PilotAgent, "istio-proxy", "usr/local/bin/pilot-agent")
		if err != nil {
			return Built{}, err
		}
		// podsim's stand-in has no `wait`: podsim does it.
		podsim, err := b.install(tl.Podsim, "istio-proxy", "bin/podsim")
		if err != nil {
			return Built{}, err
		}
		b.PilotRecord = filepath.Join(b.Shared, "pilot-agent.record")
		cue, err := b.proxyCues(d)
		if err != nil {
			return Built{}, err
		}
		c := b.onRoot(pod.Container{Name: "istio-proxy", Argv: []string{pilot, "proxy", "sidecar"},
			Env:       append(standInEnv(d, b.sharedIn+"/pilot-agent.record"), cue...),
			PostStart: []string{podsim, "wait-http", "http://127.0.0.1:15021/healthz/ready", "60s"}}, true)
		proxy = &c
	case RealPilot:
		px, err := prepareRealPilot(d, b.rootfs("istio-proxy"))
		if err != nil {
			return Built{}, err
		}
		b.Proxy = px
		proxy = &pod.Container{Argv: px.Argv, Env: px.Env, UID: px.UID, GID: px.GID, PostStart: realPilotWait}
		if runc == "" {
			proxy.Dir = px.Root // the tree is pilot-agent's working directory
		} else {
			proxy.Rootfs, proxy.ReadOnlyRootfs = px.Root, true
			for _, w := range px.Writable {
				proxy.Mounts = append(proxy.Mounts, pod.Mount{Host: px.Path(w), Container: "/" + w})
			}
		}
	}
	var supervisor *pod.Container
	if !d.NoSupervisor {
		if supervisor, err = b.supervisor(d, tl); err != nil {
			return Built{}, err
		}
	}
	b.Spec = assemble(d, dir, apps, proxy, supervisor, injected)
	return b, nil
}

// rootfs is the root filesystem of the container name on the runc
// backend, and where the real pilot-agent's tree goes on both.
func (b Built) rootfs(name string) string { return filepath.Join(b.Dir, "rootfs", name) }

// install makes the static binary src runnable in the container name, at
// rel under its root filesystem on the runc backend, and returns its path
// there; the namespaces backend runs src where it is.
func (b Built) install(src, name, rel string) (string, error) {
	if _, ok := b.Backend.(pod.Runc); !ok {
		return src, nil
	}
	return "/" + rel, InstallTool(src, b.rootfs(name), rel)
}

// onRoot puts c, on the runc backend, on its root filesystem (read-only if
// readOnly) with the shared directory mounted.
func (b Built) onRoot(c pod.Container, readOnly bool) pod.Container {
	if _, ok := b.Backend.(pod.Runc); ok {
		c.Rootfs, c.ReadOnlyRootfs, c.Mounts = b.rootfs(c.Name), readOnly, []pod.Mount{{Host: b.Shared, Container: SharedMount}}
	}
	return c
}

// supervisorEnv is the supervisor's settings: SUPERVISOR_APPS as the
// injection template fills it (unless NoAppNames), then d's.
func supervisorEnv(d Desc) []string {
	var env []string
	if !d.NoAppNames {
		env = append(env, "SUPERVISOR_APPS="+strings.Join(appNames(d), ","))
	}
	return append(env, d.SupervisorEnv...)
}

// realPilotWait is Istio's holdApplicationUntilProxyStarts hook, `pilot-agent
// wait` (it polls http://localhost:15021/healthz/ready, every 500ms, for
// up to 60s), with the tree's relative path: the working directory is the
// tree's root in both backends, and the namespaces backend's PATH is the
// host's.
var realPilotWait = []string{"./" + istioproxy.PilotAgentPath, "wait"}

// standInEnv is the stand-in pilot-agent's environment.
func standInEnv(d Desc, record string) []string {
	env := []string{"PILOT_RECORD=" + record}
	if d.ProxyDrain > 0 {
		env = append(env, "PILOT_DRAIN="+d.ProxyDrain.String())
	}
	if d.ProxyReadyDelay > 0 {
		env = append(env, "PILOT_READY_DELAY="+d.ProxyReadyDelay.String())
	}
	return append(env, d.ProxyEnv...)
}

// istioTools builds the real pilot-agent and the stand-in envoy once per
// process (cached across runs by build-tools.sh).
var istioTools = sync.OnceValues(func() (istioproxy.Tools, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	return istioproxy.BuildTools(ctx)
})

// prepareRealPilot lays the real pilot-agent's tree out at root.
func prepareRealPilot(d Desc, root string) (*istioproxy.Proxy, error) {
	tools, err := istioTools()
	if err != nil {
		return nil, fmt.Errorf("building pilot-agent with e2e/%s: %w", istioproxy.BuildScript, err)
	}
	drain := cmp.Or(d.ProxyDrain, DefaultRealDrain)
	var apps []string
	for _, a := range d.Apps {
		apps = append(apps, a.Name)
	}
	return istioproxy.Prepare(root, istioproxy.Config{
		Tools: tools, PodName: d.Name, AppContainers: apps,
		TerminationDrainDuration: drain, EnvoyReadyDelay: d.ProxyReadyDelay, Env: d.ProxyEnv,
	})
}

// assemble puts the containers in the order Istio's injector does and sets
// what every backend shares. apps ends with the other sidecars written by
// hand (Desc.Sidecars), which Istio's injector takes for app containers;
// injected are the injected ones, which come after the supervisor. proxy and supervisor come with what differs
// (command, files); the rest is set here: istio-proxy as the injector makes
// it (uid 1337, no privilege escalation, every capability dropped, the
// readiness hook only with HoldApp), the supervisor as deploy/ does (uid
// 1337, no capabilities, no privilege escalation).
func assemble(d Desc, dir string, apps []pod.Container, proxy, supervisor *pod.Container, injected []pod.Container) pod.Spec {
	spec := pod.Spec{Name: d.Name, RestartPolicy: d.Policy, Dir: dir, TerminationGracePeriod: d.Grace, NoNames: d.NoNames}
	if d.Proxy == NoProxy {
		proxy = nil
	}
	if proxy != nil {
		proxy.Name = "istio-proxy"
		if proxy.UID == 0 {
			proxy.UID, proxy.GID = ProxyUID, ProxyUID
		}
		proxy.NoNewPrivs, proxy.Caps = true, []int{}
		proxy.StartAfter = d.ProxyStartAfter
		if !d.HoldApp {
			proxy.PostStart = nil
		}
	}
	// Istio appends istio-proxy after the app containers, or puts it first
	// when it holds the application; the supervisor comes last, or first.
	if proxy != nil && d.HoldApp {
		spec.Containers = append(spec.Containers, *proxy)
	}
	spec.Containers = append(spec.Containers, apps...)
	if proxy != nil && !d.HoldApp {
		spec.Containers = append(spec.Containers, *proxy)
	}
	if !d.NoSupervisor {
		supervisor.Name = "supervisor"
		supervisor.NoNewPrivs, supervisor.Caps = true, []int{}
		if d.SupervisorAccounting { // root already (Built.supervisor)
			supervisor.Caps = []int{unix.CAP_KILL, unix.CAP_SYS_PACCT}
		}
		supervisor.OwnPIDNamespace = d.SupervisorOwnPIDNS
		ours := []pod.Container{*supervisor}
		if d.SupervisorStandby {
			ours = append(ours, standby(*supervisor))
		}
		switch {
		case d.SupervisorNative:
			// Native sidecars before every container of the pod; the
			// next starts once its startup probe passes.
			for i := range ours {
				ours[i].Native = true
				ours[i].StartupProbe = []string{supervisor.Argv[0], "ready"}
			}
			spec.Containers = append(ours, spec.Containers...)
		case d.SupervisorFirst:
			// The next container starts once the hook has returned.
			for i := range ours {
				ours[i].PostStart = []string{supervisor.Argv[0], "wait"}
			}
			spec.Containers = append(ours, spec.Containers...)
		default:
			spec.Containers = append(spec.Containers, ours...)
		}
	}
	for _, c := range injected {
		if !d.NoSupervisor {
			c.StartAfter = appsFound(appNames(d))
		}
		spec.Containers = append(spec.Containers, c)
	}
	return spec
}

// standby is the supervisor container c again as "standby", with a
// termination message of its own where it is a host file (the namespaces
// backend's).
func standby(c pod.Container) pod.Container {
	c.Name = "standby"
	if msg := c.TerminationMessage; filepath.IsAbs(msg) && !strings.HasPrefix(msg, "/dev/") {
		c.TerminationMessage = filepath.Join(filepath.Dir(msg), "standby.termination-log")
		c.Env = slices.Clone(c.Env)
		for i, kv := range c.Env {
			if strings.HasPrefix(kv, "SUPERVISOR_TERMINATION_MESSAGE_PATH=") {
				c.Env[i] = "SUPERVISOR_TERMINATION_MESSAGE_PATH=" + c.TerminationMessage
			}
		}
	}
	return c
}

// appNames are d's app containers (neither native sidecars nor ephemeral).
func appNames(d Desc) []string {
	var names []string
	for _, a := range d.Apps {
		if !a.Native && !a.Ephemeral {
			names = append(names, a.Name)
		}
	}
	return names
}
