package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
)

func TestConfigDefaults(t *testing.T) {
	cfg, unknown, err := LoadConfig(nil)
	if err != nil || unknown != nil {
		t.Fatalf("LoadConfig(nil) = %v, %v", unknown, err)
	}
	want := Config{
		Sidecars: DefaultSidecars(), SidecarProcesses: []string{"pilot-agent", "linkerd2-proxy", "daprd", "consul-dataplane", "cloud-sql-proxy", "otelcol", "otelcol-contrib", "fluent-bit"},
		AppContainers:   0,
		AppStartTimeout: 30 * time.Second, AfterAppsTimeout: time.Hour, SidecarStartTimeout: 30 * time.Second, StopTimeout: 30 * time.Second,
		OnSuccess: Action{Kind: ActionSignal, Signal: exitwatch.SIGTERM}, OnFailure: Action{Kind: ActionSignal, Signal: exitwatch.SIGKILL},
		OnUnknown: Action{Kind: ActionSignal, Signal: exitwatch.SIGTERM}, HTTPTimeout: 5 * time.Second, DeletionGrace: 2 * time.Second,
		ScanInterval: 100 * time.Millisecond, TerminationMessagePath: "/dev/termination-log", ExitStatus: exitwatch.Auto,
		RestartPolicy: Never, RestartTimeout: 330 * time.Second, RestartMargin: 15 * time.Second, HoldTimeout: 20 * time.Second,
		LogLevel: zerolog.InfoLevel, LogFormat: "json", Shape: ShapeContainer,
	}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

// TestConfigGood sets every setting to a good non-default value.
func TestConfigGood(t *testing.T) {
	tests := []struct {
		env   string
		check func(Config) bool
	}{
		{"SUPERVISOR_SIDECAR_PROCESSES=pilot-agent, cloud-sql-proxy", func(c Config) bool {
			return cmp.Equal(c.SidecarProcesses, []string{"pilot-agent", "cloud-sql-proxy"})
		}},
		{"SUPERVISOR_IGNORE_PROCESSES=logrotate", func(c Config) bool { return cmp.Equal(c.IgnoreProcesses, []string{"logrotate"}) }},
		{"SUPERVISOR_APP_CONTAINERS=3", func(c Config) bool { return c.AppContainers == 3 }},
		{"SUPERVISOR_APP_START_TIMEOUT=2m", func(c Config) bool { return c.AppStartTimeout == 2*time.Minute }},
		{"SUPERVISOR_SIDECAR_START_TIMEOUT=1m30s", func(c Config) bool { return c.SidecarStartTimeout == 90*time.Second }},
		{"SUPERVISOR_STOP_TIMEOUT=500ms", func(c Config) bool { return c.StopTimeout == 500*time.Millisecond }},
		{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit", func(c Config) bool {
			return c.OnSuccess.Kind == ActionHTTP && c.OnSuccess.URL.String() == "http://127.0.0.1:15020/quitquitquit"
		}},
		{"SUPERVISOR_ON_SUCCESS=https://localhost/quit", func(c Config) bool { return c.OnSuccess.Kind == ActionHTTP }},
		{"SUPERVISOR_ON_FAILURE=term", func(c Config) bool { return c.OnFailure == Action{Kind: ActionSignal, Signal: exitwatch.SIGTERM} }},
		{"SUPERVISOR_ON_FAILURE=9", func(c Config) bool { return c.OnFailure == Action{Kind: ActionSignal, Signal: exitwatch.SIGKILL} }},
		{"SUPERVISOR_ON_UNKNOWN=None", func(c Config) bool { return c.OnUnknown.Kind == ActionNone }},
		{"SUPERVISOR_ON_UNKNOWN=SIGINT", func(c Config) bool { return c.OnUnknown.Signal == exitwatch.SIGINT }},
		{"SUPERVISOR_HTTP_TIMEOUT=1s", func(c Config) bool { return c.HTTPTimeout == time.Second }},
		{"SUPERVISOR_DELETION_GRACE=0s", func(c Config) bool { return c.DeletionGrace == 0 }},
		{"SUPERVISOR_SCAN_INTERVAL=1s", func(c Config) bool { return c.ScanInterval == time.Second }},
		{"SUPERVISOR_TERMINATION_MESSAGE_PATH=/tmp/x", func(c Config) bool { return c.TerminationMessagePath == "/tmp/x" }},
		{"SUPERVISOR_LOG_LEVEL=debug", func(c Config) bool { return c.LogLevel == zerolog.DebugLevel }},
		{"SUPERVISOR_LOG_LEVEL=WARN", func(c Config) bool { return c.LogLevel == zerolog.WarnLevel }},
		{"SUPERVISOR_LOG_FORMAT=console", func(c Config) bool { return c.LogFormat == "console" }},
		{"SUPERVISOR_EXIT_STATUS=ptrace", func(c Config) bool { return c.ExitStatus == exitwatch.Ptrace }},
		{"SUPERVISOR_RESTART_POLICY=OnFailure", func(c Config) bool { return c.RestartPolicy == OnFailure }},
		{"SUPERVISOR_RESTART_POLICY=always", func(c Config) bool { return c.RestartPolicy == Always }},
		{"SUPERVISOR_RESTART_TIMEOUT=1m", func(c Config) bool { return c.RestartTimeout == time.Minute }},
		{"SUPERVISOR_NATIVE_SIDECAR=true", func(c Config) bool { return c.NativeSidecar }},
		{"SUPERVISOR_HOLD_TIMEOUT=45s", func(c Config) bool { return c.HoldTimeout == 45*time.Second }},
		{"SUPERVISOR_SIDECAR_ACTIONS=pilot-agent=http://127.0.0.1:15020/quitquitquit", func(c Config) bool {
			return c.SidecarActions["pilot-agent"].Kind == ActionHTTP
		}},
		{"SUPERVISOR_EXIT_STATUS=None", func(c Config) bool { return c.ExitStatus == exitwatch.None }},
		// An empty value means the default (a template may render one).
		{"SUPERVISOR_STOP_TIMEOUT=", func(c Config) bool { return c.StopTimeout == 30*time.Second }},
		{"SUPERVISOR_ON_FAILURE=", func(c Config) bool { return c.OnFailure.Signal == exitwatch.SIGKILL }},
	}
	for _, tt := range tests {
		cfg, _, err := LoadConfig([]string{tt.env})
		if err != nil {
			t.Errorf("%s: %v", tt.env, err)
			continue
		}
		if !tt.check(cfg) {
			t.Errorf("%s: got %+v", tt.env, cfg)
		}
	}
}

