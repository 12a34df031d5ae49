package supervisor

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/rs/zerolog"
)

// EnvPrefix is the prefix of every setting's environment variable.
const EnvPrefix = "SUPERVISOR_"

// Config is the supervisor's configuration, read from SUPERVISOR_*
// environment variables. Each setting is described once, in its field's
// tags: its variable (env), default (envDefault), what it accepts
// (accepts, which is also the rule Validate enforces for durations and
// counts) and what it means (meaning). The configuration table in
// docs/configuration.md says the same, row for row in this order
// (TestReadmeSettings).
type Config struct {
	Apps                   []string         `env:"APPS" accepts:"comma-separated container names" meaning:"the pod's app containers, by name (the injection template fills it from the pod spec). Where the kubelet's names can be read (What it logs and reports), exactly these are waited for, a restart is the same name coming back, and a container named neither here nor in SUPERVISOR_SIDECARS (a native sidecar, an ephemeral debug container) is neither waited for nor stopped"`
	Sidecars               []string         `env:"SIDECARS" envDefault:"istio-proxy,linkerd-proxy,daprd,consul-dataplane,vault-agent,cloud-sql-proxy,otc-container,otel-collector,fluent-bit" accepts:"comma-separated container names" meaning:"the sidecar containers to stop, by name, where the kubelet's names can be read; elsewhere SUPERVISOR_SIDECAR_PROCESSES tells them by their main process. The default names the sidecars the supervisor knows how to stop (Sidecars it knows)"`
	SidecarProcesses       []string         `env:"SIDECAR_PROCESSES" envDefault:"pilot-agent,linkerd2-proxy,daprd,consul-dataplane,cloud-sql-proxy,otelcol,otelcol-contrib,fluent-bit" accepts:"comma-separated process names" meaning:"containers whose main process has one of these names (comm or argv[0] base name) are sidecars, stopped when the apps are done"`
	IgnoreProcesses        []string         `env:"IGNORE_PROCESSES" accepts:"comma-separated process names" meaning:"containers whose main process has one of these names are neither waited for nor stopped"`
	AppContainers          int              `env:"APP_CONTAINERS" envDefault:"0" accepts:"whole number ≥ 0" meaning:"how many application containers to wait for; 0 takes whatever is there once at least one is"`
	AppStartTimeout        time.Duration    `env:"APP_START_TIMEOUT" envDefault:"30s" accepts:"duration > 0" meaning:"bound on looking for the application containers, from the supervisor's start, 30 s later where it cannot write its ready file (the kubelet's hooks on it may hold the apps back that long), or see SUPERVISOR_AFTER_APPS; the missing ones count as unknown"`
	AfterApps              []string         `env:"AFTER_APPS" accepts:"comma-separated container names" meaning:"containers the kubelet starts after every app (later in the pod spec), for a supervisor placed before the apps (the injection template places it so where istio-proxy comes last). Until one of them is seen the kubelet may still be pulling an app's image, so SUPERVISOR_APP_START_TIMEOUT counts from then (and SUPERVISOR_AFTER_APPS_TIMEOUT bounds the wait for them); meanwhile an app is watched from the moment its container is made, so one of milliseconds is adopted unless the supervisor is kept off the CPU for the whole of its run. Needs the kubelet's names"`
	AfterAppsTimeout       time.Duration    `env:"AFTER_APPS_TIMEOUT" envDefault:"1h" accepts:"duration > 0" meaning:"bound on waiting for a container of SUPERVISOR_AFTER_APPS to appear, the kubelet pulling the apps' images and its own meanwhile; past it, the apps not seen count as unknown. Long on purpose: until istio-proxy starts there is nothing to stop, and giving up sooner would leave a sidecar that starts after a slow pull running for good"`
	SidecarStartTimeout    time.Duration    `env:"SIDECAR_START_TIMEOUT" envDefault:"30s" accepts:"duration > 0" meaning:"bound on waiting for a sidecar that had not started when the apps finished, and then for it to handle a graceful signal (after which the signal is sent anyway, and the summary says so)"`
	StopTimeout            time.Duration    `env:"STOP_TIMEOUT" envDefault:"30s" accepts:"duration > 0" meaning:"a sidecar still alive this long after the action gets SIGKILL"`
	OnSuccess              Action           `env:"ON_SUCCESS" envDefault:"SIGTERM" accepts:"signal name or number, none, http(s)://..." meaning:"action when every app exited 0"`
	OnFailure              Action           `env:"ON_FAILURE" envDefault:"SIGKILL" accepts:"as above" meaning:"action when an app exited non-zero or was killed"`
	OnUnknown              Action           `env:"ON_UNKNOWN" envDefault:"SIGTERM" accepts:"as above" meaning:"action when a status could not be read (and none failed)"`
	SidecarActions         SidecarActions   `env:"SIDECAR_ACTIONS" accepts:"name=action,... with names from SUPERVISOR_SIDECAR_PROCESSES or SUPERVISOR_SIDECARS" meaning:"gives some sidecars their own action whatever the outcome, e.g. cloud-sql-proxy=SIGTERM; without it, a sidecar the supervisor knows gets its own clean stop (Sidecars it knows), and any other the outcome's action"`
	RestartPolicy          RestartPolicy    `env:"RESTART_POLICY" envDefault:"Never" accepts:"Never, OnFailure, Always" meaning:"the pod's restartPolicy (the injection template fills it). OnFailure: a failed app is restarted in place by the kubelet, so the sidecar stays up until every app container has exited 0, and is then stopped only gracefully (SIGKILL is refused: a sidecar exiting 137 would be restarted). Always: an app's exit never stops the sidecar; the supervisor idles until the pod is deleted"`
	RestartTimeout         time.Duration    `env:"RESTART_TIMEOUT" envDefault:"5m30s" accepts:"duration > 0" meaning:"under OnFailure, how long an app instance that failed awaits its restart before it is taken as finished, its status unknown: a restart can run and end between two scans and leave nothing to see, and fail again (past the kubelet's longest back-off, 5 minutes); also the longest an instance whose status is unknown awaits one (see SUPERVISOR_RESTART_MARGIN)"`
	RestartMargin          time.Duration    `env:"RESTART_MARGIN" envDefault:"15s" accepts:"duration ≥ 0" meaning:"under OnFailure, an app instance whose exit status is unknown awaits its restart for as long as the kubelet would take to make it if it had failed (at once the first time, then after 10 s, 20 s, 40 s ... 5 min, its back-off) plus this margin: the time the kubelet takes to notice the exit and start the new instance. Past it, the instance is taken as finished. The same bound holds for a sidecar whose exit after the stop was not 0, which the kubelet starts again to be stopped again. The injection template sets 60s where an app's image is pulled on every start (imagePullPolicy Always)"`
	NativeSidecar          bool             `env:"NATIVE_SIDECAR" envDefault:"false" accepts:"true, false" meaning:"istio-proxy is a native sidecar (an init container with restartPolicy Always), which the kubelet stops itself: the supervisor does nothing. It cannot be told from /proc; the injection template does not add the supervisor to such pods at all"`
	Shape                  Shape            `env:"SHAPE" envDefault:"container" accepts:"container, native" meaning:"the supervisor's own shape in the pod (not istio-proxy's: that is SUPERVISOR_NATIVE_SIDECAR). container: a regular container, which exits once the sidecars are stopped (under OnFailure, where a sidecar's exit was not 0, once the kubelet has started it again and it is stopped again). native: a native sidecar (an init container with restartPolicy Always, Kubernetes 1.29+), which the kubelet restarts on any death: once it has stopped the sidecars it idles until the kubelet's SIGTERM rather than exit, since a native sidecar that exits is restarted. The injection template sets it (The supervisor's shape)"`
	StateDir               string           `env:"STATE_DIR" accepts:"path" meaning:"a directory (an emptyDir) to keep the supervisor's journal and its ready file in; empty: none. With it, a supervisor the kubelet restarts carries on where the killed one stopped: the apps it had seen and how they ended, the sidecars it had stopped; and a second supervisor given the same directory (a standby) waits on a lock there, and carries on the moment the first dies. Where the supervisor has CAP_SYS_PACCT (as root), the kernel's process accounting records go there too: an app too quick to be watched, or that ended unread just before the supervisor was killed, still has its status. The native shape wants it: without one it runs native all the same, without a ready file (its startup probe passes at once) and without a journal. The injection template sets it"`
	HoldTimeout            time.Duration    `env:"HOLD_TIMEOUT" envDefault:"20s" accepts:"duration > 0" meaning:"hold mode (istio-proxy's preStop in long-running pods): give up waiting for the apps after this; keep it under terminationGracePeriodSeconds minus pilot-agent's drain"`
	ExitStatus             exitwatch.Method `env:"EXIT_STATUS" envDefault:"auto" accepts:"auto, pidfd, accounting, ptrace, none" meaning:"how app exit statuses are read. auto: pidfd (Linux 6.15+, no privileges), else ptrace (needs CAP_SYS_PTRACE, as root), else accounting (the kernel's process accounting: needs CAP_SYS_PACCT, as root, and SUPERVISOR_STATE_DIR; it gives failures, and exit 0 as unknown: the kernel also records 0 for a program of several threads whose main thread had not taken its code), else none (statuses unknown). Accounting, where it works, also fills in the statuses the others lose. A forced method that cannot work here is replaced by auto's choice, logged as an error and named in the termination message"`
	HTTPTimeout            time.Duration    `env:"HTTP_TIMEOUT" envDefault:"5s" accepts:"duration > 0" meaning:"bound on an HTTP action: while nothing answers (nothing listens yet, or the connection closed without an answer and the sidecar runs on a second later) it is tried again, until this long after the first try"`
	DeletionGrace          time.Duration    `env:"DELETION_GRACE" envDefault:"2s" accepts:"duration ≥ 0" meaning:"how long an app killed by SIGTERM may turn out to be a pod deletion before it counts as a failure"`
	ScanInterval           time.Duration    `env:"SCAN_INTERVAL" envDefault:"100ms" accepts:"duration > 0" meaning:"how often /proc is read while containers are being looked for: the apps, a restart awaited under OnFailure, the exec of an app adopted from its runtime's init (then every 2 ms for its first 2 s, and whenever the kernel's last PID moves); never once every app is found and running its program, except under exit-status ptrace until a sidecar is seen, to anchor accounting through (APP_START_TIMEOUT at most)"`
	TerminationMessagePath string           `env:"TERMINATION_MESSAGE_PATH" envDefault:"/dev/termination-log" accepts:"path" meaning:"where the one-line summary goes; if the file does not exist nothing is written"`
	LogLevel               zerolog.Level    `env:"LOG_LEVEL" envDefault:"info" accepts:"trace, debug, info, warn, error, disabled" meaning:"log level"`
	LogFormat              string           `env:"LOG_FORMAT" envDefault:"json" accepts:"json, console" meaning:"log format (stderr)"`
}

// Shape is how the supervisor runs in the pod (SUPERVISOR_SHAPE).
type Shape string

// The shapes.
const (
	ShapeContainer Shape = "container"
	ShapeNative    Shape = "native"
)

// UnmarshalText accepts container or native.
func (s *Shape) UnmarshalText(b []byte) error {
	switch v := Shape(strings.ToLower(string(b))); v {
	case ShapeContainer, ShapeNative:
		*s = v
		return nil
	}
	return errors.New("want container or native")
}

// SidecarActions maps a sidecar process name to its own action.
type SidecarActions map[string]Action

// UnmarshalText parses "name=action,name=action".
func (m *SidecarActions) UnmarshalText(b []byte) error {
	out := SidecarActions{}
	for _, part := range strings.Split(string(b), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, act, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return fmt.Errorf("%q: want name=action, such as cloud-sql-proxy=SIGTERM", part)
		}
		a, err := ParseAction(act)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		out[name] = a
	}
	*m = out
	return nil
}

// RestartPolicy is the pod's restartPolicy.
type RestartPolicy string

// The restart policies.
const (
	Never     RestartPolicy = "Never"
	OnFailure RestartPolicy = "OnFailure"
	Always    RestartPolicy = "Always"
)

// UnmarshalText accepts the policy in any case.
func (p *RestartPolicy) UnmarshalText(b []byte) error {
	for _, v := range []RestartPolicy{Never, OnFailure, Always} {
		if strings.EqualFold(string(b), string(v)) {
			*p = v
			return nil
		}
	}
	return errors.New("want Never, OnFailure or Always (the pod's restartPolicy)")
}

