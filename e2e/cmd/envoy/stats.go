package main

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Envoy's server.state values (envoy.admin.v3.ServerInfo.State), which
// pilot-agent's readiness probe compares against.
const (
	stateLive            = 0
	stateDraining        = 1
	statePreInitializing = 2
)

// server holds the stand-in's mutable state: the stats the admin API shows.
type server struct {
	start       time.Time
	concurrency int
	drainTime   time.Duration // --drain-time-s, shown in /server_info
	listeners   []string      // stat names of the bootstrap listeners, e.g. "0.0.0.0_15021"

	mu           sync.Mutex
	ready        bool // config "received" and workers "started"
	healthFailed bool // POST /healthcheck/fail
	draining     bool // POST /drain_listeners
}

// stats returns the current stats, named as envoy names them. Only the ones
// something reads are here: pilot-agent's readiness probe reads server.state,
// listener_manager.workers_started and the cds/lds update counters; its
// EXIT_ON_ZERO_ACTIVE_CONNECTIONS mode reads *.downstream_cx_active.
func (s *server) stats() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := func(v bool) uint64 {
		if v {
			return 1
		}
		return 0
	}
	state := uint64(statePreInitializing)
	if s.ready {
		state = stateLive
	}
	if s.healthFailed {
		state = stateDraining
	}
	m := map[string]uint64{
		"server.state":                                    state,
		"server.live":                                     b(s.ready && !s.healthFailed),
		"server.uptime":                                   uint64(time.Since(s.start).Seconds()),
		"server.concurrency":                              uint64(s.concurrency),
		"server.hot_restart_epoch":                        0,
		"listener_manager.workers_started":                b(s.ready),
		"listener_manager.lds.update_attempt":             b(s.ready),
		"listener_manager.lds.update_success":             b(s.ready),
		"listener_manager.lds.update_rejected":            0,
		"cluster_manager.cds.update_attempt":              b(s.ready),
		"cluster_manager.cds.update_success":              b(s.ready),
		"cluster_manager.cds.update_rejected":             0,
		"listener_manager.total_listeners_active":         uint64(len(s.listeners)),
		"listener_manager.total_listeners_draining":       0,
		"listener.admin.downstream_cx_active":             0,
		"listener.admin.main_thread.downstream_cx_active": 0,
	}
	if s.draining {
		// The bootstrap's listeners are not inbound ones, so an
		// inboundonly drain leaves them as they are; the counter still
		// shows that a drain is in progress for those who look.
		m["listener_manager.total_listeners_draining"] = uint64(len(s.listeners))
	}
	for _, l := range s.listeners {
		m["listener."+l+".downstream_cx_active"] = 0
	}
	return m
}

// statsText renders stats whose names match filter (a RE2 regex, as envoy's
// ?filter= is) in envoy's text format: "name: value", sorted by name.
func statsText(m map[string]uint64, filter string) (string, error) {
	var re *regexp.Regexp
	if filter != "" {
		var err error
		if re, err = regexp.Compile(filter); err != nil {
			return "", fmt.Errorf("invalid regex: %w", err)
		}
	}
	var sb strings.Builder
	for _, n := range slices.Sorted(maps.Keys(m)) {
		if re == nil || re.MatchString(n) {
			fmt.Fprintf(&sb, "%s: %d\n", n, m[n])
		}
	}
	return sb.String(), nil
}

// statsPrometheus renders all stats in Prometheus text format, named the way
// envoy does ("envoy_" + name with dots as underscores), all as gauges.
func statsPrometheus(m map[string]uint64) string {
	var sb strings.Builder
	for _, n := range slices.Sorted(maps.Keys(m)) {
		pn := "envoy_" + strings.NewReplacer(".", "_", "-", "_").Replace(n)
		fmt.Fprintf(&sb, "# TYPE %s gauge\n%s{} %d\n", pn, pn, m[n])
	}
	return sb.String()
}

func (s *server) stateName() string {
	switch s.stats()["server.state"] {
	case stateLive:
		return "LIVE"
	case stateDraining:
		return "DRAINING"
	default:
		return "PRE_INITIALIZING"
	}
}
