package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// step is one run of an app container: it works for d, then exits code.
type step struct {
	d    time.Duration
	code int
}

func (s step) String() string {
	return fmt.Sprintf("%s→%d", fmtDur(s.d), s.code)
}

// appPlan is one app container and its runs, one per instance: the n-th
// instance of the container (counted across the Job's pods and the
// kubelet's restarts) runs steps[n-1], the last step once they are used up.
type appPlan struct {
	name  string
	steps []step
}

// at is the step the n-th instance (from 1) runs.
func (a appPlan) at(n int) step {
	return a.steps[min(n, len(a.steps))-1]
}

// timeline is one Job of the soak, drawn from the seed: its pods' apps and
// what happens to them, and what must come of it.
type timeline struct {
	index   int
	restart corev1.RestartPolicy
	// none forces the supervisor's exit-status method to none (the pod
	// annotation): every app status is unknown. accounting forces it to
	// accounting (root with SYS_PACCT): statuses from the kernel's
	// process accounting records, where exit 0 reads unknown
	// (unknownEnd). ptrace forces ptrace (root with
	// SYS_PTRACE), whose accounting outlives the supervisor's container
	// (the ends in its dead time are recorded; check.go's deadTime).
	none         bool
	accounting   bool
	ptrace       bool
	apps         []appPlan
	backoffLimit int32
	// deadline is activeDeadlineSeconds (0: unset); deadlineHit says the
	// apps outlast it.
	deadline    int64
	deadlineHit bool
	// deletePod is the Job's pod (1 for the first) deleted deleteAfter
	// after all its apps have started; 0 for none.
	deletePod   int
	deleteAfter time.Duration
	// kill SIGKILLs the supervisor of one of the Job's pods once (kill.go);
	// nil for none. native puts the supervisor in the native shape (the
	// pod annotation), the only one the kubelet restarts under Never.
	kill   *killPlan
	native bool
	want   outcome
}

// killPlan says when the soak SIGKILLs the supervisor of the Job's pod
// pod (its index in want.pods), as an OOM kill or a node's kill would:
// relative to instance n of app, or to the pod's last app end.
type killPlan struct {
	pod    int
	app    string
	n      int
	moment killMoment
	// frac: killRun, the part of the instance's run gone by. off:
	// killExit, from its planned end (negative: before); killStop, after
	// the pod's last app end.
	frac float64
	off  time.Duration
}

type killMoment int

const (
	killRun  killMoment = iota // while the instance runs
	killExit                   // around its end
	killStop                   // during the stop: just after the pod's last app end
)

func (k killPlan) String() string {
	switch k.moment {
	case killRun:
		return fmt.Sprintf("while %s #%d runs (%.0f%% in)", k.app, k.n, 100*k.frac)
	case killExit:
		return fmt.Sprintf("%s %s #%d's end", fmtOff(k.off), k.app, k.n)
	}
	return fmt.Sprintf("%s after pod %d's last app end (the stop)", fmtDur(k.off), k.pod+1)
}

// fmtOff renders an offset from an event: "120ms before", "3ms after".
func fmtOff(d time.Duration) string {
	if d < 0 {
		return fmtDur(-d) + " before"
	}
	return fmtDur(d) + " after"
}

// outcome is what the timeline must come to.
type outcome struct {
	cond   batchv1.JobConditionType
	reason string // of a Failed condition
	pods   []podWant
}

// podWant is what one of the Job's pods must come to.
type podWant struct {
	// deleted: deleted while its apps ran, by the soak or by the Job
	// controller (deadline, backoffLimit under OnFailure).
	deleted bool
	// first is, per app, the instance number its first run in this pod
	// has; last the instance whose status decides (the pod's only one
	// under Never, the successful one under OnFailure); zero when deleted.
	first, last map[string]int
	// restarts is, per app, how often the kubelet restarts it in this pod
	// (OnFailure).
	restarts map[string]int
}

func (t timeline) name() string { return fmt.Sprintf("soak-%03d", t.index) }

// shape is the supervisor's shape, as the annotation says it.
func (t timeline) shape() string {
	if t.native {
		return "native"
	}
	return "container"
}

