package supervisor

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Signal is a Linux signal number, parsed from a name such as "SIGTERM",
// "term" or "15".
type Signal int

// The signals the supervisor sends itself.
const (
	SIGINT  Signal = 2
	SIGKILL Signal = 9
	SIGTERM Signal = 15
)

// signalNames are the Linux (x86, arm64) numbers. Kept as data rather than
// taken from x/sys/unix so the package builds on any OS.
var signalNames = map[string]Signal{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12,
	"SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17,
	"SIGCONT": 18, "SIGSTOP": 19, "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22,
	"SIGURG": 23, "SIGXCPU": 24, "SIGXFSZ": 25, "SIGVTALRM": 26, "SIGPROF": 27,
	"SIGWINCH": 28, "SIGIO": 29, "SIGPWR": 30, "SIGSYS": 31,
}

// ParseSignal accepts a signal name with or without "SIG", in any case, or a
// number from 1 to 64 (real-time signals included).
func ParseSignal(s string) (Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal number %d out of range 1-64", n)
		}
		return Signal(n), nil
	}
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

// String returns the signal's name, e.g. "SIGTERM", or "SIG42".
func (s Signal) String() string {
	for name, n := range signalNames {
		if n == s {
			return name
		}
	}
	return "SIG" + strconv.Itoa(int(s))
}

// UnmarshalText lets env parse a Signal.
func (s *Signal) UnmarshalText(b []byte) error {
	sig, err := ParseSignal(string(b))
	if err != nil {
		return err
	}
	*s = sig
	return nil
}

// ActionKind says how an Action stops a sidecar.
type ActionKind int

// The kinds of action.
const (
	// ActionSignal sends a signal to the sidecar's main process.
	ActionSignal ActionKind = iota
	// ActionHTTP POSTs to a URL, such as pilot-agent's /quitquitquit.
	ActionHTTP
	// ActionNone leaves the sidecar running.
	ActionNone
)

// Action is what is done to the sidecars: a signal, an HTTP POST, or nothing.
type Action struct {
	Kind   ActionKind
	Signal Signal
	URL    *url.URL
}

// actionHelp is the accepted-values part of every action error.
const actionHelp = "a signal name (SIGTERM, SIGINT, SIGKILL, ...), none, or an http(s) URL to POST to such as http://127.0.0.1:15020/quitquitquit"

// ParseAction parses "SIGTERM", "none" or "http://127.0.0.1:15020/quitquitquit".
func ParseAction(s string) (Action, error) {
	s = strings.TrimSpace(s)
	switch lower := strings.ToLower(s); {
	case lower == "none":
		return Action{Kind: ActionNone}, nil
	case strings.HasPrefix(lower, "http://"), strings.HasPrefix(lower, "https://"):
		u, err := url.Parse(s)
		if err != nil {
			return Action{}, fmt.Errorf("bad URL %q: %w", s, err)
		}
		if u.Host == "" {
			return Action{}, fmt.Errorf("URL %q has no host", s)
		}
		if u.User != nil {
			return Action{}, fmt.Errorf("URL %q: credentials in the URL are not supported", u.Redacted())
		}
		return Action{Kind: ActionHTTP, URL: u}, nil
	case strings.Contains(lower, "://"):
		return Action{}, fmt.Errorf("URL %q: only http and https are supported", s)
	}
	sig, err := ParseSignal(s)
	if err != nil {
		return Action{}, fmt.Errorf("%w; want %s", err, actionHelp)
	}
	return Action{Kind: ActionSignal, Signal: sig}, nil
}

// UnmarshalText lets env parse an Action.
func (a *Action) UnmarshalText(b []byte) error {
	act, err := ParseAction(string(b))
	if err != nil {
		return err
	}
	*a = act
	return nil
}

// String gives the action as it would be configured.
func (a Action) String() string {
	switch a.Kind {
	case ActionNone:
		return "none"
	case ActionHTTP:
		return "POST " + a.URL.Redacted()
	}
	return a.Signal.String()
}

// MarshalText makes the action readable in the logged configuration.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }
