package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/cluster"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// instance is one run of an app container, as the app stamped it.
type instance struct {
	app   string
	n     int
	pod   string
	start time.Time
	end   time.Time // zero: no end stamp (killed)
	code  int
}

func (i instance) String() string {
	s := fmt.Sprintf("%s #%d in %s, started %s", i.app, i.n, i.pod, clock(i.start))
	if i.end.IsZero() {
		return s + ", no end (killed)"
	}
	return s + fmt.Sprintf(", ended %s exit %d", clock(i.end), i.code)
}

// clock renders a time of day with milliseconds.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// stampRE reads one stamp line: "start N POD <adjtimex>" or "end N POD
// CODE <adjtimex>".
var stampRE = regexp.MustCompile(`^(start|end) (\d+) (\S+)(?: (-?\d+))? (.*)$`)

func parseStamps(app, text string) ([]instance, error) {
	byN := map[int]*instance{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if line == "" {
			continue
		}
		m := stampRE.FindStringSubmatch(line)
		var at time.Time
		err := errors.New("no stamp")
		if m != nil {
			at, err = measure.ParseAdjtimex(m[5])
		}
		if err != nil {
			return nil, fmt.Errorf("%s: unreadable stamp %q: %v", app, line, err)
		}
		n, _ := strconv.Atoi(m[2])
		in := byN[n]
		if in == nil {
			in = &instance{app: app, n: n, pod: m[3]}
			byN[n] = in
		}
		switch {
		case m[1] == "start" && !in.start.IsZero(), m[1] == "end" && !in.end.IsZero():
			return nil, fmt.Errorf("%s: instance %d stamped its %s twice", app, n, m[1])
		case m[1] == "start":
			in.start = at
		default:
			in.end = at
			in.code, _ = strconv.Atoi(m[4])
		}
		if in.pod != m[3] {
			return nil, fmt.Errorf("%s: instance %d stamped in pods %s and %s", app, n, in.pod, m[3])
		}
	}
	var out []instance
	for _, in := range byN {
		if in.start.IsZero() {
			return nil, fmt.Errorf("%s: instance %d has an end but no start", app, in.n)
		}
		out = append(out, *in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n < out[j].n })
	return out, nil
}

// supervisorLog is what the soak reads in the log of one instance of the
// supervisor.
type supervisorLog struct {
	// start is its first line's time, last its last line's.
	start, last time.Time
	// first is when its first scan ended: its first "app found" or
	// "sidecar found" line, else its first line. Under load the start
	// (the exit-status probe, reading names) can take seconds, and an app
	// that ended meanwhile was never there to see.
	first time.Time
	// stops are the lines saying the sidecar was sent its action.
	stops []logLine
	// gone is its first "sidecar already gone": the sidecar had exited
	// before the action.
	gone time.Time
	// resumed is its line saying it carries on from the journal of the
	// instance before (a restarted supervisor), nil for none.
	resumed *logLine
	// journal lists its warnings that the journal was ignored or off.
	journal []string
	// done is its "done" line: its summary is written.
	done time.Time
	// decided is its "decision" line: its action begins.
	decided time.Time
	// missing lists the apps it said it never saw within the look
	// (msgMissing), the first such line's.
	missing []string
	// initWait is the longest wait it logged for the new start of an app
	// that ended as its runtime's init (msgInitEnds): a start that failed,
	// or a run too brief to see its exec (supervisor/startfailed.go).
	initWait time.Duration
	// anchored is its line saying accounting goes through istio-proxy's
	// mount (msgAnchored): it records the ends after this supervisor's
	// death.
	anchored time.Time
}

type logLine struct {
	measure.LogLine
	counts resumeCounts // of msgResumed only
}

// resumeCounts are the fields of msgResumed: the app instances the
// journal had, those that ended while no supervisor watched them, those
// watched again. They are read from that message alone: other messages
// use the same keys for other things ("apps" is a list of names in the
// supervisor's first lines).
type resumeCounts struct {
	Apps           int `json:"apps"`
	Ended          int `json:"ended"`
	EndedUnwatched int `json:"ended_unwatched"`
	Watched        int `json:"watched"`
}

// The supervisor's messages for a sidecar sent its action
// (supervisor/act.go), for none to stop, for a run that carries on from the journal
// (resume.go), and for a journal it cannot use (resume.go, journal.go).
const (
	msgSignalled = "sidecar signalled"
	msgAsked     = "sidecar asked to stop"
	msgGone      = "sidecar already gone"
	msgDone      = "done"
	msgDecision  = "decision"
	msgResumed   = "carrying on from the journal of the supervisor before"
	msgMissing   = "app containers missing: they finished before the supervisor started, or never started"
	msgNoSidecar = "no sidecar appeared: nothing to stop"
	msgAnchored  = "accounting goes through the sidecar's mount of the state directory: it records the apps' ends even while no supervisor runs"
)

var msgInitEnds = []string{
	"app killed before its program ran: its start failed, and the kubelet starts it again whatever the restart policy; the sidecar stays up",
	"app ended before its program was seen running, its status unknown: its start may have failed, and the kubelet would start it again whatever the restart policy; the sidecar stays up until then",
}

var msgJournal = []string{
	"the journal of an earlier supervisor is ignored: starting over",
	"cannot keep a journal: a restarted supervisor would start over",
	"the journal is off: a restarted supervisor would start over",
}

func parseSupervisorLog(text string) (supervisorLog, error) {
	var s supervisorLog
	foundSeen := false
	lines, err := measure.ParseLog(text)
	if err != nil {
		return s, err
	}
	for _, ml := range lines {
		l, at := logLine{LogLine: ml}, ml.At
		if l.Message == msgResumed {
			if err := json.Unmarshal([]byte(l.Raw), &l.counts); err != nil {
				return s, fmt.Errorf("supervisor log line %q: %w", l.Raw, err)
			}
		}
		if s.first.IsZero() {
			s.start, s.first = at, at
		}
		s.last = at
		if !foundSeen && (l.Message == "app found" || l.Message == "sidecar found") {
			s.first, foundSeen = at, true
		}
		switch {
		case l.Message == msgSignalled, l.Message == msgAsked:
			s.stops = append(s.stops, l)
		case l.Message == msgGone && s.gone.IsZero():
			s.gone = at
		case l.Message == msgResumed && s.resumed == nil:
			s.resumed = &l
		case l.Message == msgDone:
			s.done = at
		case l.Message == msgAnchored && s.anchored.IsZero():
			s.anchored = at
		case l.Message == msgDecision && s.decided.IsZero():
			s.decided = at
		case l.Message == msgMissing && s.missing == nil:
			s.missing = l.Missing
		case slices.Contains(msgInitEnds, l.Message):
			s.initWait = max(s.initWait, l.Waited())
		case slices.Contains(msgJournal, l.Message):
			s.journal = append(s.journal, strings.TrimSpace(l.Message+" "+l.Reason+" "+l.Error))
		}
	}
	if s.first.IsZero() {
		return s, fmt.Errorf("no JSON line in the supervisor's log")
	}
	return s, nil
}

// The invariants, the table's columns.
type invariant int

const (
	// invCondition: the Job's condition, its pods and their apps as the
	// timeline says.
	invCondition invariant = iota
	// invOrder: istio-proxy stopped only once no app of the pod runs or
	// will run again.
	invOrder
	// invLeft: no container left running.
	invLeft
	// invMessage: the supervisor's termination message (and the action
	// it took) as the apps' statuses say.
	invMessage
	// invRestart: the supervisor restarted only where the soak killed it,
	// once; the instance after carried on from the journal of the one
	// before, and stopped istio-proxy in time (killBound).
	invRestart
	nInvariants
)

var invariantNames = [nInvariants]string{"condition", "proxy after apps", "none left running", "termination message", "supervisor restart"}

// verdict is the checks' result for one Job.
type verdict struct {
	problems [nInvariants][]string
	// outcomes counts the pods by the supervisor's summary: success,
	// failure, unknown, deleted.
	outcomes map[string]int
	// unchecked lists checks that could not be made (a log the kubelet
	// had removed, ...).
	unchecked []string
	// anomalies are the cluster's own oddities seen on the way, which no
	// invariant is about (a restart the kubelet counts for a container it
	// failed to create while containerd restarted).
	anomalies []string
	// startFailed names a container of the Job the runtime failed to
	// start (neverStarted); its condition is then the cluster's doing, and
	// what the condition invariant finds is an oddity.
	startFailed string
	// kill is what the kill of the supervisor came to (nil: none drawn).
	kill *killOutcome
	// stopLags are, for each pod not killed that ran to its end, how long
	// after the model's moment (wouldStop) istio-proxy was stopped, by
	// the statuses' kind (lagRead, lagUnknownOnFailure, lagUnknownNever).
	stopLags map[string][]time.Duration
}

// late is, by kind, the stops of stopLags that came more than killBound
// after their model: those Jobs' details are worth a look.
func (v verdict) late() map[string][]time.Duration {
	out := map[string][]time.Duration{}
	for k, l := range v.stopLags {
		for _, d := range l {
			if d > killBound {
				out[k] = append(out[k], d)
			}
		}
	}
	return out
}

// The kinds of stopLags.
const (
	lagRead             = "statuses read"
	lagUnknownOnFailure = "statuses unknown, OnFailure"
	lagUnknownNever     = "statuses unknown, Never"
)

// killOutcome is what the SIGKILL of a pod's supervisor came to.
type killOutcome struct {
	pod string
	at  time.Time
	// missed says why the kill does not count (not sent, or it reached a
	// supervisor that had finished); "" if it does.
	missed string
	// when places the kill in the pod's life.
	when string
	// resumed is the restarted supervisor's "carrying on" line.
	resumed *logLine
	// lost lists the app instances that ended while no supervisor ran
	// (from the kill to the restarted one's start), unrecorded: their
	// statuses are no one's to read.
	lost []string
	// recorded lists those whose ends the kernel recorded for the next
	// one to read (exit-status ptrace: deadTime).
	recorded []string
	// wouldStop is when istio-proxy would have been stopped without the
	// kill (wouldStop), stop when it was; delay the difference, bound
	// its allowance (killBound, plus the restart wait of a status lost
	// under OnFailure).
	wouldStop, stop time.Time
	delay, bound    time.Duration
}

func (v *verdict) add(i invariant, format string, args ...any) {
	if i == invCondition && v.startFailed != "" {
		v.anomalies = append(v.anomalies, fmt.Sprintf(format, args...)+" ("+v.startFailed+")")
		return
	}
	v.problems[i] = append(v.problems[i], fmt.Sprintf(format, args...))
}

func (v *verdict) ok() bool {
	for _, p := range v.problems {
		if len(p) > 0 {
			return false
		}
	}
	return true
}

// observed is what the soak saw of one Job.
type observed struct {
	cond     *batchv1.JobCondition // nil: it did not finish in time
	kill     *killed               // the kill of a supervisor, if drawn
	pods     []podObs
	inst     map[string][]instance // by app
	stampErr error
}

// podObs is what the soak saw of one pod: its last status, the
// supervisor's log (and that of its instance before, if restarted), and
// the containers the runtime still runs for it.
type podObs struct {
	pod       *corev1.Pod
	log       string
	logErr    error
	prevLog   string
	prevErr   error
	sbLog     string // the standby's, where the pod has one
	sbErr     error
	running   []string
	crictlErr error
}

// checkJob checks the invariants on what was observed of timeline t's Job.
func checkJob(t timeline, o observed) verdict {
	v := verdict{outcomes: map[string]int{}, stopLags: map[string][]time.Duration{}, startFailed: startFailed(o.pods)}
	if t.kill != nil {
		v.kill = &killOutcome{missed: "no pod of the Job was seen"}
		if o.kill != nil {
			v.kill.pod, v.kill.at = o.kill.pod, o.kill.at
			if o.kill.err != nil {
				v.kill.missed = "not sent: " + o.kill.err.Error()
			}
		}
	}
	switch {
	case o.cond == nil:
		v.add(invCondition, "neither Complete nor Failed within the bound")
	case o.cond.Type != t.want.cond || (t.want.reason != "" && o.cond.Reason != t.want.reason):
		v.add(invCondition, "Job %s (%s: %s), want %s %s", o.cond.Type, o.cond.Reason, o.cond.Message, t.want.cond, t.want.reason)
	}
	if o.stampErr != nil {
		v.add(invCondition, "stamps: %v", o.stampErr)
	}
	pods := orderPods(o.pods, o.inst)
	if len(pods) != len(t.want.pods) {
		v.add(invCondition, "%d pod(s), want %d", len(pods), len(t.want.pods))
	}
	for k, p := range pods {
		var w *podWant
		if k < len(t.want.pods) {
			w = &t.want.pods[k]
		}
		checkPod(t, w, p, instancesIn(o.inst, p.pod.Name), o.kill, &v)
	}
	return v
}

// orderPods sorts the pods by the instances run in them (the first pod
// ran each app's first instance), then by creation.
func orderPods(pods []podObs, inst map[string][]instance) []podObs {
	first := map[string]int{}
	for _, in := range all(inst) {
		if f, ok := first[in.pod]; !ok || in.n < f {
			first[in.pod] = in.n
		}
	}
	out := slices.Clone(pods)
	sort.SliceStable(out, func(i, j int) bool {
		fi, oki := first[out[i].pod.Name]
		fj, okj := first[out[j].pod.Name]
		switch {
		case oki && okj && fi != fj:
			return fi < fj
		case oki != okj:
			return oki
		}
		return out[i].pod.CreationTimestamp.Before(&out[j].pod.CreationTimestamp)
	})
	return out
}

// all lists the instances of every app.
func all(inst map[string][]instance) []instance {
	return slices.Concat(slices.Collect(maps.Values(inst))...)
}

func instancesIn(inst map[string][]instance, pod string) map[string][]instance {
	out := map[string][]instance{}
	for _, in := range all(inst) {
		if in.pod == pod {
			out[in.app] = append(out[in.app], in)
		}
	}
	return out
}

// statuses are the pod's init containers' statuses, then its containers'.
func statuses(p *corev1.Pod) []corev1.ContainerStatus {
	return append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
}

// status is container name's status in list (nil: none): for the
// supervisor, statuses(p), it being an init container in the native shape.
func status(list []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	if i := slices.IndexFunc(list, func(s corev1.ContainerStatus) bool { return s.Name == name }); i >= 0 {
		return &list[i]
	}
	return nil
}

// checkPod checks one pod against what it must come to (w, nil for a pod
// the timeline has no room for: only what holds of every pod is checked).
// k is the kill of a supervisor, if one was drawn.
func checkPod(t timeline, w *podWant, p podObs, inst map[string][]instance, k *killed, v *verdict) {
	name := p.pod.Name
	// A Job whose start the runtime failed may have its pod deleted by
	// the Job controller as it fails the Job (OnFailure counts the
	// kubelet's restarts): the supervisor must then have seen a deletion.
	deleted := w != nil && w.deleted || v.startFailed != "" && p.pod.DeletionTimestamp != nil
	sup, proxy := status(statuses(p.pod), supervisorName), status(p.pod.Status.ContainerStatuses, proxyName)

	// None left running: in the kubelet's status, and in the runtime.
	for _, s := range statuses(p.pod) {
		if s.State.Running != nil {
			v.add(invLeft, "pod %s: container %s still running (%s)", name, s.Name, cluster.StateString(s.State))
		}
	}
	switch {
	case p.crictlErr != nil:
		v.unchecked = append(v.unchecked, fmt.Sprintf("pod %s: the runtime's containers: %v", name, p.crictlErr))
	case len(p.running) > 0:
		v.add(invLeft, "pod %s: the runtime still runs container(s) %s", name, strings.Join(p.running, ", "))
	}

	// Condition: the pod's phase, each app's instances and final status.
	if w != nil {
		checkApps(t, *w, p.pod, inst, v)
	}

	// The supervisor's logs, one per instance, the first first: that of
	// the instance before a restart, then the current one's.
	var sls []supervisorLog
	prevGone := false // the killed instance's log, removed by the kubelet
	switch {
	case p.logErr != nil:
		if !deleted {
			v.add(invOrder, "pod %s: no supervisor log: %v", name, p.logErr)
		} else {
			v.unchecked = append(v.unchecked, fmt.Sprintf("pod %s (deleted): supervisor log: %v", name, p.logErr))
		}
	case kubeletLine(p.log):
		// The log is gone (kubeletLine), though the fetch retried: the Job
		// controller deleted the pod (its backoffLimit, its
		// activeDeadlineSeconds), or the runtime lost the container,
		// before the soak read it. Nothing to check.
		v.unchecked = append(v.unchecked, fmt.Sprintf("pod %s: supervisor log gone: %s", name, strings.TrimSpace(p.log)))
	default:
		cur, err := parseSupervisorLog(p.log)
		if err != nil {
			v.add(invOrder, "pod %s: %v", name, err)
			break
		}
		if sup != nil && restartUnrun(*sup) {
			// The instance before never ran (its start failed under the
			// soak's containerd restart, seed 20261207, Job 126): it has no
			// log, and checkRestart lists the restart as the cluster's.
		} else if p.prevErr != nil {
			v.add(invRestart, "pod %s: no log of the supervisor's instance before its restart: %v", name, p.prevErr)
		} else if kubeletLine(p.prevLog) {
			// The kubelet keeps one dead instance per container: once the
			// restarted one has ended too, it may remove the killed one
			// before the soak has read it.
			prevGone = true
			v.unchecked = append(v.unchecked, fmt.Sprintf("pod %s: log of the supervisor's instance before its restart gone: %s",
				name, strings.TrimSpace(p.prevLog)))
		} else if p.prevLog != "" {
			prev, err := parseSupervisorLog(p.prevLog)
			if err != nil {
				v.add(invRestart, "pod %s: the supervisor's instance before its restart: %v", name, err)
			} else {
				sls = append(sls, prev)
			}
		}
		sls = append(sls, cur)
	}
	// A standby leads after the leader's death, or its exit: its log
	// comes after the killed instance's, before the restarted one's.
	if sbs := status(statuses(p.pod), standbyName); len(sls) > 0 && sbs != nil {
		sb, err := parseSupervisorLog(p.sbLog)
		switch {
		case p.sbErr != nil || kubeletLine(p.sbLog):
			v.unchecked = append(v.unchecked, fmt.Sprintf("pod %s: the standby's log: %v %s", name, p.sbErr, strings.TrimSpace(p.sbLog)))
		case p.sbLog == "" && startError(sbs.State):
			// The runtime failed its start (seed 20261209, Job 64: the
			// kubelet restarted under it), and under Never no instance
			// followed: no standby ran, nothing of it to check.
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the standby never started: %s", name, cluster.StateString(sbs.State)))
		case err != nil:
			v.add(invOrder, "pod %s: the standby: %v", name, err)
		case len(sls) == 2:
			sls = slices.Insert(sls, 1, sb)
		default:
			sls = append(sls, sb)
		}
	}
	logOK := len(sls) > 0
	var stops []logLine
	for _, sl := range sls {
		stops = append(stops, sl.stops...)
	}

	// Proxy after apps, from the supervisor's logs. An istio-proxy whose
	// start the runtime failed (neverStarted: a restart of the kubelet or
	// containerd under its creation) has nothing to stop: the supervisor
	// must say so, within its bound.
	unstarted := proxy != nil && startError(proxy.State)
	var lastEnd time.Time
	unended := false // an instance with no end stamp (killed)
	for _, in := range all(inst) {
		if in.end.After(lastEnd) {
			lastEnd = in.end
		}
		unended = unended || in.end.IsZero()
	}
	if logOK {
		for _, s := range stops {
			// The log has milliseconds (truncated): a stop logged at ms
			// came at or after ms, and before ms+1.
			before := s.At.Add(time.Millisecond)
			for _, in := range all(inst) {
				if !in.end.IsZero() && !in.end.Before(before) {
					v.add(invOrder, "pod %s: istio-proxy %s (%s) at %s while %s", name, s.Message, s.Signal, clock(s.At), in)
				} else if in.end.IsZero() && !in.start.Before(before) {
					v.add(invOrder, "pod %s: istio-proxy %s (%s) at %s before %s", name, s.Message, s.Signal, clock(s.At), in)
				}
			}
		}
		switch {
		case unstarted && !strings.Contains(p.log, msgNoSidecar):
			v.add(invOrder, "pod %s: istio-proxy never started (the runtime failed its start), and the supervisor's log has no %q", name, msgNoSidecar)
		case !unstarted && !deleted && len(stops) == 0 && prevGone && actedBeforeKill(sup):
			// The action was in the killed instance's log, which is gone;
			// the termination message it wrote as it acted says so (seed
			// 20261205, Job 144). The API's whole seconds are checked below.
			v.unchecked = append(v.unchecked, fmt.Sprintf("pod %s: the time of istio-proxy's stop (the killed supervisor acted: %q)",
				name, sup.LastTerminationState.Terminated.Message))
		case !unstarted && !deleted && len(stops) == 0 && !killedActing(sls, k, name):
			v.add(invOrder, "pod %s: the supervisor's log has no %q nor %q", name, msgSignalled, msgAsked)
		}
		// A restarted supervisor may find gone the sidecar the one before
		// acted on; istio-proxy gone before any action is a failure.
		acted := false
		for _, sl := range sls {
			if !sl.gone.IsZero() && !deleted && !acted {
				v.add(invOrder, "pod %s: istio-proxy had exited before the supervisor's action (%q at %s)", name, msgGone, clock(sl.gone))
			}
			acted = acted || len(sl.stops) > 0
		}
	}
	switch {
	case proxy == nil:
		v.add(invOrder, "pod %s has no istio-proxy status", name)
	case restartUnrun(*proxy) || proxy.RestartCount != 0 && neverStarted(proxy.LastTerminationState):
		v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the kubelet counts %d restart(s) of istio-proxy, whose last instance never ran (%s)",
			name, proxy.RestartCount, cluster.StateString(proxy.LastTerminationState)))
	case proxy.RestartCount != 0:
		v.add(invOrder, "pod %s: istio-proxy restarted %d time(s) (last: %s)", name, proxy.RestartCount, cluster.StateString(proxy.LastTerminationState))
	case proxy.State.Terminated != nil && !deleted && !unstarted && !lastEnd.IsZero() &&
		proxy.State.Terminated.FinishedAt.Time.Before(lastEnd.Truncate(time.Second)):
		// (One whose start failed "finished" then, having never run.)
		// The API's times have whole seconds.
		v.add(invOrder, "pod %s: istio-proxy finished at %s, before the last app's end at %s",
			name, proxy.State.Terminated.FinishedAt.UTC().Format(time.TimeOnly), clock(lastEnd))
	}

	// Supervisor restart: only where killed, then carried on, in time.
	var dead deadTime   // no supervisor ran, from the kill to the restarted one's start
	killedLast := false // the kill ended the last instance, after its work
	if sup != nil {
		dead, killedLast = checkRestart(t, w, p, sup, sls, stops, k, inst, v)
	}
	for _, sl := range sls {
		for _, j := range sl.journal {
			v.add(invRestart, "pod %s: the supervisor: %s", name, j)
		}
	}
	if w != nil && !deleted && len(stops) > 0 && (k == nil || k.pod != name || dead.gap[0].IsZero()) {
		if at, ok := wouldStop(t, *w, inst); ok {
			kind := lagRead
			switch {
			case (t.none || t.accounting) && t.restart == corev1.RestartPolicyOnFailure:
				kind = lagUnknownOnFailure
			case t.none || t.accounting:
				kind = lagUnknownNever
			}
			v.stopLags[kind] = append(v.stopLags[kind], stops[0].At.Sub(at))
		}
	}

	// Termination message, and the action it names.
	if sup == nil {
		v.add(invMessage, "pod %s has no %s status", name, supervisorName)
		return
	}
	if sb := status(statuses(p.pod), standbyName); sb != nil && sup.RestartCount == 0 && sup.State.Terminated != nil && sup.State.Terminated.ExitCode == 137 {
		// Killed, and the pod ended before its restart: the standby's
		// summary is the pod's.
		sup, killedLast = sb, false
	}
	term := sup.State.Terminated
	if term == nil {
		v.add(invMessage, "pod %s: the supervisor has not terminated: %s", name, cluster.StateString(sup.State))
		return
	}
	msg := strings.TrimSpace(term.Message)
	switch {
	case exitLost(sup.State):
		v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the runtime lost the supervisor's exit (%s), not its message", name, cluster.StateString(sup.State)))
	case term.ExitCode != 0 && !(killedLast && term.ExitCode == 137):
		v.add(invMessage, "pod %s: the supervisor exited %d (%s): %q", name, term.ExitCode, term.Reason, msg)
	}
	if deleted {
		v.outcomes["deleted"]++
		switch {
		case strings.Contains(msg, "pod deleted"):
		case (w == nil || !w.deleted) && !unended && !lastEnd.IsZero():
			// The Job controller deleted it as it failed the Job on a
			// start the runtime failed, and every app ended of itself
			// (stamped its end): once the apps had ended (seed 20261206,
			// Job 130: istio-proxy's first start failed, its restart
			// counted toward backoffLimit 1), or before the kubelet's
			// kill reached them (seed 20261209, Job 63: the standby's,
			// app1's end 1.2 s after the deletion, its SIGTERM after the
			// supervisor's decision). The supervisor rightly summed up
			// the apps' ends: it learns of a deletion from its SIGTERM.
			when := "once its apps had ended"
			if !lastEnd.Before(deletionAsked(p.pod)) {
				when = "its apps ending of themselves after it"
			}
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: deleted (%s), %s; message %q", name, v.startFailed, when, msg))
		default:
			v.add(invMessage, "pod %s (deleted while its apps ran): message %q, want it to say \"pod deleted\"", name, msg)
		}
		return
	}
	if w == nil {
		return
	}
	prefix, _, _ := strings.Cut(msg, ":")
	if rest, ok := strings.CutPrefix(msg, "running: "); ok && killedLast {
		// Killed between its action and its summary: the message it
		// wrote as it acted, "running: <outcome> (<reason>): action ...".
		prefix, _, _ = strings.Cut(rest, " ")
	}
	v.outcomes[prefix]++
	var first time.Time
	if logOK {
		first = sls[0].first
	}
	allowed, named := expectedOutcomes(t, *w, inst, first, logOK, dead)
	for _, s := range p.pod.Status.ContainerStatuses {
		if startError(s.State) && s.Name != proxyName && s.Name != supervisorName && s.Name != standbyName && !slices.Contains(allowed, "failure") {
			// The runtime failed to start an app (exit 128): the
			// supervisor saw its init killed before the program ran, a
			// failure, as the pod's phase has it (seed 20261213, Job 62).
			allowed = append(allowed, "failure")
		}
	}
	if !slices.Contains(allowed, prefix) {
		v.add(invMessage, "pod %s: message %q, want it to start with %s", name, msg, `"`+strings.Join(allowed, `:" or "`)+`:"`)
	}
	if prefix == "failure" {
		for _, n := range named {
			if !strings.Contains(msg, n) {
				v.add(invMessage, "pod %s: message %q does not name %q", name, msg, n)
			}
		}
	}
	// The action: SIGKILL on failure (Never), else SIGTERM, after which
	// pilot-agent drains and exits 0.
	if unstarted && !strings.HasSuffix(msg, "no sidecar appeared") {
		v.add(invMessage, "pod %s: istio-proxy never started, message %q, want it to end in \"no sidecar appeared\"", name, msg)
	}
	if proxy != nil && proxy.State.Terminated != nil && !unstarted && slices.Contains(allowed, prefix) {
		want := int32(0)
		if prefix == "failure" && t.restart == corev1.RestartPolicyNever {
			want = 137
		}
		if got := proxy.State.Terminated.ExitCode; exitLost(proxy.State) {
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the runtime lost istio-proxy's exit (%s)", name, cluster.StateString(proxy.State)))
		} else if got != want {
			v.add(invMessage, "pod %s: %s, istio-proxy exited %d (%s), want %d", name, prefix, got, proxy.State.Terminated.Reason, want)
		}
	}
}

// killBound is how much later than it would have been without the kill
// istio-proxy may be stopped in a pod whose supervisor was killed (issue
// 32: "within 3 s"). An app that ends while no supervisor runs leaves a
// status no one in the pod can read: under OnFailure the restarted
// supervisor then awaits the kubelet's restart of that app for its
// back-off plus the restart margin (restartWait), which comes on top.
const killBound = 3 * time.Second

// The supervisor's SUPERVISOR_RESTART_MARGIN as the template leaves it for
// the soak's apps (an image not pulled on every start), and the kubelet's
// restart back-off (supervisor/restarts.go).
const (
	appStartTimeout = 30 * time.Second // SUPERVISOR_APP_START_TIMEOUT
	restartMargin   = 15 * time.Second
	backoffInitial  = 10 * time.Second
	backoffMax      = 5 * time.Minute
)

// restartWait is how long, under OnFailure, the supervisor awaits the
// kubelet's restart of an app instance whose status is unknown, the k-th
// of its container in the pod (from 1): the kubelet's back-off for that
// restart plus the margin.
func restartWait(k int) time.Duration {
	d := time.Duration(0)
	if k > 1 {
		d = backoffInitial
		for i := 2; i < k && d < backoffMax; i++ {
			d *= 2
		}
	}
	return min(d, backoffMax) + restartMargin
}

