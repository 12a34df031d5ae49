package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// options is the part of envoy's command line that the stand-in acts on. The
// rest is accepted (so pilot-agent's real command line works) and recorded.
type options struct {
	configPath  string
	drainTime   time.Duration
	concurrency int
	version     bool
}

// Envoy's flags (see `envoy --help`) that take a value. Keeping an explicit
// list, rather than accepting anything, makes a change in the command line
// that pilot-agent builds fail loudly in the tests instead of being ignored.
var valueFlags = map[string]bool{
	"c": true, "config-path": true, "config-yaml": true,
	"drain-time-s": true, "parent-shutdown-time-s": true, "drain-strategy": true,
	"local-address-ip-version": true,
	"file-flush-interval-msec": true, "file-flush-min-size-kb": true,
	"l": true, "log-level": true, "component-log-level": true, "log-path": true, "log-format": true,
	"concurrency": true, "base-id": true, "base-id-path": true, "restart-epoch": true, "mode": true,
	"service-cluster": true, "service-node": true, "service-zone": true,
	"admin-address-path": true, "socket-path": true, "socket-mode": true,
	"disable-extensions": true, "stats-tag": true, "max-obj-name-len": true,
}

// Envoy's boolean flags.
var boolFlags = map[string]bool{
	"disable-hot-restart": true, "allow-unknown-static-fields": true,
	"reject-unknown-dynamic-fields": true, "ignore-unknown-dynamic-fields": true,
	"skip-deprecated-logs": true, "enable-core-dump": true, "log-format-escaped": true,
	"use-dynamic-base-id": true, "cpuset-threads": true, "enable-fine-grain-logging": true,
	"skip-hot-restart-on-no-parent": true, "skip-hot-restart-parent-stats": true,
	"version": true,
}

// parseArgs reads envoy's command line: "-c FILE", "--flag VALUE",
// "--flag=VALUE" and boolean "--flag". Envoy (TCLAP) takes single-letter
// flags with one dash and long ones with two; both spellings are accepted.
func parseArgs(args []string) (options, error) {
	o := options{drainTime: 600 * time.Second} // envoy's default --drain-time-s
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return o, fmt.Errorf("unexpected argument %q", a)
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case boolFlags[name]:
			if hasVal {
				return o, fmt.Errorf("flag --%s takes no value", name)
			}
			if name == "version" {
				o.version = true
			}
			continue
		case valueFlags[name]:
			if !hasVal {
				if i+1 >= len(args) {
					return o, fmt.Errorf("flag %s needs a value", a)
				}
				i++
				val = args[i]
			}
		default:
			// Real envoy refuses flags it does not know, and so do we.
			return o, fmt.Errorf("unknown flag %q (the stand-in knows envoy's flags; add new ones to args.go)", a)
		}
		switch name {
		case "c", "config-path":
			o.configPath = val
		case "drain-time-s":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return o, fmt.Errorf("--drain-time-s: not a number of seconds: %q", val)
			}
			o.drainTime = time.Duration(n) * time.Second
		case "concurrency":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return o, fmt.Errorf("--concurrency: not a count: %q", val)
			}
			o.concurrency = n
		}
	}
	if o.configPath == "" && !o.version {
		return o, fmt.Errorf("--config-path is required: the stand-in reads a JSON bootstrap (not --config-yaml alone)")
	}
	return o, nil
}
