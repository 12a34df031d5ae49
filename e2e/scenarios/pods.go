// Package scenarios describes the pods the end-to-end tests and the demo
// run — a Job's app containers, istio-proxy and the supervisor — once, and
// builds them for each backend of package pod.
package scenarios

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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
)

// App is one application container running podsim app with Args.
type App struct {
	Name string
	Args []string
	UID  int
}

// Desc describes a pod independently of the backend.
type Desc struct {
	Name   string
	Policy pod.RestartPolicy
	Apps   []App
	Proxy  ProxyKind
	// ProxyEnv configures the stand-in (PILOT_DRAIN, PILOT_IGNORE_TERM...).
	ProxyEnv []string
	// ProxyStartDelay starts istio-proxy late (after the apps).
	ProxyStartDelay time.Duration
	// HoldApp puts istio-proxy first with a postStart hook that waits for
	// its readiness, as Istio's holdApplicationUntilProxyStarts does.
	HoldApp bool
	// NoSupervisor leaves the supervisor out (the control).
	NoSupervisor bool
	// SupervisorEnv adds SUPERVISOR_* settings.
	SupervisorEnv []string
	// SupervisorOwnPIDNS runs the supervisor without the shared PID
	// namespace (shareProcessNamespace: false).
	SupervisorOwnPIDNS bool
	Grace              time.Duration
}

// Built is a pod spec ready to start, and where its records land.
type Built struct {
	Spec    pod.Spec
	Backend pod.Backend
	// Dir is the pod's directory (Spec.Dir).
	Dir string
	// PilotRecord is the stand-in pilot-agent's record file on the host.
	PilotRecord string
}

// ProxyUID is istio-proxy's uid, as Istio's injector sets it; the
// supervisor runs as the same non-root uid in our manifests.
const ProxyUID = 1337

// BuildNamespaces builds d for the namespaces backend.
func BuildNamespaces(d Desc, tl pod.Tools) (Built, error) {
	dir, err := os.MkdirTemp("", "podsim-"+d.Name+"-")
	if err != nil {
		return Built{}, err
	}
	// Containers of several uids write records here.
	if err := os.Chmod(dir, 0o777); err != nil {
		return Built{}, err
	}
	b := Built{Dir: dir, PilotRecord: filepath.Join(dir, "pilot-agent.record"),
		Backend: pod.Namespaces{Podsim: tl.Podsim}}
	spec := pod.Spec{Name: d.Name, RestartPolicy: d.Policy, Dir: dir, TerminationGracePeriod: d.Grace}
	var apps []pod.Container
	for _, a := range d.Apps {
		apps = append(apps, pod.Container{
			Name: a.Name, Argv: append([]string{tl.Podsim, "app", "--record", filepath.Join(dir, a.Name+".record")}, a.Args...),
			UID: a.UID, GID: a.UID,
		})
	}
	var proxy *pod.Container
	if d.Proxy == StandIn {
		proxy = &pod.Container{
			Name: "istio-proxy", Argv: []string{tl.PilotAgent, "proxy", "sidecar"},
			Env: append([]string{"PILOT_RECORD=" + b.PilotRecord}, d.ProxyEnv...),
			UID: ProxyUID, GID: ProxyUID, NoNewPrivs: true, StartDelay: d.ProxyStartDelay,
		}
		if d.HoldApp {
			proxy.PostStart = []string{tl.Podsim, "wait-http", "http://127.0.0.1:15021/healthz/ready", "60s"}
		}
	}
	// Istio appends istio-proxy after the app containers, or puts it first
	// when it holds the application; the supervisor comes last.
	if proxy != nil && d.HoldApp {
		spec.Containers = append(spec.Containers, *proxy)
	}
	spec.Containers = append(spec.Containers, apps...)
	if proxy != nil && !d.HoldApp {
		spec.Containers = append(spec.Containers, *proxy)
	}
	if !d.NoSupervisor {
		env := append([]string{
			"SUPERVISOR_TERMINATION_MESSAGE_PATH=" + filepath.Join(dir, "supervisor.termination-log"),
		}, d.SupervisorEnv...)
		spec.Containers = append(spec.Containers, pod.Container{
			Name: "supervisor", Argv: []string{tl.Supervisor}, Env: env,
			UID: ProxyUID, GID: ProxyUID, NoNewPrivs: true, Caps: []int{},
			TerminationMessage: filepath.Join(dir, "supervisor.termination-log"),
			OwnPIDNamespace:    d.SupervisorOwnPIDNS,
		})
	}
	b.Spec = spec
	return b, nil
}

// Record reads a record file (the stand-in's or an app's): one event per
// line, with any leading timestamp cut off.
func Record(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// LogLine is one line of the supervisor's JSON log.
type LogLine map[string]any

// Msg is the line's message.
func (l LogLine) Msg() string { s, _ := l["message"].(string); return s }

// Str is a field as text.
func (l LogLine) Str(k string) string {
	switch v := l[k].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// ParseLog reads the supervisor's JSON log lines out of its container's
// output (other lines are skipped).
func ParseLog(out string) []LogLine {
	var lines []LogLine
	for _, s := range strings.Split(out, "\n") {
		var l LogLine
		if json.Unmarshal([]byte(s), &l) == nil && l.Msg() != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// Messages lists the log's messages in order.
func Messages(lines []LogLine) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l.Msg())
	}
	return out
}