// wouldStop is when the supervisor stops istio-proxy in a pod that ran to
// its end, had it not been killed: at the end of the pod's last app
// instance; with its status unknown under OnFailure (unknownEnd), once each
// app's last instance has awaited the restart it might need (restartWait). ok is
// false where an instance has no end.
func wouldStop(t timeline, w podWant, inst map[string][]instance) (at time.Time, ok bool) {
	for _, a := range t.apps {
		x := find(inst[a.name], w.last[a.name])
		if x == nil || x.end.IsZero() {
			return time.Time{}, false
		}
		end := x.end
		if t.unknownEnd(x.code) && t.restart == corev1.RestartPolicyOnFailure {
			end = end.Add(restartWait(w.last[a.name] - w.first[a.name] + 1))
		}
		if end.After(at) {
			at = end
		}
	}
	return at, true
}

// deletionGrace is the supervisor's SUPERVISOR_DELETION_GRACE: an app
// ended by SIGTERM (exit 143, as a shell reports it) may be the pod being
// deleted, so the supervisor holds such a failure's decision that long,
// killed or not (supervisor/decide.go).
const deletionGrace = 2 * time.Second

// graceFor is deletionGrace where the supervisor's summary is a failure
// naming an exit 143 it read, else 0: what comes on top of wouldStop
// before the stop. A status it never read (exit-status none, an end while
// no supervisor ran) holds no decision.
func graceFor(sup *corev1.ContainerStatus) time.Duration {
	if sup != nil && sup.State.Terminated != nil && failed143.MatchString(sup.State.Terminated.Message) {
		return deletionGrace
	}
	return 0
}

var failed143 = regexp.MustCompile(`^failure: .*\bexit 143\b`)

// The window around the gap in which an app's end may have gone unread:
// the killed supervisor may not have read (and journaled) an end just
// before its death, and the restarted one sees ends up to its line saying
// it carries on, logged to the millisecond.
const (
	gapBefore = 250 * time.Millisecond
	gapAfter  = 100 * time.Millisecond
)

func inGap(gap [2]time.Time, at time.Time) bool {
	return !gap[0].IsZero() && !at.Before(gap[0].Add(-gapBefore)) && !at.After(gap[1].Add(gapAfter))
}

// deadTime is a pod's time without a supervisor: gap, from the kill to the
// restarted one's carrying on (zero: none). Under exit-status ptrace, once
// the killed one had anchored accounting to istio-proxy's mount
// (msgAnchored), the kernel recorded the ends in the gap and the next one
// reads them: the end of every instance the killed one had journaled,
// that is, that started (by seenMargin) before recordedBefore (zero:
// none).
type deadTime struct {
	gap            [2]time.Time
	recordedBefore time.Time
}

// recorded says whether the next supervisor reads in's status from the
// kernel's record of its end, had it fallen in the gap: a record of exit
// 0 reads unknown (supervisor/exitwatch/acct_linux.go).
func (d deadTime) recorded(in instance) bool {
	return !d.recordedBefore.IsZero() && in.start.Before(d.recordedBefore) && in.code != 0
}

// unread says whether in's end fell in the gap, unrecorded.
func (d deadTime) unread(in instance) bool {
	return inGap(d.gap, in.end) && !d.recorded(in)
}