// TestConfigBad: each bad value is refused with a message naming the
// variable and what it accepts.
func TestConfigBad(t *testing.T) {
	tests := []struct{ env, want string }{
		{"SUPERVISOR_SIDECAR_PROCESSES= , ", `SUPERVISOR_SIDECAR_PROCESSES=" , ": want a comma-separated list`},
		{"SUPERVISOR_SIDECAR_PROCESSES=/usr/local/bin/pilot-agent", "want process names, not paths"},
		{"SUPERVISOR_IGNORE_PROCESSES=pilot-agent", `"pilot-agent" is also in SUPERVISOR_SIDECAR_PROCESSES`},
		{"SUPERVISOR_APP_CONTAINERS=two", `SUPERVISOR_APP_CONTAINERS="two": want a whole number, 0 or more`},
		{"SUPERVISOR_APP_CONTAINERS=-1", `SUPERVISOR_APP_CONTAINERS="-1": want a whole number, 0 or more`},
		{"SUPERVISOR_APP_START_TIMEOUT=30", `SUPERVISOR_APP_START_TIMEOUT="30": want a duration such as 30s`},
		{"SUPERVISOR_SIDECAR_START_TIMEOUT=0s", `SUPERVISOR_SIDECAR_START_TIMEOUT="0s": want a positive duration`},
		{"SUPERVISOR_STOP_TIMEOUT=-5s", `SUPERVISOR_STOP_TIMEOUT="-5s": want a positive duration`},
		{"SUPERVISOR_ON_SUCCESS=SIGTERMINATE", `SUPERVISOR_ON_SUCCESS="SIGTERMINATE": unknown signal "SIGTERMINATE"; want a signal name`},
		{"SUPERVISOR_ON_FAILURE=65", `SUPERVISOR_ON_FAILURE="65": signal number 65 out of range 1-64`},
		{"SUPERVISOR_ON_UNKNOWN=ftp://host/quit", "only http and https are supported"},
		{"SUPERVISOR_ON_UNKNOWN=http:///quit", "has no host"},
		{"SUPERVISOR_ON_SUCCESS=http://user:pw@127.0.0.1/quit", "credentials in the URL are not supported"},
		{"SUPERVISOR_HTTP_TIMEOUT=soon", `SUPERVISOR_HTTP_TIMEOUT="soon": want a duration`},
		{"SUPERVISOR_DELETION_GRACE=-1s", `SUPERVISOR_DELETION_GRACE="-1s": want a duration of 0 or more`},
		{"SUPERVISOR_SCAN_INTERVAL=0", `SUPERVISOR_SCAN_INTERVAL="0": want a positive duration`},
		{"SUPERVISOR_LOG_LEVEL=loud", `SUPERVISOR_LOG_LEVEL="loud": want trace, debug, info, warn, error or disabled`},
		{"SUPERVISOR_LOG_FORMAT=xml", `SUPERVISOR_LOG_FORMAT="xml": want json or console`},
		{"SUPERVISOR_STATE_DIR=state", `SUPERVISOR_STATE_DIR="state": want an absolute path`},
		{"SUPERVISOR_SHAPE=sidecar", `SUPERVISOR_SHAPE="sidecar": want container or native`},
		{"SUPERVISOR_EXIT_STATUS=strace", `SUPERVISOR_EXIT_STATUS="strace": want auto, pidfd, accounting, ptrace or none`},
		{"SUPERVISOR_RESTART_POLICY=Sometimes", `SUPERVISOR_RESTART_POLICY="Sometimes": want Never, OnFailure or Always`},
		{"SUPERVISOR_RESTART_TIMEOUT=0s", `SUPERVISOR_RESTART_TIMEOUT="0s": want a positive duration`},
		{"SUPERVISOR_NATIVE_SIDECAR=maybe", `SUPERVISOR_NATIVE_SIDECAR="maybe": want true or false`},
		{"SUPERVISOR_HOLD_TIMEOUT=forever", `SUPERVISOR_HOLD_TIMEOUT="forever": want a duration`},
		{"SUPERVISOR_SIDECAR_ACTIONS=mystery-proxy=SIGTERM", `"mystery-proxy" is not in SUPERVISOR_SIDECAR_PROCESSES or SUPERVISOR_SIDECARS`},
		{"SUPERVISOR_SIDECAR_ACTIONS=pilot-agent", `want name=action`},
		{"SUPERVISOR_SIDECAR_ACTIONS=pilot-agent=SIGNOPE", `pilot-agent: unknown signal "SIGNOPE"`},
		{"SUPERVISOR_APPS=app,Worker", `SUPERVISOR_APPS="app,Worker": "Worker": want container names as the pod spec has them`},
		{"SUPERVISOR_SIDECARS=istio_proxy", `SUPERVISOR_SIDECARS="istio_proxy": "istio_proxy": want container names`},
		{"SUPERVISOR_APPS=app,istio-proxy", `"istio-proxy" is also in SUPERVISOR_SIDECARS`},
	}
	defaults, _, _ := LoadConfig(nil)
	for _, tt := range tests {
		cfg, _, err := LoadConfig([]string{tt.env})
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasSuffix(err.Error(), "used in its place)") {
			t.Errorf("%s: err = %v, want it to contain %q and name what was used", tt.env, err, tt.want)
		}
		if err != nil && strings.Count(err.Error(), "\n") != 0 {
			t.Errorf("%s: one bad setting gave several errors: %v", tt.env, err)
		}
		// The configuration to run with all the same: the defaults, but
		// a bad restart policy's OnFailure.
		want := defaults
		if strings.HasPrefix(tt.env, "SUPERVISOR_RESTART_POLICY=") {
			want.RestartPolicy = OnFailure
		}
		if diff := cmp.Diff(want, cfg); diff != "" {
			t.Errorf("%s: the configuration run with (-want +got):\n%s", tt.env, diff)
		}
	}
}

