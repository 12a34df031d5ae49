package supervisor

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

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
	Signal exitwatch.Signal
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
	sig, err := exitwatch.ParseSignal(s)
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