// Durations of a run, drawn by bucket: a quarter gone in milliseconds
// (before the supervisor has looked, often), a quarter under a second,
// most in seconds, some in tens of seconds.
func drawDuration(r *rand.Rand) time.Duration {
	switch b := r.IntN(100); {
	case b < 20:
		return time.Duration(r.IntN(50)) * time.Millisecond
	case b < 45:
		return time.Duration(50+r.IntN(950)) * time.Millisecond
	case b < 85:
		return time.Duration(1000+r.IntN(9000)) * time.Millisecond
	default:
		return time.Duration(10000+r.IntN(20000)) * time.Millisecond
	}
}

// failCodes are the non-zero exit codes the apps fail with; 143 is what a
// shell reports for a child killed by SIGTERM, which the supervisor first
// takes for a possible pod deletion.
var failCodes = []int{1, 2, 3, 42, 127, 143, 255}

func drawFailure(r *rand.Rand) step {
	return step{drawDuration(r), failCodes[r.IntN(len(failCodes))]}
}

func drawSuccess(r *rand.Rand) step { return step{drawDuration(r), 0} }

// longStep outlasts what is done to the pod meanwhile (a deletion, the
// deadline).
func longStep(r *rand.Rand, atLeast time.Duration) step {
	return step{atLeast + time.Duration(60+r.IntN(60))*time.Second, 0}
}

// generate draws timeline i of the soak with this seed. Each timeline has
// a generator of its own, seeded with (seed, i): one Job is reproduced by
// its seed and index alone.
func generate(seed uint64, i int) timeline {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	t := timeline{index: i, restart: corev1.RestartPolicyNever}
	if r.IntN(2) == 1 {
		t.restart = corev1.RestartPolicyOnFailure
	}
	t.none = r.IntN(5) == 0
	n := 1
	switch x := r.IntN(10); {
	case x >= 8:
		n = 3
	case x >= 5:
		n = 2
	}
	for k := 0; k < n; k++ {
		t.apps = append(t.apps, appPlan{name: fmt.Sprintf("app%d", k+1)})
	}
	special := r.IntN(100)
	if t.restart == corev1.RestartPolicyNever {
		drawNever(r, &t)
	} else {
		drawOnFailure(r, &t)
	}
	switch {
	case special < 10:
		// Deleted while every app of its first pod runs; the steps after
		// are the ones drawn above.
		t.deletePod = 1
		t.deleteAfter = time.Duration(1000+r.IntN(7000)) * time.Millisecond
		for k := range t.apps {
			t.apps[k].steps = append([]step{longStep(r, t.deleteAfter)}, t.apps[k].steps...)
		}
		t.backoffLimit++
	case special < 20:
		// The deadline passes while every app of its first pod runs.
		t.deadline = int64(10 + r.IntN(16))
		t.deadlineHit = true
		for k := range t.apps {
			t.apps[k].steps = append([]step{longStep(r, time.Duration(t.deadline)*time.Second)}, t.apps[k].steps...)
		}
	case special < 25:
		// A deadline far beyond the Job's end: no effect.
		t.deadline = int64(600 + r.IntN(300))
	}
	t.want = t.oracle()
	if drawKill(r, &t) {
		t.want = t.oracle()
	}
	// Drawn last too: statuses from process accounting, for a third of
	// the Jobs whose supervisor is killed (an end the killed one had not
	// read is in the records; one after the kill is not: accounting ends
	// with the supervisor's container) and one in six of the others; from
	// ptrace, for another third of the killed (its records of the ends
	// after the kill too).
	if !t.none {
		if t.kill != nil {
			x := r.IntN(3)
			t.accounting, t.ptrace = x == 0, x == 1
		} else {
			t.accounting = r.IntN(6) == 0
		}
	}
	return t
}

// drawKill draws, for about one Job in ten, a SIGKILL of one of its pods'
// supervisors (drawn last: the rest of the timeline is what the seed drew
// before kills were drawn). Not in Jobs whose pod is deleted (by the soak,
// a deadline, or a backoffLimit reached under OnFailure): the kill is
// checked against a pod that runs to its end. Under Never the supervisor
// is then native, the only shape the kubelet restarts there (a container
// that dies under Never stays dead, and the Job hangs); under OnFailure
// either shape, drawn. Under OnFailure the supervisor's restart counts
// against the Job's backoffLimit (the Job controller sums the restarts of
// every container of the pod, init containers included), so the Job gets
// one more.
func drawKill(r *rand.Rand, t *timeline) bool {
	onFailure := t.restart == corev1.RestartPolicyOnFailure
	if t.deletePod > 0 || t.deadlineHit || (onFailure && t.want.cond != batchv1.JobComplete) {
		return false
	}
	// About 7 Jobs in 10 are eligible: one in 7 of them is one in 10.
	if r.IntN(7) != 0 {
		return false
	}
	k := killPlan{pod: r.IntN(len(t.want.pods))}
	w := t.want.pods[k.pod]
	a := t.apps[r.IntN(len(t.apps))]
	k.app = a.name
	k.n = w.first[a.name] + r.IntN(w.last[a.name]-w.first[a.name]+1)
	k.moment = killMoment(r.IntN(3))
	switch k.moment {
	case killRun:
		k.frac = 0.1 + 0.8*r.Float64()
	case killExit:
		k.off = time.Duration(r.IntN(601)-300) * time.Millisecond
	case killStop:
		k.off = time.Duration(r.IntN(30)) * time.Millisecond
	}
	t.kill = &k
	t.native = !onFailure || r.IntN(2) == 0
	if onFailure {
		t.backoffLimit++
	}
	return true
}

// drawNever draws the Job's pods under restartPolicy Never: the first pod
// succeeds, or some fail before one does, or all fail.
func drawNever(r *rand.Rand, t *timeline) {
	pods, succeed := 1, true
	switch r.IntN(3) {
	case 1:
		pods = 2 + r.IntN(2)
	case 2:
		pods, succeed = 1+r.IntN(3), false
	}
	// backoffLimit: room for the failures when the Job must succeed,
	// exactly the pods drawn when it must fail.
	t.backoffLimit = int32(pods - 1)
	if succeed {
		t.backoffLimit += int32(r.IntN(2))
	}
	for p := 1; p <= pods; p++ {
		fail := !succeed || p < pods
		// In a failing pod, at least one app fails; the others may too.
		culprit := r.IntN(len(t.apps))
		for k := range t.apps {
			s := drawSuccess(r)
			if fail && (k == culprit || r.IntN(3) == 0) {
				s = drawFailure(r)
			}
			t.apps[k].steps = append(t.apps[k].steps, s)
		}
	}
}

// drawOnFailure draws the runs of each app under restartPolicy OnFailure:
// up to 3 failures (restarted in place by the kubelet after its back-off)
// before a success, or, for one app of some Jobs, failures until the Job's
// backoffLimit is reached.
func drawOnFailure(r *rand.Rand, t *timeline) {
	forever := -1
	if r.IntN(4) == 0 {
		forever = r.IntN(len(t.apps))
	}
	restarts := 0
	for k := range t.apps {
		if k == forever {
			t.apps[k].steps = []step{drawFailure(r)}
			continue
		}
		fails := 0
		if r.IntN(2) == 1 {
			fails = 1 + r.IntN(3)
		}
		if restarts+fails > 4 {
			fails = 0
		}
		restarts += fails
		for f := 0; f < fails; f++ {
			t.apps[k].steps = append(t.apps[k].steps, drawFailure(r))
		}
		t.apps[k].steps = append(t.apps[k].steps, drawSuccess(r))
	}
	if forever >= 0 {
		// The Job fails once the pod's restarts reach backoffLimit.
		t.backoffLimit = int32(1 + r.IntN(2))
		return
	}
	// Restarts must stay under backoffLimit (the Job controller fails the
	// Job when they reach it).
	t.backoffLimit = int32(restarts + 1 + r.IntN(2))
}