// Validate checks the rules that span fields or values the types allow but
// the supervisor does not. vars gives the raw values for the messages.
func (c *Config) Validate(vars map[string]string) []*ConfigError {
	var errs []*ConfigError
	bad := func(name, problem string) {
		errs = append(errs, &ConfigError{Var: name, Value: vars[EnvPrefix+name], Problem: problem})
	}
	// The rule each duration and count accepts, as its accepts tag says it.
	v := reflect.ValueOf(c).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		var n int64
		switch x := v.Field(i).Interface().(type) {
		case time.Duration:
			n = int64(x)
		case int:
			n = int64(x)
		default:
			continue
		}
		name := f.Tag.Get("env")
		switch accepts := f.Tag.Get("accepts"); {
		case strings.HasSuffix(accepts, "> 0") && n <= 0:
			bad(name, "want a positive duration such as 30s")
		case accepts == "duration ≥ 0" && n < 0:
			bad(name, "want a duration of 0 or more, such as 2s")
		case accepts == "whole number ≥ 0" && n < 0:
			bad(name, "want a whole number, 0 or more")
		}
	}
	for _, list := range []struct {
		name  string
		names []string
	}{{"APPS", c.Apps}, {"SIDECARS", c.Sidecars}, {"AFTER_APPS", c.AfterApps}} {
		for _, n := range list.names {
			if !validName(n) {
				bad(list.name, fmt.Sprintf("%q: want container names as the pod spec has them (lower case letters, digits and '-')", n))
			}
		}
	}
	for _, n := range c.Apps {
		if slices.Contains(c.Sidecars, n) {
			bad("APPS", fmt.Sprintf("%q is also in %sSIDECARS", n, EnvPrefix))
		}
	}
	for _, n := range c.AfterApps {
		if slices.Contains(c.Apps, n) {
			bad("AFTER_APPS", fmt.Sprintf("%q is also in %sAPPS: name the containers the kubelet starts after the apps", n, EnvPrefix))
		}
	}
	if len(c.Apps) > 0 && c.AppContainers != 0 && c.AppContainers != len(c.Apps) {
		bad("APP_CONTAINERS", fmt.Sprintf("%d, but %sAPPS names %d", c.AppContainers, EnvPrefix, len(c.Apps)))
	}
	if len(nonEmpty(c.SidecarProcesses)) == 0 {
		bad("SIDECAR_PROCESSES", "want a comma-separated list of process names, such as pilot-agent")
	}
	for _, n := range append(nonEmpty(c.SidecarProcesses), nonEmpty(c.IgnoreProcesses)...) {
		if strings.Contains(n, "/") {
			bad(nameOf(c, n), fmt.Sprintf("%q: want process names, not paths (pilot-agent, not /usr/local/bin/pilot-agent)", n))
		}
	}
	for _, n := range nonEmpty(c.IgnoreProcesses) {
		for _, s := range c.SidecarProcesses {
			if n == s {
				bad("IGNORE_PROCESSES", fmt.Sprintf("%q is also in %sSIDECAR_PROCESSES", n, EnvPrefix))
			}
		}
	}
	for name, a := range c.SidecarActions {
		if !slices.Contains(c.SidecarProcesses, name) && !slices.Contains(c.Sidecars, name) {
			bad("SIDECAR_ACTIONS", fmt.Sprintf("%q is not in %sSIDECAR_PROCESSES or %sSIDECARS", name, EnvPrefix, EnvPrefix))
		}
		if c.RestartPolicy == OnFailure && a.Kind == ActionSignal && a.Signal == exitwatch.SIGKILL {
			bad("SIDECAR_ACTIONS", fmt.Sprintf("%s=SIGKILL under restartPolicy OnFailure makes it exit 137, and the kubelet restarts it", name))
		}
	}
	if c.RestartPolicy == OnFailure {
		// A sidecar that exits non-zero is itself restarted under OnFailure.
		for name, a := range map[string]Action{"ON_SUCCESS": c.OnSuccess, "ON_UNKNOWN": c.OnUnknown} {
			if a.Kind == ActionSignal && a.Signal == exitwatch.SIGKILL {
				bad(name, "SIGKILL under restartPolicy OnFailure makes the sidecar exit 137, and the kubelet restarts it: use SIGTERM or an http(s) URL")
			}
		}
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		bad("LOG_FORMAT", "want json or console")
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		bad("STATE_DIR", "want an absolute path (an emptyDir's mount)")
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errs
}