// checkRestart checks the supervisor's restarts: none in a pod whose
// supervisor the soak did not kill; where it did, one, after an exit 137,
// and the instance after carried on from the journal and stopped
// istio-proxy within killBound of when it would have without the kill.
// It fills v.kill, and returns the pod's dead time: from the kill to the
// restarted supervisor's line saying it carries on (zero: no kill that
// counts), and what the kernel recorded of it.
//
// ended says the kill ended the supervisor's last instance after its work,
// and no restart followed: its exit 137 is the kill's, not a failure.
func checkRestart(t timeline, w *podWant, p podObs, sup *corev1.ContainerStatus, sls []supervisorLog, stops []logLine, k *killed, inst map[string][]instance, v *verdict) (dead deadTime, ended bool) {
	name := p.pod.Name
	last := sup.LastTerminationState.Terminated
	if !k.sent() || k.pod != name {
		switch {
		case restartUnrun(*sup):
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the kubelet counts %d restart(s) of the supervisor, whose last instance never ran (%s)",
				name, sup.RestartCount, cluster.StateString(sup.LastTerminationState)))
		case sup.RestartCount == 1 && neverStarted(sup.LastTerminationState) && last.Reason == "StartError":
			// Its one start failed in the runtime (a kubelet restarted under
			// the CRI call: "context canceled", seed 20261214, Job 64): no
			// supervisor ran, so none died; the kubelet started it again.
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the supervisor's first start failed in the runtime, and the kubelet started it again (%s)",
				name, cluster.StateString(sup.LastTerminationState)))
		case sup.RestartCount != 0:
			v.add(invRestart, "pod %s: the supervisor, not killed, restarted %d time(s) (last: %s)", name, sup.RestartCount, cluster.StateString(sup.LastTerminationState))
		}
		return dead, false
	}
	ko := v.kill
	ko.missed = ""
	// A standby's log is among sls (checkPod); the leader's are the others.
	standby := status(statuses(p.pod), standbyName) != nil
	leaderLogs := len(sls)
	if standby && leaderLogs > 0 {
		leaderLogs--
	}
	if sup.RestartCount == 0 && leaderLogs == 1 {
		proxy := status(p.pod.Status.ContainerStatuses, proxyName)
		switch {
		case by(sls[0].done, k.at):
			// A container supervisor exits once it has stopped the
			// sidecars: the SIGKILL found it finished (exiting, not yet
			// reaped); a native one idles until the kubelet stops it, and
			// the SIGKILL ends it (137) in a pod where the kubelet restarts
			// it no more.
			ko.missed = fmt.Sprintf("the supervisor had finished (its %q at %s)", msgDone, clock(sls[0].done))
		case len(sls[0].stops) > 0 && by(sls[0].stops[0].At, k.at):
			// The SIGKILL came after the action: the sidecars stopped, the
			// pod's regular containers had all ended, and the kubelet does
			// not restart a container of a pod that is done. Its message
			// is the one it wrote before acting ("running: <outcome> ...").
			ko.missed = fmt.Sprintf("the supervisor had acted (%q at %s); the pod ended before any restart", sls[0].stops[0].Message, clock(sls[0].stops[0].At))
		case by(sls[0].decided, k.at) && proxy != nil && proxy.State.Terminated != nil && proxy.State.Terminated.ExitCode == actionExit(sup):
			// The SIGKILL came during the action (seed 20261206, Job 150:
			// after the /drain, as the quit went out; seed 20261213, Job
			// 84: 16 ms after a failure's decision, its SIGKILL sent, not
			// logged): istio-proxy ended as the action ends it (0, or 137
			// for SIGKILL), the pod ended, and the kubelet restarts no
			// container of a pod that is done. Its message is the one it
			// wrote as it decided.
			ko.missed = fmt.Sprintf("the supervisor was acting (its %q at %s), and istio-proxy exited %d; the pod ended before any restart",
				msgDecision, clock(sls[0].decided), proxy.State.Terminated.ExitCode)
		}
		if ko.missed != "" {
			return dead, true
		}
	}
	switch {
	case standby && sup.RestartCount == 0 && sup.State.Terminated != nil && sup.State.Terminated.ExitCode == 137:
		// The standby carried on; the pod ended before the kubelet's
		// restart of the killed one.
	case sup.RestartCount != 1 || last == nil || last.ExitCode != 137:
		v.add(invRestart, "pod %s: the supervisor, SIGKILLed at %s, restarted %d time(s) (last: %s), want once after exit 137",
			name, clock(k.at), sup.RestartCount, cluster.StateString(sup.LastTerminationState))
	}
	if len(sls) == 0 {
		return dead, false // checkPod says why there is no log
	}
	// The instance after: the first to carry on from the journal (a
	// standby's, before the killed one's restart), else the last.
	before, after := supervisorLog{}, sls[len(sls)-1]
	if i := slices.IndexFunc(sls[1:], func(sl supervisorLog) bool { return sl.resumed != nil }); i >= 0 {
		after = sls[1+i]
	}
	switch {
	case len(sls) >= 2:
		before = sls[0]
	case sup.RestartCount > 0 && kubeletLine(p.prevLog):
		// The killed instance's log is gone (not checked): where the kill
		// came is told by the stamps alone.
	default:
		v.add(invRestart, "pod %s: no logs of two instances of the supervisor", name)
		return dead, false
	}
	ko.when = placeKill(k.at, inst, before)
	ko.resumed = after.resumed
	dead.gap = [2]time.Time{k.at, after.start}
	if !before.last.IsZero() && before.last.Before(k.at) {
		// An end after the killed instance's last line was not read by it
		// (it logs each end it reads), however long before the kill it
		// came: on a loaded node it may not get the CPU for hundreds of
		// milliseconds (seed 20261217, Job 178: 441 ms). Whether it read
		// it soon enough is the bound's to say, not the message's.
		dead.gap[0] = before.last
	}
	if after.resumed == nil {
		v.add(invRestart, "pod %s: the restarted supervisor does not say %q", name, msgResumed)
	} else {
		dead.gap[1] = after.resumed.At
	}
	if t.ptrace && !before.anchored.IsZero() && before.anchored.Before(k.at) {
		dead.recordedBefore = k.at.Add(-seenMargin)
	}
	if w == nil || w.deleted {
		return dead, false
	}
	for _, a := range t.apps {
		for _, in := range inst[a.name] {
			switch {
			case in.end.IsZero() || !inGap(dead.gap, in.end):
			case dead.recorded(in):
				ko.recorded = append(ko.recorded, fmt.Sprintf("%s #%d", in.app, in.n))
			default:
				ko.lost = append(ko.lost, fmt.Sprintf("%s #%d", in.app, in.n))
			}
		}
	}
	would, ok := wouldStop(t, *w, inst)
	would = would.Add(graceFor(sup))
	// No supervisor stops a sidecar before it runs: the kubelet starts
	// istio-proxy last, seconds after the apps on a loaded node, even
	// after their end (seed 20261206 with -standby, Job 164: 4 s). The
	// API's times have whole seconds: by the next one it ran.
	if proxy := status(p.pod.Status.ContainerStatuses, proxyName); proxy != nil && proxy.State.Terminated != nil {
		if runs := proxy.State.Terminated.StartedAt.Add(time.Second); !proxy.State.Terminated.StartedAt.IsZero() && runs.After(would) {
			would = runs
		}
	}
	if !ok || len(stops) == 0 {
		return dead, false // the other invariants say why
	}
	ko.wouldStop, ko.stop = would, stops[0].At
	ko.delay = ko.stop.Sub(would)
	ko.bound = killBound
	if t.restart == corev1.RestartPolicyOnFailure && !t.none {
		for _, a := range t.apps {
			if x := find(inst[a.name], w.last[a.name]); x != nil && dead.unread(*x) {
				ko.bound = max(ko.bound, killBound+restartWait(w.last[a.name]-w.first[a.name]+1))
			}
		}
	}
	// An app that ended as its runtime's init, before its exec was seen
	// (its status unknown, or killed): it awaited its new start, which
	// the kill does not change.
	for _, sl := range sls {
		if sl.initWait > 0 {
			ko.bound = max(ko.bound, killBound+sl.initWait)
		}
	}
	// An app the restarted supervisor never saw, every run of which had
	// ended before it started (a run of milliseconds while no supervisor
	// ran): nothing left in the pod tells a finished app from one whose
	// start failed and that the kubelet will start again, so it looks for
	// it for SUPERVISOR_APP_START_TIMEOUT, then takes its status as
	// unknown. An app it never saw that ran after it started is a miss.
	for _, a := range after.missing {
		ended := len(inst[a]) > 0
		for _, in := range inst[a] {
			ended = ended && !in.end.IsZero() && in.end.Before(after.start)
		}
		if !ended {
			v.add(invRestart, "pod %s: the restarted supervisor (started %s) says it never saw %s, which ran after its start", name, clock(after.start), a)
			continue
		}
		ko.bound = max(ko.bound, after.start.Add(appStartTimeout+killBound).Sub(would))
	}
	if ko.delay > ko.bound {
		v.add(invRestart, "pod %s: istio-proxy stopped at %s, %s after it would have without the kill (%s), more than %s",
			name, clock(ko.stop), ko.delay.Round(time.Millisecond), clock(would), ko.bound)
	}
	return dead, false
}

// placeKill says where in the pod's life the kill came: during or after the
// stop (the killed supervisor's log), around an app instance's end, while
// one ran, or between runs.
func placeKill(at time.Time, inst map[string][]instance, before supervisorLog) string {
	if by(before.done, at) {
		return fmt.Sprintf("after the stop: %s after the summary (%q)", fmtDur(at.Sub(before.done)), msgDone)
	}
	if len(before.stops) > 0 && by(before.stops[0].At, at) {
		return fmt.Sprintf("during the stop: %s after %q", fmtDur(at.Sub(before.stops[0].At)), before.stops[0].Message)
	}
	var near *instance
	var running []string
	for _, in := range all(inst) {
		if in.end.IsZero() {
			continue
		}
		if near == nil || at.Sub(in.end).Abs() < at.Sub(near.end).Abs() {
			near = &in
		}
		if !in.start.After(at) && in.end.After(at) {
			running = append(running, fmt.Sprintf("%s #%d (%s in, %s before its end)", in.app, in.n, fmtDur(at.Sub(in.start)), fmtDur(in.end.Sub(at))))
		}
	}
	sort.Strings(running)
	switch {
	case near != nil && at.Sub(near.end).Abs() <= 500*time.Millisecond:
		return fmt.Sprintf("%s %s #%d's end (exit %d)", fmtOff(at.Sub(near.end)), near.app, near.n, near.code)
	case len(running) > 0:
		return "while " + strings.Join(running, ", ") + " ran"
	case near != nil:
		return fmt.Sprintf("while no app ran: %s %s #%d's end", fmtOff(at.Sub(near.end)), near.app, near.n)
	}
	return "before any app ended"
}

