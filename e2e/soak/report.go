package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// report is the run's document.
type report struct {
	o        options
	results  []result
	restarts []restart
	started  time.Time
	took     time.Duration
	loads    [2]string
	images   [2]string
	out      string
}

// row is one line of the table: the Jobs a predicate selects.
type row struct {
	title string
	match func(r result) bool
}

func restartsIn(t timeline) int {
	n := 0
	for _, p := range t.want.pods {
		for _, k := range p.restarts {
			n += k
		}
	}
	return n
}

func quickRun(t timeline) bool {
	for _, a := range t.apps {
		for _, s := range a.steps {
			if s.d < time.Second {
				return true
			}
		}
	}
	return false
}

func rows() []row {
	never := func(r result) bool { return r.t.restart == corev1.RestartPolicyNever }
	// plain: under policy never (or not), neither deleted nor past its
	// deadline, it ends as drawn: completes, or fails for its backoffLimit.
	plain := func(nvr, complete bool, r result) bool {
		return never(r) == nvr && r.t.deletePod == 0 && !r.t.deadlineHit &&
			(r.t.want.cond == batchv1.JobComplete) == complete && (complete || r.t.want.reason == batchv1.JobReasonBackoffLimitExceeded)
	}
	return []row{
		{"Never, first pod succeeds", func(r result) bool { return plain(true, true, r) && len(r.t.want.pods) == 1 }},
		{"Never, failed pods then one succeeds", func(r result) bool { return plain(true, true, r) && len(r.t.want.pods) > 1 }},
		{"Never, every pod fails (backoffLimit)", func(r result) bool { return plain(true, false, r) }},
		{"OnFailure, succeeds first time", func(r result) bool { return plain(false, true, r) && restartsIn(r.t) == 0 }},
		{"OnFailure, restarted in place then succeeds", func(r result) bool { return plain(false, true, r) && restartsIn(r.t) > 0 }},
		{"OnFailure, fails until backoffLimit", func(r result) bool { return plain(false, false, r) }},
		{"pod deleted mid-run", func(r result) bool { return r.t.deletePod > 0 }},
		{"activeDeadlineSeconds passed mid-run", func(r result) bool { return r.t.deadlineHit }},
		{"activeDeadlineSeconds set, not reached", func(r result) bool { return r.t.deadline > 0 && !r.t.deadlineHit }},
		{"exit-status none (statuses unknown)", func(r result) bool { return r.t.none }},
		{"exit-status accounting (root, SYS_PACCT)", func(r result) bool { return r.t.accounting }},
		{"supervisor killed, exit-status accounting", func(r result) bool { return r.t.accounting && r.killed() }},
		{"supervisor killed, exit-status ptrace (root, SYS_PTRACE)", func(r result) bool { return r.t.ptrace && r.killed() }},
		{"2 or 3 apps", func(r result) bool { return len(r.t.apps) > 1 }},
		{"an app run under 1 s", func(r result) bool { return quickRun(r.t) }},
		{"running across the kubelet restart", func(r result) bool { return slices.Contains(r.across, "kubelet") }},
		{"running across the containerd restart", func(r result) bool { return slices.Contains(r.across, "containerd") }},
		{"supervisor killed (Never, native)", func(r result) bool { return never(r) && r.killed() }},
		{"supervisor killed (OnFailure, native)", func(r result) bool { return !never(r) && r.t.native && r.killed() }},
		{"supervisor killed (OnFailure, container)", func(r result) bool { return !never(r) && !r.t.native && r.killed() }},
		{"**all**", func(result) bool { return true }},
	}
}

// killed: the Job's supervisor was killed, and the kill counts.
func (r result) killed() bool { return r.v.kill != nil && r.v.kill.missed == "" }

func (r *report) ok() bool {
	for _, res := range r.results {
		if !res.v.ok() {
			return false
		}
	}
	for _, x := range r.restarts {
		if x.err != nil {
			return false
		}
	}
	return true
}