// TestConfigFallback: the good settings are kept beside a bad one, and a
// value the replacement made bad is replaced in turn.
func TestConfigFallback(t *testing.T) {
	cfg, _, err := LoadConfig([]string{"SUPERVISOR_RESTART_POLICY=sometimes", "SUPERVISOR_ON_SUCCESS=SIGKILL",
		"SUPERVISOR_STOP_TIMEOUT=soon", "SUPERVISOR_SCAN_INTERVAL=1s"})
	sigterm := Action{Kind: ActionSignal, Signal: exitwatch.SIGTERM}
	if cfg.RestartPolicy != OnFailure || cfg.OnSuccess != sigterm || cfg.StopTimeout != 30*time.Second || cfg.ScanInterval != time.Second {
		t.Errorf("run with %+v", cfg)
	}
	for _, want := range []string{
		`SUPERVISOR_RESTART_POLICY="sometimes": want Never, OnFailure or Always (the pod's restartPolicy) (OnFailure, whose waits are bounded whatever the pod's policy, used in its place)`,
		`SUPERVISOR_ON_SUCCESS="SIGKILL": SIGKILL under restartPolicy OnFailure makes the sidecar exit 137, and the kubelet restarts it: use SIGTERM or an http(s) URL (its default, SIGTERM, used in its place)`,
		`SUPERVISOR_STOP_TIMEOUT="soon": want a duration such as 30s, 1m30s or 500ms (its default, 30s, used in its place)`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to contain %s", err, want)
		}
	}
	if err == nil || strings.Count(err.Error(), "\n") != 2 {
		t.Errorf("err = %v, want three bad settings", err)
	}
	if _, _, err := LoadConfig([]string{"SUPERVISOR_APPS=app,Worker"}); err == nil || !strings.Contains(err.Error(), "(no value, its default, used in its place)") {
		t.Errorf("err = %v", err)
	}
}

