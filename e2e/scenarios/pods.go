// Package scenarios describes the pods the end-to-end tests and the demo
// run — a Job's app containers, istio-proxy and the supervisor — once, and
// builds them for each backend of package pod: BuildNamespaces over the
// host's filesystem, BuildRunc with a root filesystem per container (the
// supervisor's unpacked from the image the Dockerfile builds).
package scenarios

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
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
	// SupervisorNative runs the supervisor as a native sidecar, before
	// the apps (SUPERVISOR_SHAPE=native; it has SupervisorState).
	SupervisorNative bool
	// SupervisorFirst puts the supervisor before the apps with its
	// postStart hook, `sidecar-supervisor wait`, as the injection template
	// does with istio-proxy last (it has SupervisorState).
	SupervisorFirst bool
	Grace           time.Duration
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runc, err := pod.FindRunc(ctx)
	if err != nil {
		t.Fatalf("the runc backend needs runc (e2e/%s installs it): %v", pod.InstallScript, err)
	}
	return []Builder{
		{"namespaces", func(d Desc) (Built, error) { return BuildNamespaces(d, tl) }},
		{"runc", func(d Desc) (Built, error) { return BuildRunc(d, tl, runc) }},
	}
}

// Start starts b's pod for a test and closes it when the test ends, failing
// the test if it does not close cleanly; a failed test gets the pod's
// description and every record (Records).
func Start(t testing.TB, b Built) *pod.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := pod.Start(ctx, b.Backend, b.Spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s\n%s", p.Describe(), b.Records())
		}
		if err := p.Close(); err != nil {
			t.Errorf("close pod: %v", err)
		}
	})
	return p
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
func BuildNamespaces(d Desc, tl pod.Tools) (Built, error) {
	dir, err := os.MkdirTemp("", "podsim-"+d.Name+"-")
	if err != nil {
		return Built{}, err
	}
	// Containers of several uids write records here.
	if err := os.Chmod(dir, 0o777); err != nil {
		return Built{}, err
	}
	b := Built{Dir: dir, Shared: dir, Backend: pod.Namespaces{Podsim: tl.Podsim}}
	var apps []pod.Container
	for _, a := range d.Apps {
		cue, err := b.appCues(a, dir, dir)
		if err != nil {
			return Built{}, err
		}
		argv := append([]string{tl.Podsim, "app", "--record", filepath.Join(dir, a.Name+".record")}, cue...)
		apps = append(apps, pod.Container{Name: a.Name, Argv: append(argv, a.Args...), UID: a.UID, GID: a.UID, CgroupDelay: a.CgroupDelay,
			CgroupHold: a.CgroupHold, Native: a.Native, Ephemeral: a.Ephemeral})
	}
	var proxy *pod.Container
	switch d.Proxy {
	case StandIn:
		b.PilotRecord = filepath.Join(dir, "pilot-agent.record")
		cue, err := b.proxyCues(d, dir, dir)
		if err != nil {
			return Built{}, err
		}
		proxy = &pod.Container{
			Argv: []string{tl.PilotAgent, "proxy", "sidecar"}, Env: append(standInEnv(d, b.PilotRecord), cue...),
			PostStart: []string{tl.Podsim, "wait-http", "http://127.0.0.1:15021/healthz/ready", "60s"},
		}
	case RealPilot:
		// The tree is pilot-agent's working directory.
		px, err := prepareRealPilot(d, filepath.Join(dir, "istio-proxy"))
		if err != nil {
			return Built{}, err
		}
		b.Proxy = px
		proxy = &pod.Container{Argv: px.Argv, Env: px.Env, Dir: px.Root, UID: px.UID, GID: px.GID,
			PostStart: realPilotWait}
	}
	supervisor := &pod.Container{
		Argv: []string{tl.Supervisor},
		Env: append([]string{
			"SUPERVISOR_TERMINATION_MESSAGE_PATH=" + filepath.Join(dir, "supervisor.termination-log"),
		}, supervisorEnv(d)...),
		UID: ProxyUID, GID: ProxyUID,
		TerminationMessage: filepath.Join(dir, "supervisor.termination-log"),
	}
	if err := supervisorState(d, dir, supervisor, ProxyUID, ""); err != nil {
		return Built{}, err
	}
	var injected []pod.Container
	for _, s := range d.Sidecars {
		if err := vaultDir(dir, s); err != nil {
			return Built{}, err
		}
		c, err := sidecarContainer(s, tl, "", filepath.Join(dir, "bin"), dir)
		if err != nil {
			return Built{}, fmt.Errorf("sidecar %s: %w", s.name(), err)
		}
		if s.Injected {
			injected = append(injected, c)
		} else {
			apps = append(apps, c)
		}
	}
	b.Spec = assemble(d, dir, apps, proxy, supervisor, injected)
	return b, nil
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
	drain := d.ProxyDrain
	if drain == 0 {
		drain = DefaultRealDrain
	}
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
		supervisor.OwnPIDNamespace = d.SupervisorOwnPIDNS
		switch {
		case d.SupervisorNative:
			// A native sidecar before every container of the pod.
			supervisor.Native = true
			spec.Containers = append([]pod.Container{*supervisor}, spec.Containers...)
		case d.SupervisorFirst:
			// The next container starts once the hook has returned.
			supervisor.PostStart = []string{supervisor.Argv[0], "wait"}
			spec.Containers = append([]pod.Container{*supervisor}, spec.Containers...)
		default:
			spec.Containers = append(spec.Containers, *supervisor)
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