func checkApps(t timeline, w podWant, p *corev1.Pod, inst map[string][]instance, v *verdict) {
	name := p.Name
	if w.deleted {
		if p.DeletionTimestamp == nil {
			v.add(invCondition, "pod %s: not deleted, want it deleted while its apps ran", name)
		}
		if p.Status.Phase != corev1.PodFailed {
			v.add(invCondition, "pod %s (deleted): phase %s, want Failed", name, p.Status.Phase)
		}
		for _, a := range t.apps {
			list := inst[a.name]
			switch s := status(p.Status.ContainerStatuses, a.name); {
			case len(list) == 0 && s != nil && s.RestartCount == 0 && (s.State.Waiting != nil || neverStarted(s.State) || killedBy(s.State)):
				// The deletion came before its program wrote its first
				// stamp: on a loaded node a container starts seconds after
				// the one before (seed 20261218, Job 7: app2 started 4 s
				// before the deadline, SIGTERMed unstamped).
				v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: deleted before %s ran its program (%s)", name, a.name, cluster.StateString(s.State)))
			case len(list) == 0 || list[0].n != w.first[a.name]:
				v.add(invCondition, "pod %s (deleted): %s's first instance %v, want #%d", name, a.name, list, w.first[a.name])
			}
		}
		return
	}
	if p.DeletionTimestamp != nil {
		v.add(invCondition, "pod %s was deleted", name)
	}
	wantPhase := corev1.PodSucceeded
	for _, a := range t.apps {
		if a.at(w.last[a.name]).code != 0 {
			wantPhase = corev1.PodFailed
		}
	}
	if p.Status.Phase != wantPhase {
		v.add(invCondition, "pod %s: phase %s, want %s", name, p.Status.Phase, wantPhase)
	}
	for _, a := range t.apps {
		list := inst[a.name]
		var got []int
		for _, in := range list {
			got = append(got, in.n)
		}
		var want []int
		for n := w.first[a.name]; n <= w.last[a.name]; n++ {
			want = append(want, n)
		}
		if !slices.Equal(got, want) {
			v.add(invCondition, "pod %s: %s ran instances %v, want %v", name, a.name, got, want)
		}
		s := status(p.Status.ContainerStatuses, a.name)
		for _, in := range list {
			switch {
			case in.end.IsZero() && s != nil && neverStarted(s.LastTerminationState):
				// The runtime killed it as it started it, and never recorded
				// its start: containerd restarted under it (the soak's own
				// disruption). The supervisor signals sidecars only.
				v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: %s killed by the runtime as it started (%s)",
					name, in, cluster.StateString(s.LastTerminationState)))
			case in.end.IsZero():
				v.add(invCondition, "pod %s: %s never ended (killed)", name, in)
			case in.code != a.at(in.n).code:
				v.add(invCondition, "pod %s: %s, want exit %d", name, in, a.at(in.n).code)
			}
		}
		lastRun := find(list, w.last[a.name])
		switch {
		case s == nil:
			v.add(invCondition, "pod %s has no status for %s", name, a.name)
		case s.State.Terminated == nil:
			v.add(invCondition, "pod %s: %s %s", name, a.name, cluster.StateString(s.State))
		case exitLost(s.State) && lastRun != nil && lastRun.code == a.at(w.last[a.name]).code:
			// The stamps have the exit the runtime lost.
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the runtime lost %s's exit (%s); its stamp has exit %d", name, a.name,
				cluster.StateString(s.State), a.at(w.last[a.name]).code))
		case s.State.Terminated.ExitCode != int32(a.at(w.last[a.name]).code):
			v.add(invCondition, "pod %s: %s exited %d, want %d", name, a.name, s.State.Terminated.ExitCode, a.at(w.last[a.name]).code)
		case int(s.RestartCount) != w.restarts[a.name] && slices.Equal(got, want):
			// The stamps say what ran; the kubelet counts the containers
			// it made, one it failed to start included.
			v.anomalies = append(v.anomalies, fmt.Sprintf("pod %s: the kubelet counts %d restart(s) of %s, which ran instances %v (last: %s)",
				name, s.RestartCount, a.name, got, cluster.StateString(s.LastTerminationState)))
		case int(s.RestartCount) != w.restarts[a.name]:
			v.add(invCondition, "pod %s: %s restarted %d time(s), want %d", name, a.name, s.RestartCount, w.restarts[a.name])
		}
	}
}

// kubeletLine reports whether a log's body is the kubelet's own line
// ("unable to retrieve container logs ...", "failed to try resolving
// symlinks in path ..."), not the supervisor's JSON: the kubelet answers
// so, with no error, where the container or its log file is gone, or the
// runtime is restarting.
func kubeletLine(log string) bool {
	return !strings.Contains(log, "{") &&
		(strings.Contains(log, "unable to retrieve container logs") || strings.Contains(log, "failed to try resolving symlinks"))
}

// actedBeforeKill reports whether the supervisor's instance before its
// restart (sup, its status) wrote, in its termination message, that it had
// acted: as it acted, "running: <outcome> (<reason>): action ..."
// (supervisor/progress.go); or, done, its summary "<outcome>: <reason>;
// action ..." (seed 20261209, Job 80: killed 27 ms after the app's end,
// once it had written the summary).
func actedBeforeKill(sup *corev1.ContainerStatus) bool {
	if sup == nil || sup.LastTerminationState.Terminated == nil {
		return false
	}
	msg := sup.LastTerminationState.Terminated.Message
	if _, acting := actingAction(msg); acting {
		return true
	}
	head, _, _ := strings.Cut(msg, "\n")
	m := summaryAction.FindStringSubmatch(head)
	return m != nil && m[1] != "none"
}

// actingAction is the action a termination message names as the
// supervisor acts, "running: <outcome> (<reason>): action <action>"
// (supervisor/progress.go), and whether msg is one.
func actingAction(msg string) (string, bool) {
	head, _, _ := strings.Cut(msg, "\n")
	rest, ok := strings.CutPrefix(head, "running: ")
	if !ok {
		return "", false
	}
	_, action, ok := strings.Cut(rest, "): action ")
	return action, ok
}

// actionExit is the exit code istio-proxy gets from the action that the
// supervisor's termination message (sup's current state) names as it acts:
// 137 for SIGKILL, else 0 (a graceful signal, the HTTP quit).
func actionExit(sup *corev1.ContainerStatus) int32 {
	if t := sup.State.Terminated; t != nil {
		if action, _ := actingAction(t.Message); action == "SIGKILL" {
			return 137
		}
	}
	return 0
}

var summaryAction = regexp.MustCompile(`^(?:success|failure|unknown): .*?; action (\S+)`)