// TestConfigNativeWithoutStateDir: the native shape without a usable state
// directory stays native (in a native sidecar's place only it idles once
// done, rather than exit and be started again), and the error says what it
// runs without.
func TestConfigNativeWithoutStateDir(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"", `SUPERVISOR_STATE_DIR="": SUPERVISOR_SHAPE=native wants one (an emptyDir's mount)`},
		{"SUPERVISOR_STATE_DIR=state", `SUPERVISOR_STATE_DIR="state": want an absolute path`},
	} {
		cfg, _, err := LoadConfig([]string{"SUPERVISOR_SHAPE=native", tc.env})
		if cfg.Shape != ShapeNative || cfg.StateDir != "" {
			t.Errorf("%q: run with shape %s, state directory %q; want native, none", tc.env, cfg.Shape, cfg.StateDir)
		}
		if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), tc.want) ||
			!strings.HasSuffix(err.Error(), "(none: the startup probe passes without waiting for the first scan, and a restarted supervisor starts over, used in its place)") {
			t.Errorf("%q: err = %v, want one error containing %q that says what native runs without", tc.env, err, tc.want)
		}
	}
	if _, _, err := LoadConfig([]string{"SUPERVISOR_SHAPE=native", "SUPERVISOR_STATE_DIR=/state"}); err != nil {
		t.Errorf("native with a state directory: %v", err)
	}
}

// TestConfigOnFailure: SIGKILL would make the sidecar exit 137, and the
// kubelet would restart it under OnFailure.
func TestConfigOnFailure(t *testing.T) {
	for _, env := range [][]string{
		{"SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_ON_SUCCESS=SIGKILL"},
		{"SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_ON_UNKNOWN=9"},
		{"SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_SIDECAR_ACTIONS=pilot-agent=SIGKILL"},
	} {
		if _, _, err := LoadConfig(env); err == nil || !strings.Contains(err.Error(), "the kubelet restarts it") {
			t.Errorf("%q: err = %v", env, err)
		}
	}
	// The default failure action is fine: under OnFailure it is never used.
	if _, _, err := LoadConfig([]string{"SUPERVISOR_RESTART_POLICY=OnFailure"}); err != nil {
		t.Errorf("OnFailure with defaults: %v", err)
	}
}

// TestConfigAllBad: every error is reported, not just the first.
func TestConfigAppsCount(t *testing.T) {
	_, _, err := LoadConfig([]string{"SUPERVISOR_APPS=a,b", "SUPERVISOR_APP_CONTAINERS=3"})
	if err == nil || !strings.Contains(err.Error(), `SUPERVISOR_APP_CONTAINERS="3": 3, but SUPERVISOR_APPS names 2`) {
		t.Errorf("err = %v", err)
	}
	cfg, _, err := LoadConfig([]string{"SUPERVISOR_APPS=a, b", "SUPERVISOR_APP_CONTAINERS=2"})
	if err != nil || cfg.WantApps() != 2 || !cmp.Equal(cfg.Apps, []string{"a", "b"}) {
		t.Errorf("cfg %+v, %v", cfg.Apps, err)
	}
}

func TestConfigAllBad(t *testing.T) {
	_, _, err := LoadConfig([]string{"SUPERVISOR_STOP_TIMEOUT=x", "SUPERVISOR_LOG_FORMAT=xml", "SUPERVISOR_APP_CONTAINERS=-2"})
	if err == nil || strings.Count(err.Error(), "\n") != 2 {
		t.Errorf("err = %v, want three errors", err)
	}
}

func TestConfigUnknown(t *testing.T) {
	_, unknown, err := LoadConfig([]string{"SUPERVISOR_STOP_TIMOUT=5s", "SUPERVISOR_ON_SUCCESS=none", "OTHER_THING=1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"SUPERVISOR_STOP_TIMOUT"}, unknown); diff != "" {
		t.Errorf("unknown (-want +got):\n%s", diff)
	}
}

func TestSignalNames(t *testing.T) {
	for in, want := range map[string]exitwatch.Signal{"SIGTERM": 15, "term": 15, "Kill": 9, "SIGUSR1": 10, "2": 2, "34": 34} {
		got, err := exitwatch.ParseSignal(in)
		if err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if got := exitwatch.Signal(15).String(); got != "SIGTERM" {
		t.Errorf("Signal(15) = %q", got)
	}
	if got := exitwatch.Signal(40).String(); got != "SIG40" {
		t.Errorf("Signal(40) = %q", got)
	}
}