// oracle says what the timeline must come to: the Job's condition, and
// each pod's fate.
func (t timeline) oracle() outcome {
	next := map[string]int{} // the next instance number of each app
	for _, a := range t.apps {
		next[a.name] = 1
	}
	deleted := func() podWant {
		p := podWant{deleted: true, first: map[string]int{}}
		for _, a := range t.apps {
			p.first[a.name] = next[a.name]
			next[a.name]++
		}
		return p
	}
	var o outcome
	failed := int32(0)
	for k := 1; k <= 10; k++ {
		p := podWant{first: map[string]int{}, last: map[string]int{}, restarts: map[string]int{}}
		switch {
		case t.deadlineHit:
			o.pods = append(o.pods, deleted())
			o.cond, o.reason = batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded
			return o
		case k == t.deletePod:
			o.pods = append(o.pods, deleted())
		case t.restart == corev1.RestartPolicyNever:
			ok := true
			for _, a := range t.apps {
				n := next[a.name]
				p.first[a.name], p.last[a.name] = n, n
				next[a.name]++
				ok = ok && a.at(n).code == 0
			}
			o.pods = append(o.pods, p)
			if ok {
				o.cond = batchv1.JobComplete
				return o
			}
		default:
			// OnFailure: every app is restarted in place until it succeeds.
			forever := false
			for _, a := range t.apps {
				n := next[a.name]
				p.first[a.name] = n
				for ; a.at(n).code != 0; n++ {
					if n >= len(a.steps) {
						forever = true
						break
					}
					p.restarts[a.name]++
				}
				p.last[a.name] = n
			}
			o.cond = batchv1.JobComplete
			if forever {
				// The Job controller deletes the pod when its restarts
				// reach backoffLimit.
				p = podWant{deleted: true, first: p.first}
				o.cond, o.reason = batchv1.JobFailed, batchv1.JobReasonBackoffLimitExceeded
			}
			o.pods = append(o.pods, p)
			return o
		}
		// The pod failed.
		if failed++; failed > t.backoffLimit {
			o.cond, o.reason = batchv1.JobFailed, batchv1.JobReasonBackoffLimitExceeded
			return o
		}
	}
	panic(fmt.Sprintf("timeline %d: more than 10 pods", t.index))
}

// exitStatus is the exit-status method the pod's annotation forces (none,
// accounting, ptrace: one at most), "" for the template's own.
func (t timeline) exitStatus() string {
	switch {
	case t.none:
		return "none"
	case t.accounting:
		return "accounting"
	case t.ptrace:
		return "ptrace"
	}
	return ""
}

// String renders the timeline on one line, for the report.
func (t timeline) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, backoffLimit %d", t.restart, t.backoffLimit)
	if m := t.exitStatus(); m != "" {
		b.WriteString(", exit-status " + m)
	}
	if t.deadline > 0 {
		fmt.Fprintf(&b, ", activeDeadlineSeconds %d", t.deadline)
	}
	if t.deletePod > 0 {
		fmt.Fprintf(&b, ", pod %d deleted %s after its apps start", t.deletePod, fmtDur(t.deleteAfter))
	}
	if t.kill != nil {
		fmt.Fprintf(&b, ", supervisor (%s) of pod %d killed %s", t.shape(), t.kill.pod+1, t.kill)
	}
	for _, a := range t.apps {
		var s []string
		for _, st := range a.steps {
			s = append(s, st.String())
		}
		fmt.Fprintf(&b, "; %s: %s", a.name, strings.Join(s, " "))
	}
	fmt.Fprintf(&b, " ⇒ %s", t.want.cond)
	if t.want.reason != "" {
		fmt.Fprintf(&b, " (%s)", t.want.reason)
	}
	fmt.Fprintf(&b, ", %d pod(s)", len(t.want.pods))
	return b.String()
}

// fmtDur renders a run's length: milliseconds below a second, else
// seconds with up to three decimals.
func fmtDur(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", d.Seconds()), "0"), ".") + "s"
}

// unknownEnd says whether the supervisor reads an app's end with code as
// unknown, wherever it sees it: every status under exit-status none; exit
// 0 under accounting, whose record of 0 says only that the app ended
// (supervisor/exitwatch/acct_linux.go).
func (t timeline) unknownEnd(code int) bool { return t.none || (t.accounting && code == 0) }