func (r *report) write(w io.Writer) error {
	var b strings.Builder
	kernel, _ := measure.Kernel()
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "## Soak: %d Jobs on the one-node cluster, seed %d\n\n", len(r.results), r.o.seed)
	standby := ""
	if r.o.standby {
		standby = " -standby"
	}
	fmt.Fprintf(&b, "`sudo e2e/soak.sh -seed %d -jobs %d -parallel %d%s` on %s: %d cores, kernel %s, %s, load %s before and %s after. ",
		r.o.seed, r.o.jobs, r.o.parallel, standby, host, runtime.NumCPU(), kernel,
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.loads[0], r.loads[1])
	fmt.Fprintf(&b, "Took %s, %d Jobs at a time. Images: supervisor %s, istio-proxy %s.\n\n",
		r.took.Round(time.Second), r.o.parallel, r.images[0], r.images[1])
	for _, x := range r.restarts {
		state := fmt.Sprintf("back in %s", x.took.Round(100*time.Millisecond))
		if x.err != nil {
			state = fmt.Sprintf("FAILED: %v", x.err)
		}
		fmt.Fprintf(&b, "- %s restarted at %s (%s) with %d Jobs running.\n", x.daemon, x.at.UTC().Format(time.TimeOnly), state, len(x.jobs))
	}
	pods, lat, outcomes, lags := 0, []time.Duration{}, map[string]int{}, map[string][]time.Duration{}
	late := map[string][]string{} // the Jobs whose stop came more than killBound late
	var failed, unchecked, anomalies []string
	for _, res := range r.results {
		pods += res.pods
		lat = append(lat, res.startLat...)
		for k, n := range res.v.outcomes {
			outcomes[k] += n
		}
		for k, l := range res.v.stopLags {
			lags[k] = append(lags[k], l...)
		}
		for k, l := range res.v.late() {
			for _, d := range l {
				late[k] = append(late[k], fmt.Sprintf("%s %s", res.t.name(), signed(d)))
			}
		}
		for _, u := range res.v.unchecked {
			unchecked = append(unchecked, fmt.Sprintf("%s: %s", res.t.name(), u))
		}
		for _, a := range res.v.anomalies {
			anomalies = append(anomalies, fmt.Sprintf("%s: %s", res.t.name(), a))
		}
		if res.v.ok() {
			continue
		}
		var probs []string
		for i, ps := range res.v.problems {
			for _, p := range ps {
				probs = append(probs, invariantNames[i]+": "+p)
			}
		}
		failed = append(failed, fmt.Sprintf("- **%s** (Job %d; %s): %s. Details: %s", res.t.name(), res.t.index, res.t,
			strings.Join(probs, "; "), res.detail))
	}
	var oc []string
	for _, k := range []string{"success", "failure", "unknown", "deleted"} {
		oc = append(oc, fmt.Sprintf("%s %d", k, outcomes[k]))
		delete(outcomes, k)
	}
	for k, n := range outcomes {
		oc = append(oc, fmt.Sprintf("%q %d", k, n))
	}
	fmt.Fprintf(&b, "- %d pods; the supervisor's summaries: %s (deleted: the pod was deleted while its apps ran).\n", pods, strings.Join(oc, ", "))
	if len(lat) > 0 {
		fmt.Fprintf(&b, "- A pod's first app started %s after the pod was created (median; 95th percentile %s, max %s): the node's load.\n",
			pct(lat, 50), pct(lat, 95), pct(lat, 100))
	}
	for _, k := range []string{lagRead, lagUnknownNever, lagUnknownOnFailure} {
		if l := lags[k]; len(l) > 0 {
			model := "the end of its last app"
			if k == lagUnknownOnFailure {
				model = "its last app's end plus the restart wait (back-off + 15 s margin)"
			}
			over := ""
			if len(late[k]) > 0 {
				over = fmt.Sprintf("; over %s in %s", killBound, strings.Join(late[k], ", "))
			}
			fmt.Fprintf(&b, "- Pods not killed that ran to their end, %s (%d): istio-proxy stopped %s after %s (median; 95th percentile %s, max %s%s).\n",
				k, len(l), pctSigned(l, 50), model, pctSigned(l, 95), pctSigned(l, 100), over)
		}
	}
	b.WriteString("\nEach cell: Jobs for which the invariant held / Jobs in the row. A Job is in every row that fits it.\n\n")
	head := append(append([]string{"Jobs", "n"}, invariantNames[:]...), "all held", "Job time, median", "max")
	var table [][]string
	for _, row := range rows() {
		var sel []result
		for _, res := range r.results {
			if row.match(res) {
				sel = append(sel, res)
			}
		}
		if len(sel) == 0 {
			continue
		}
		var held [nInvariants + 1]int // each invariant, then all
		var took []time.Duration
		for _, res := range sel {
			for i, p := range res.v.problems {
				if len(p) == 0 {
					held[i]++
				}
			}
			if res.v.ok() {
				held[nInvariants]++
			}
			took = append(took, res.took)
		}
		cells := []string{row.title, fmt.Sprint(len(sel))}
		for _, n := range held {
			cells = append(cells, mark(n, len(sel)))
		}
		table = append(table, append(cells, pct(took, 50), pct(took, 100)))
	}
	measure.Table(&b, "l"+strings.Repeat("r", len(head)-1), head, table...)
	b.WriteString(r.kills())
	if len(failed) == 0 {
		b.WriteString("\nEvery invariant held for every Job.\n")
	} else {
		fmt.Fprintf(&b, "\n%d Job(s) broke an invariant (replay one with `-seed %d -only INDEX`):\n\n%s\n", len(failed), r.o.seed, strings.Join(failed, "\n"))
	}
	if len(anomalies) > 0 {
		fmt.Fprintf(&b, "\nThe cluster's own oddities, which break no invariant (%d):\n\n- %s\n", len(anomalies), strings.Join(anomalies, "\n- "))
	}
	if len(unchecked) > 0 {
		fmt.Fprintf(&b, "\nNot checked (%d):\n\n- %s\n", len(unchecked), strings.Join(unchecked, "\n- "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *report) kills() string {
	var rows [][]string
	var missed []string
	for _, res := range r.results {
		k := res.v.kill
		if k == nil {
			continue
		}
		if k.missed != "" {
			missed = append(missed, fmt.Sprintf("%s (%s, %s; %s): %s", res.t.name(), res.t.restart, res.t.shape(), res.t.kill, k.missed))
			continue
		}
		resumed, lost := "–", "–"
		if k.resumed != nil {
			resumed = fmt.Sprintf("%s (%d unwatched)", fmtDur(k.resumed.At.Sub(k.at)), k.resumed.counts.EndedUnwatched)
		}
		if len(k.lost) > 0 {
			lost = strings.Join(k.lost, ", ")
		}
		delay, bound := "–", "–"
		if !k.stop.IsZero() {
			delay, bound = signed(k.delay), k.bound.Round(time.Millisecond).String()
		}
		held := "yes"
		if len(res.v.problems[invRestart]) > 0 {
			held = "**no**"
		}
		rows = append(rows, []string{res.t.name(), string(res.t.restart), res.t.shape(), res.t.kill.String(), k.when, resumed, lost, delay, bound, held})
	}
	if len(rows)+len(missed) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nThe supervisor SIGKILLed in %d Job(s) (and %d kill(s) that did not count, below). Drawn: the moment; killed: where the kill came, from the stamps and the killed supervisor's log; "+
		"carried on: from the kill to the restarted supervisor's line saying it carries on from the journal (and the app instances it found ended unwatched); "+
		"lost: app instances that ended while no supervisor ran; delay: istio-proxy's stop against when it would have been without the kill "+
		"(the pod's last app end; with statuses unknown under OnFailure, plus the restart wait); bound: %s, plus the restart wait where a status was lost under OnFailure, or the look (SUPERVISOR_APP_START_TIMEOUT, from the restarted supervisor's start) where an app ran wholly unseen.\n\n",
		len(rows), len(missed), killBound)
	measure.Table(&b, "lllllrlrr", []string{"Job", "policy", "shape", "drawn", "killed", "carried on", "lost", "delay", "bound", "held"}, rows...)
	if len(missed) > 0 {
		fmt.Fprintf(&b, "\nKills that did not count:\n\n- %s\n", strings.Join(missed, "\n- "))
	}
	return b.String()
}

func signed(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

// pctSigned is pct for durations that may be negative.
func pctSigned(d []time.Duration, p int) string { return signed(measure.Rank(d, p)) }

func mark(n, of int) string {
	if n == of {
		return fmt.Sprintf("%d", n)
	}
	return fmt.Sprintf("**%d**", n)
}

// pct is the p-th percentile (nearest rank), rounded for the table.
func pct(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "–"
	}
	v := measure.Rank(d, p)
	if v < 10*time.Second {
		return v.Round(10 * time.Millisecond).String()
	}
	return v.Round(time.Second).String()
}