func nameOf(c *Config, n string) string {
	for _, s := range c.SidecarProcesses {
		if s == n {
			return "SIDECAR_PROCESSES"
		}
	}
	return "IGNORE_PROCESSES"
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// MarshalZerologObject logs the effective configuration as one object,
// each setting under its variable's name in lower case.
func (c Config) MarshalZerologObject(e *zerolog.Event) {
	v := reflect.ValueOf(c)
	for i := 0; i < v.NumField(); i++ {
		key := strings.ToLower(v.Type().Field(i).Tag.Get("env"))
		switch x := v.Field(i).Interface().(type) {
		case []string:
			e.Strs(key, x)
		case int:
			e.Int(key, x)
		case bool:
			e.Bool(key, x)
		case string:
			e.Str(key, x)
		case SidecarActions:
			e.Interface(key, x)
		case fmt.Stringer: // durations, actions, the log level
			e.Stringer(key, x)
		default: // string types: the restart policy, the method
			e.Str(key, v.Field(i).String())
		}
	}
}

// validName reports whether s is a container name as the API accepts it
// (an RFC 1123 label).
func validName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// WantApps is how many app containers the run waits for: the named ones,
// or APP_CONTAINERS, at least one.
func (c *Config) WantApps() int {
	if len(c.Apps) > 0 {
		return len(c.Apps)
	}
	return max(c.AppContainers, 1)
}
