package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// The table's first six rows split the Jobs that end as drawn (neither
// deleted nor past a deadline) by policy and end, each in one row.
func TestRows(t *testing.T) {
	want := func(tl timeline) int {
		restarts := restartsIn(tl)
		switch never, complete := tl.restart == corev1.RestartPolicyNever, tl.want.reason == ""; {
		case tl.deletePod > 0 || tl.deadlineHit:
			return -1
		case never && complete && len(tl.want.pods) == 1:
			return 0
		case never && complete:
			return 1
		case never:
			return 2
		case complete && restarts == 0:
			return 3
		case complete:
			return 4
		}
		return 5
	}
	for i := 0; i < 1000; i++ {
		r := result{t: generate(7, i)}
		got := -1
		for k, row := range rows()[:6] {
			if row.match(r) {
				if got >= 0 {
					t.Fatalf("%s: in rows %d and %d", r.t, got, k)
				}
				got = k
			}
		}
		if got != want(r.t) {
			t.Errorf("%s: in row %d, want %d", r.t, got, want(r.t))
		}
	}
}

// The report of thirty Jobs of seed 123 with made-up verdicts is
// testdata/report.md, but for the machine's own figures.
func TestReport(t *testing.T) {
	var results []result
	for i := 0; i < 30; i++ {
		tl := generate(123, i)
		v := verdict{outcomes: map[string]int{"success": i % 3, "failure": i % 2, "odd": i / 29},
			stopLags: map[string][]time.Duration{lagRead: {time.Duration(i) * 37 * time.Millisecond}}}
		if tl.none {
			v.stopLags[lagUnknownNever] = []time.Duration{-time.Duration(i) * time.Millisecond}
			v.stopLags[lagUnknownOnFailure] = []time.Duration{time.Duration(i) * time.Second}
		}
		if i%7 == 3 {
			v.problems[i%int(nInvariants)] = []string{fmt.Sprintf("problem %d", i)}
		}
		if i%5 == 1 {
			v.unchecked = []string{fmt.Sprintf("unchecked %d", i)}
			v.anomalies = []string{fmt.Sprintf("anomaly %d", i)}
		}
		if tl.kill != nil {
			v.kill = &killOutcome{pod: "p", at: t0, when: "while app1 #1 ran", lost: []string{"app1 #1"},
				wouldStop: t0.Add(time.Second), stop: t0.Add(2500 * time.Millisecond), delay: 1500 * time.Millisecond, bound: killBound}
			v.kill.resumed = &logLine{LogLine: measure.LogLine{At: t0.Add(900 * time.Millisecond)}, counts: resumeCounts{EndedUnwatched: 1}}
			if i%2 == 0 {
				v.kill = &killOutcome{missed: "not sent: too late"}
			}
		}
		across := [][]string{{"kubelet"}, {"containerd"}, nil}[i%3]
		results = append(results, result{t: tl, v: v, took: time.Duration(i) * 1100 * time.Millisecond, across: across,
			startLat: []time.Duration{time.Duration(i) * 70 * time.Millisecond}, pods: len(tl.want.pods), detail: fmt.Sprintf("/tmp/d/%d.txt", i)})
	}
	r := report{o: options{seed: 123, jobs: 30, parallel: 12, standby: true}, results: results,
		restarts: []restart{{daemon: "kubelet", at: t0, took: 1200 * time.Millisecond, jobs: []int{0, 4}},
			{daemon: "containerd", at: t0.Add(time.Minute), err: errors.New("timed out"), jobs: []int{8}}},
		started: t0, took: 3 * time.Minute, loads: [2]string{"0.1 0.2 0.3", "1 2 3"}, images: [2]string{"sup:1", "proxy:2"}}
	var b strings.Builder
	if err := r.write(&b); err != nil {
		t.Fatal(err)
	}
	kernel, _ := measure.Kernel()
	host, _ := os.Hostname()
	got := strings.Replace(b.String(), fmt.Sprintf("on %s: %d cores, kernel %s,", host, runtime.NumCPU(), kernel), "on HOST: N cores, kernel K,", 1)
	want, err := os.ReadFile(filepath.Join("testdata", "report.md"))
	if err != nil || got != string(want) {
		if os.Getenv("SOAK_WRITE_GOLDEN") != "" {
			os.WriteFile(filepath.Join("testdata", "report.md"), []byte(got), 0o644)
		}
		t.Errorf("the report (%v):\n%s", err, cmp.Diff(string(want), got))
	}
	if r.ok() {
		t.Error("a report with problems and a failed restart is ok")
	}
}