// restartUnrun reports whether the kubelet counts a restart of a container
// whose last instance never ran: its last state is no termination (its
// start failed under a restart of the kubelet or containerd).
func restartUnrun(s corev1.ContainerStatus) bool {
	return s.RestartCount != 0 && s.LastTerminationState.Terminated == nil
}

// killedActing reports whether the soak's SIGKILL reached pod name's
// supervisor after its decision: during its action, which it had no time
// to log (checkRestart says what followed).
func killedActing(sls []supervisorLog, k *killed, name string) bool {
	return k.sent() && k.pod == name && len(sls) > 0 && by(sls[0].decided, k.at)
}

// by reports whether a moment logged (zero: not logged) came at or before
// at.
func by(logged, at time.Time) bool { return !logged.IsZero() && !logged.After(at) }

// neverStarted reports whether a container state is a termination whose
// start the runtime never recorded (started at the epoch): a container
// killed as it was being started (137), whose start failed (128,
// StartError), or even one reported "Completed" (0) by a containerd
// restarted under its start (seed 123, Job 6). A container that ran has
// its start time.
func neverStarted(st corev1.ContainerState) bool {
	t := st.Terminated
	return t != nil && (t.StartedAt.IsZero() || t.StartedAt.Unix() == 0)
}

// killedBy reports whether a container ended by SIGTERM or SIGKILL (143,
// 137): a deletion's.
func killedBy(st corev1.ContainerState) bool {
	return st.Terminated != nil && (st.Terminated.ExitCode == 143 || st.Terminated.ExitCode == 137)
}

// startError reports whether a container state is a start the runtime
// failed: StartError, never started.
func startError(st corev1.ContainerState) bool {
	return neverStarted(st) && st.Terminated.Reason == "StartError"
}

// exitLost says the runtime lost the container's exit: the kubelet then
// records exit 255, reason "Unknown" (containerd restarted as the
// container ended: the soak, seed 20261215, Jobs 125 and 129, within a
// second of its restart). What the process exited with is the stamp's.
func exitLost(st corev1.ContainerState) bool {
	return st.Terminated != nil && st.Terminated.ExitCode == 255 && st.Terminated.Reason == "Unknown"
}

// deletionAsked is when p's deletion was asked for: its deletion timestamp
// less its grace period (the kubelet's deadline for it); zero if none.
func deletionAsked(p *corev1.Pod) time.Time {
	if p.DeletionTimestamp == nil {
		return time.Time{}
	}
	at := p.DeletionTimestamp.Time
	if p.DeletionGracePeriodSeconds != nil {
		at = at.Add(-time.Duration(*p.DeletionGracePeriodSeconds) * time.Second)
	}
	return at
}

// startFailed names the first container of pods whose start the runtime
// failed (exit 128, StartError, never started: the kubelet or containerd
// restarted under its creation, "context canceled"), or whose restart the
// kubelet counts though its last instance never ran, or whose exit the
// runtime lost in a pod that failed (exitLost), "" if none. Such a
// Job's condition follows the failed start, not the timeline (under
// OnFailure the Job controller counts the restarts toward backoffLimit).
func startFailed(pods []podObs) string {
	for _, p := range pods {
		for _, s := range p.pod.Status.ContainerStatuses {
			for _, st := range []corev1.ContainerState{s.State, s.LastTerminationState} {
				if startError(st) {
					return fmt.Sprintf("pod %s: the runtime failed to start %s: %s", p.pod.Name, s.Name, st.Terminated.Message)
				}
			}
			if restartUnrun(s) {
				return fmt.Sprintf("pod %s: the kubelet counts %d restart(s) of %s, whose last instance never ran", p.pod.Name, s.RestartCount, s.Name)
			}
			if exitLost(s.State) && p.pod.Status.Phase == corev1.PodFailed {
				// Its 255 fails the pod, and the Job makes another (seed
				// 20261217, Job 115: a fourth pod where three were drawn).
				return fmt.Sprintf("pod %s: the runtime lost %s's exit, and the pod failed on it", p.pod.Name, s.Name)
			}
		}
	}
	return ""
}

// seenMargin: an app instance that ended this long after the supervisor's
// first scan (supervisorLog.first), and (a restart) ran this long, was seen by it: its exit
// status must be known. Quicker ones may be gone before the supervisor
// looks (a missing or already exited container: status unknown, by
// design).
const seenMargin = time.Second

// expectedOutcomes returns the summaries the supervisor may give the pod
// (success, failure, unknown), and the "app exit N" its failure summary
// must name. An instance whose end is unread in the dead time (while no
// supervisor ran, its supervisor killed) was not seen.
func expectedOutcomes(t timeline, w podWant, inst map[string][]instance, supStart time.Time, logOK bool, dead deadTime) (allowed, named []string) {
	if t.none {
		return []string{"unknown"}, nil
	}
	var failSeen, failRecorded, failUnseen, okRecorded, okUnseen bool
	for _, a := range t.apps {
		n := w.last[a.name]
		code := a.at(n).code
		in := find(inst[a.name], n)
		seen := logOK && in != nil && !in.end.IsZero() && in.end.After(supStart.Add(seenMargin)) &&
			(n == w.first[a.name] || in.end.Sub(in.start) >= seenMargin) && !dead.unread(*in)
		// Read from its accounting record: the method's, or the dead
		// time's under ptrace.
		fromRecord := seen && (t.accounting || (inGap(dead.gap, in.end) && dead.recorded(*in)))
		switch {
		case code != 0 && fromRecord:
			// A failure's record may say 0 (written before the app's main
			// thread took its code), read as unknown: not named.
			failRecorded = true
		case code != 0 && seen:
			failSeen = true
			named = append(named, fmt.Sprintf("%s exit %d", a.name, code))
		case code != 0:
			failUnseen = true
		case t.accounting:
			okRecorded = true // a record of exit 0 reads unknown
		case !seen:
			okUnseen = true
		}
	}
	switch {
	case failSeen:
		return []string{"failure"}, named
	case failUnseen, failRecorded:
		return []string{"failure", "unknown"}, named
	case okRecorded:
		return []string{"unknown"}, nil
	case okUnseen:
		return []string{"success", "unknown"}, nil
	}
	return []string{"success"}, nil
}

func (k *killOutcome) String() string {
	if k.missed != "" {
		return "missed: " + k.missed
	}
	s := fmt.Sprintf("pod %s killed at %s, %s", k.pod, clock(k.at), k.when)
	if r := k.resumed; r != nil {
		s += fmt.Sprintf("; carried on at %s (%s after the kill; apps %d, ended %d, ended unwatched %d, watched %d)",
			clock(r.At), fmtDur(r.At.Sub(k.at)), r.counts.Apps, r.counts.Ended, r.counts.EndedUnwatched, r.counts.Watched)
	}
	if len(k.lost) > 0 {
		s += "; ended while no supervisor ran: " + strings.Join(k.lost, ", ")
	}
	if len(k.recorded) > 0 {
		s += "; ended while no supervisor ran, recorded: " + strings.Join(k.recorded, ", ")
	}
	if !k.stop.IsZero() {
		s += fmt.Sprintf("; istio-proxy stopped at %s, would have at %s: %s later (bound %s)",
			clock(k.stop), clock(k.wouldStop), k.delay.Round(time.Millisecond), k.bound)
	}
	return s
}
