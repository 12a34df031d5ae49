package main

import (
	"strings"
	"testing"
	"time"
)

// adjtimex output as Debian's busybox prints it, with STA_NANO set (status
// 0x2040: NANO and UNSYNC), and as it would with microseconds.
const (
	nanoLog = `working
    mode:         0
-o  offset:       0 us
    status:       8256 (UNSYNC)
    time.tv_sec:  1796297563
    time.tv_usec: 984469057
    return value: 5 (clock not synchronized)
`
	microLog = `    status:       64 (UNSYNC)
    time.tv_sec:  1796297563
    time.tv_usec: 984469
`
)

func TestParseStamp(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      time.Time
		bad       bool
	}{
		{name: "nanoseconds", log: nanoLog, want: time.Unix(1796297563, 984469057)},
		{name: "microseconds", log: microLog, want: time.Unix(1796297563, 984469000)},
		{name: "no stamp", log: "working\n", bad: true},
		{name: "fraction out of range", log: "status: 64\ntime.tv_sec: 1\ntime.tv_usec: 1000000\n", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStamp(tc.log)
			if tc.bad {
				if err == nil {
					t.Fatalf("parseStamp = %v, want an error", got)
				}
				return
			}
			if err != nil || !got.Equal(tc.want) {
				t.Fatalf("parseStamp = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestApproachesAreDistinct checks that each row's Job differs only where
// the approach does: the same app work everywhere, unique names.
func TestApproachesAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range approaches(3) {
		if seen[a.key] {
			t.Errorf("approach key %q twice", a.key)
		}
		seen[a.key] = true
		j := a.job(a.key+"-0", "istio-proxy-image")
		c := j.Spec.Template.Spec.Containers
		if a.istio != "" && len(c) == 2 && c[1].Name == proxyName && c[1].Image == "istio-proxy-image" {
			c = c[:1]
		}
		if len(c) != 1 || c[0].Name != appName {
			t.Errorf("%s: containers %v, want the app alone (the injector adds the rest)", a.key, c)
			continue
		}
		cmd := c[0].Command
		if a.argv == nil && (len(cmd) != 3 || cmd[0] != "sh") {
			t.Errorf("%s: command %q, want sh -c SCRIPT", a.key, cmd)
		}
		if a.argv == nil && !strings.Contains(cmd[len(cmd)-1], "sleep 3; "+stamp) {
			t.Errorf("%s: script %q lacks the common app", a.key, cmd[len(cmd)-1])
		}
		if got := j.Spec.Template.Labels["sidecar.istio.io/inject"]; got != "true" {
			t.Errorf("%s: label sidecar.istio.io/inject = %q", a.key, got)
		}
	}
}
