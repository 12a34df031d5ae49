package supervisor

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/rs/zerolog"
)

// Loading the configuration: every bad setting reported, and replaced, so
// that the supervisor always has one to run with (LoadConfig).

// ConfigError is a bad setting: the variable, the value, what it accepts,
// and what LoadConfig used in its place.
type ConfigError struct {
	Var, Value, Problem, Used string
}

func (e *ConfigError) Error() string {
	s := fmt.Sprintf("%s%s=%q: %s", EnvPrefix, e.Var, e.Value, e.Problem)
	if e.Used != "" {
		s += " (" + e.Used + ", used in its place)"
	}
	return s
}

// LoadConfig reads the configuration from environ (as os.Environ gives it)
// and validates it. Every bad setting is reported in err, each naming its
// variable, the values it accepts and the value used in its place
// (ConfigError.Used). unknown lists SUPERVISOR_* variables that no setting
// reads (a typo, or a setting of a newer version), to be warned of.
//
// Whatever err says, cfg is a configuration to run with: each bad variable
// at its default, but a bad SUPERVISOR_RESTART_POLICY at OnFailure (whose
// waits hold a sidecar for a restart, a bounded time, where Never's stop it
// early under a pod that restarts its apps), and whatever that made bad in
// turn likewise. A supervisor that refused to start would leave the
// sidecar up and the Job hanging, the failure it exists to remove: a typo
// in a setting must cost a log line, not a cluster's Jobs.
func LoadConfig(environ []string) (cfg Config, unknown []string, err error) {
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	cfg, unknown, errs, err := load(vars)
	if err != nil {
		return cfg, unknown, err
	}
	var all []error
	seen := map[string]bool{}
	// Each round puts at least one more variable back, so it ends within
	// as many rounds as there are settings; a round that could not (a
	// rule broken by defaults alone) leaves every setting at its default.
	for len(errs) > 0 {
		progress := false
		for _, e := range errs {
			if seen[e.Var] {
				continue
			}
			seen[e.Var], progress = true, true
			delete(vars, EnvPrefix+e.Var)
			e.Used = "no value, its default"
			if d, _ := defaultOf(e.Var); d != "" {
				e.Used = "its default, " + d
			}
			if e.Var == "RESTART_POLICY" {
				vars[EnvPrefix+e.Var] = string(OnFailure)
				e.Used = "OnFailure, whose waits are bounded whatever the pod's policy"
			}
			all = append(all, e)
		}
		if !progress {
			vars = map[string]string{EnvPrefix + "RESTART_POLICY": string(OnFailure)}
		}
		if cfg, _, errs, err = load(vars); err != nil {
			return cfg, unknown, err
		}
		if !progress && len(errs) > 0 {
			return cfg, unknown, fmt.Errorf("the defaults break a rule of their own: %v", errs[0])
		}
	}
	if cfg.Shape == ShapeNative && cfg.StateDir == "" {
		all = nativeWithoutState(all, vars[EnvPrefix+"STATE_DIR"])
	}
	return cfg, unknown, errors.Join(all...)
}

// nativeWithoutState says what the native shape runs without, where it has
// no state directory (none set, or a bad one): not a reason to change the
// shape, since in a native sidecar's place only the native shape idles
// rather than exit once done (a native sidecar that exits is started
// again), and its startup probe then passes without the ready file
// (ReadyProbe). The bad STATE_DIR's error says it, or an error of its own.
func nativeWithoutState(all []error, value string) []error {
	const used = "none: the startup probe passes without waiting for the first scan, and a restarted supervisor starts over"
	for _, e := range all {
		if ce, ok := e.(*ConfigError); ok && ce.Var == "STATE_DIR" {
			ce.Used = used
			return all
		}
	}
	return append(all, &ConfigError{Var: "STATE_DIR", Value: value, Used: used,
		Problem: EnvPrefix + "SHAPE=native wants one (an emptyDir's mount): its ready file tells the kubelet's startup probe the first scan is done, and its journal lets a restarted supervisor carry on"})
}

// load parses and validates vars: errs are the bad settings; err, a fault
// of the configuration's own declaration.
func load(vars map[string]string) (cfg Config, unknown []string, errs []*ConfigError, err error) {
	opts := env.Options{
		Environment: vars,
		Prefix:      EnvPrefix,
	}
	params, err := env.GetFieldParamsWithOptions(&cfg, opts)
	if err != nil {
		return cfg, nil, nil, err
	}
	known := map[string]bool{} // full variable names
	for _, p := range params {
		known[p.Key] = true
	}
	failed := map[string]bool{} // variables that did not parse
	if perr := env.ParseWithOptions(&cfg, opts); perr != nil {
		var agg env.AggregateError
		if !errors.As(perr, &agg) {
			return cfg, nil, nil, perr
		}
		for _, e := range agg.Errors {
			var pe env.ParseError
			if !errors.As(e, &pe) {
				return cfg, nil, nil, e
			}
			f, _ := reflect.TypeOf(cfg).FieldByName(pe.Name)
			name := f.Tag.Get("env")
			failed[name] = true
			errs = append(errs, &ConfigError{Var: name, Value: vars[EnvPrefix+name], Problem: describe(f, pe.Err)})
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
	cfg.Apps, cfg.Sidecars = nonEmpty(cfg.Apps), nonEmpty(cfg.Sidecars)
	cfg.SidecarProcesses = nonEmpty(cfg.SidecarProcesses)
	cfg.IgnoreProcesses = nonEmpty(cfg.IgnoreProcesses)
	for _, e := range cfg.Validate(vars) {
		// A variable that did not parse was left at its zero value: its
		// parse error says it all.
		if !failed[e.Var] {
			errs = append(errs, e)
		}
	}
	return cfg, unknown, errs, nil
}

// defaultOf is the default of the setting named v (without the prefix).
func defaultOf(v string) (string, bool) {
	t := reflect.TypeOf(Config{})
	for i := range t.NumField() {
		if f := t.Field(i); f.Tag.Get("env") == v {
			return f.Tag.Get("envDefault"), true
		}
	}
	return "", false
}

// describe turns a parser's error into what the variable accepts, by the
// field's type; types of our own say it in their error.
func describe(field reflect.StructField, err error) string {
	switch field.Type {
	case reflect.TypeOf(time.Duration(0)):
		return "want a duration such as 30s, 1m30s or 500ms"
	case reflect.TypeOf(0):
		return "want a whole number, 0 or more"
	case reflect.TypeOf(false):
		return "want true or false"
	case reflect.TypeOf(zerolog.Level(0)):
		return "want trace, debug, info, warn, error or disabled"
	}
	return err.Error()
}
