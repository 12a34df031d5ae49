package supervisor

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/caarlos0/env/v11"
	"github.com/rs/zerolog"
)

// EnvPrefix is the prefix of every setting's environment variable.
const EnvPrefix = "SUPERVISOR_"

// Config is the supervisor's configuration, read from SUPERVISOR_*
// environment variables. The README's table lists the same settings.
type Config struct {
	// SidecarProcesses names the main processes of the containers to stop.
	SidecarProcesses []string `env:"SIDECAR_PROCESSES" envDefault:"pilot-agent"`
	// IgnoreProcesses names the main processes of containers that are
	// neither waited for nor stopped.
	IgnoreProcesses []string `env:"IGNORE_PROCESSES"`
	// AppContainers is how many application containers to wait for; 0
	// takes whatever is there once at least one is.
	AppContainers int `env:"APP_CONTAINERS" envDefault:"0"`
	// AppStartTimeout bounds the wait for the application containers.
	AppStartTimeout time.Duration `env:"APP_START_TIMEOUT" envDefault:"30s"`
	// SidecarStartTimeout bounds the wait for a sidecar to appear, when
	// the apps finished before it started, and then for it to handle a
	// graceful signal (sidecars.go).
	SidecarStartTimeout time.Duration `env:"SIDECAR_START_TIMEOUT" envDefault:"30s"`
	// StopTimeout is how long a sidecar has to exit after the action before
	// it gets SIGKILL.
	StopTimeout time.Duration `env:"STOP_TIMEOUT" envDefault:"30s"`
	// OnSuccess, OnFailure and OnUnknown are the actions for each outcome.
	OnSuccess Action `env:"ON_SUCCESS" envDefault:"SIGTERM"`
	OnFailure Action `env:"ON_FAILURE" envDefault:"SIGKILL"`
	OnUnknown Action `env:"ON_UNKNOWN" envDefault:"SIGTERM"`
	// SidecarActions gives some sidecars their own action, whatever the
	// outcome: "cloud-sql-proxy=SIGINT,pilot-agent=http://...".
	SidecarActions SidecarActions `env:"SIDECAR_ACTIONS"`
	// HTTPTimeout bounds an HTTP action, retries while nothing answers
	// included.
	HTTPTimeout time.Duration `env:"HTTP_TIMEOUT" envDefault:"5s"`
	// DeletionGrace is how long an application killed by SIGTERM is given to
	// turn out to be a pod deletion (the supervisor's own SIGTERM) before it
	// counts as a failure.
	DeletionGrace time.Duration `env:"DELETION_GRACE" envDefault:"2s"`
	// ScanInterval is how often /proc is read while containers are being
	// looked for. Nothing polls once the apps are found.
	ScanInterval time.Duration `env:"SCAN_INTERVAL" envDefault:"100ms"`
	// TerminationMessagePath receives a one-line summary at exit.
	TerminationMessagePath string `env:"TERMINATION_MESSAGE_PATH" envDefault:"/dev/termination-log"`
	// RestartPolicy is the pod's restartPolicy.
	RestartPolicy RestartPolicy `env:"RESTART_POLICY" envDefault:"Never"`
	// RestartTimeout bounds, under OnFailure, the wait for the restart of
	// an app whose exit status could not be read (the kubelet's back-off
	// between restarts reaches 5 minutes).
	RestartTimeout time.Duration `env:"RESTART_TIMEOUT" envDefault:"5m30s"`
	// NativeSidecar says the sidecar is a native sidecar (an init container
	// with restartPolicy Always), which the kubelet stops itself.
	NativeSidecar bool `env:"NATIVE_SIDECAR" envDefault:"false"`
	// HoldTimeout bounds the hold mode (the istio-proxy container's preStop
	// hook): keep it under terminationGracePeriodSeconds minus pilot-agent's
	// terminationDrainDuration.
	HoldTimeout time.Duration `env:"HOLD_TIMEOUT" envDefault:"20s"`
	// ExitStatus says how app exit statuses are read: auto, pidfd, ptrace
	// or none.
	ExitStatus exitwatch.Method `env:"EXIT_STATUS" envDefault:"auto"`
	// LogLevel and LogFormat shape the log on stderr.
	LogLevel  zerolog.Level `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat string        `env:"LOG_FORMAT" envDefault:"json"`
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
	return errors.New("want Never, OnFailure or Always")
}

// ConfigError is a bad setting: the variable, the value and what it accepts.
type ConfigError struct {
	Var, Value, Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s%s=%q: %s", EnvPrefix, e.Var, e.Value, e.Problem)
}

// LoadConfig reads the configuration from environ (as os.Environ gives it)
// and validates it. Every bad setting is reported, each naming its variable
// and the values it accepts. unknown lists SUPERVISOR_* variables that no
// setting reads (a typo, or a setting of a newer version), to be warned of.
func LoadConfig(environ []string) (cfg Config, unknown []string, err error) {
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	opts := env.Options{
		Environment: vars,
		Prefix:      EnvPrefix,
	}
	params, err := env.GetFieldParamsWithOptions(&cfg, opts)
	if err != nil {
		return cfg, nil, err
	}
	known := map[string]bool{} // full variable names
	for _, p := range params {
		known[p.Key] = true
	}
	fields := reflect.TypeOf(cfg)
	varOf := func(field string) string {
		if f, ok := fields.FieldByName(field); ok {
			return f.Tag.Get("env")
		}
		return field
	}
	var errs []error
	failed := map[string]bool{} // variables that did not parse
	if perr := env.ParseWithOptions(&cfg, opts); perr != nil {
		var agg env.AggregateError
		if !errors.As(perr, &agg) {
			return cfg, nil, perr
		}
		for _, e := range agg.Errors {
			var pe env.ParseError
			if errors.As(e, &pe) {
				name := varOf(pe.Name)
				failed[name] = true
				errs = append(errs, &ConfigError{Var: name, Value: vars[EnvPrefix+name], Problem: describe(name, pe.Err)})
				continue
			}
			errs = append(errs, e)
		}
	}
	for k := range vars {
		if strings.HasPrefix(k, EnvPrefix) {
			if !known[k] {
				unknown = append(unknown, k)
			}
		}
	}
	sort.Strings(unknown)
	cfg.SidecarProcesses = nonEmpty(cfg.SidecarProcesses)
	cfg.IgnoreProcesses = nonEmpty(cfg.IgnoreProcesses)
	for _, e := range cfg.Validate(vars) {
		// A variable that did not parse was left at its zero value: its
		// parse error says it all.
		var ce *ConfigError
		if errors.As(e, &ce) && failed[ce.Var] {
			continue
		}
		errs = append(errs, e)
	}
	return cfg, unknown, errors.Join(errs...)
}

// describe turns a parser's error into what the variable accepts.
func describe(name string, err error) string {
	switch name {
	case "APP_CONTAINERS":
		return "want a whole number, 0 or more"
	case "LOG_LEVEL":
		return "want trace, debug, info, warn, error or disabled"
	case "EXIT_STATUS":
		return "want auto, pidfd, ptrace or none"
	case "RESTART_POLICY":
		return "want Never, OnFailure or Always (the pod's restartPolicy)"
	case "NATIVE_SIDECAR":
		return "want true or false"
	}
	if strings.HasSuffix(name, "TIMEOUT") || strings.HasSuffix(name, "GRACE") || strings.HasSuffix(name, "INTERVAL") {
		return "want a duration such as 30s, 1m30s or 500ms"
	}
	return err.Error()
}

// Validate checks the rules that span fields or values the types allow but
// the supervisor does not. vars gives the raw values for the messages.
func (c *Config) Validate(vars map[string]string) []error {
	var errs []error
	bad := func(name, problem string) {
		errs = append(errs, &ConfigError{Var: name, Value: vars[EnvPrefix+name], Problem: problem})
	}
	if c.AppContainers < 0 {
		bad("APP_CONTAINERS", "want a whole number, 0 or more")
	}
	for name, d := range map[string]time.Duration{
		"APP_START_TIMEOUT": c.AppStartTimeout, "SIDECAR_START_TIMEOUT": c.SidecarStartTimeout,
		"STOP_TIMEOUT": c.StopTimeout, "HTTP_TIMEOUT": c.HTTPTimeout, "SCAN_INTERVAL": c.ScanInterval,
		"RESTART_TIMEOUT": c.RestartTimeout, "HOLD_TIMEOUT": c.HoldTimeout,
	} {
		if d <= 0 {
			bad(name, "want a positive duration such as 30s")
		}
	}
	if c.DeletionGrace < 0 {
		bad("DELETION_GRACE", "want a duration of 0 or more, such as 2s")
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
		if !slices.Contains(c.SidecarProcesses, name) {
			bad("SIDECAR_ACTIONS", fmt.Sprintf("%q is not in %sSIDECAR_PROCESSES", name, EnvPrefix))
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

// MarshalZerologObject logs the effective configuration as one object.
func (c Config) MarshalZerologObject(e *zerolog.Event) {
	e.Strs("sidecar_processes", c.SidecarProcesses).
		Strs("ignore_processes", c.IgnoreProcesses).
		Int("app_containers", c.AppContainers).
		Str("app_start_timeout", c.AppStartTimeout.String()).
		Str("sidecar_start_timeout", c.SidecarStartTimeout.String()).
		Str("stop_timeout", c.StopTimeout.String()).
		Stringer("on_success", c.OnSuccess).
		Stringer("on_failure", c.OnFailure).
		Stringer("on_unknown", c.OnUnknown).
		Interface("sidecar_actions", c.SidecarActions).
		Str("http_timeout", c.HTTPTimeout.String()).
		Str("deletion_grace", c.DeletionGrace.String()).
		Str("scan_interval", c.ScanInterval.String()).
		Str("termination_message_path", c.TerminationMessagePath).
		Str("exit_status", string(c.ExitStatus)).
		Str("restart_policy", string(c.RestartPolicy)).
		Str("restart_timeout", c.RestartTimeout.String()).
		Bool("native_sidecar", c.NativeSidecar).
		Str("hold_timeout", c.HoldTimeout.String()).
		Stringer("log_level", c.LogLevel).
		Str("log_format", c.LogFormat)
}
