package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// TestOnFailureRestart: a failed app is restarted by the kubelet as a new
// container; the sidecar stays up until the restart succeeds, then gets
// the (graceful) success action.
func TestOnFailureRestart(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure"),
		container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10).exit(exited(1))
	noSignalFor(t, h, 100*time.Millisecond)
	h.pod.add(container(procscan.App, "app-r1", 11))
	h.proc(11).exit(killed(exitwatch.SIGKILL)) // OOM-killed: restarted again
	noSignalFor(t, h, 100*time.Millisecond)
	h.pod.add(container(procscan.App, "app-r2", 12))
	h.proc(12).exit(exited(0))
	res, err := h.wait()
	if err != nil || res.Outcome != Success {
		t.Fatalf("res %+v err %v; log:\n%s", res, err, h.log)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	if len(res.Apps) != 1 || res.Apps[0].Container != "app-r2" {
		t.Errorf("decided on %+v, want only the last instance", res.Apps)
	}
}

// TestOnFailureRestartDuringDiscovery: an app fails and is restarted while
// the supervisor still waits for another app container to start, and the
// restart and the late container show up in the same scan. The restart
// takes the failed one's slot (the exit is taken into account before the
// new containers), so the run ends when both succeed instead of awaiting a
// restart that already came.
func TestOnFailureRestartDuringDiscovery(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APP_CONTAINERS=2"),
		container(procscan.App, "a", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10).exit(exited(1))
	h.pod.mu.Lock()
	h.pod.containers = append(h.pod.containers, container(procscan.App, "a-r1", 11), container(procscan.App, "b", 20))
	h.pod.mu.Unlock()
	h.proc(11).exit(exited(0))
	h.proc(20).exit(exited(0))
	res, err := h.wait()
	if err != nil || res.Outcome != Success {
		t.Fatalf("res %+v err %v; log:\n%s", res, err, h.log)
	}
	if !strings.Contains(h.log.String(), `"container":"a-r1","replaces":"a"`) {
		t.Errorf("a-r1 not taken as a's restart; log:\n%s", h.log)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

// TestOnFailureOneProcessTwoCgroups: issue 15. A restarted app's main
// process is first seen before the runtime moved it into its cgroup (here
// "/", as procscan reports one when it cannot tell: no pause container to
// compare with), then in its real cgroup. It is one instance: it fills one
// slot, and its one exit 0 does not end the run while the other app still
// awaits its own restart.
func TestOnFailureOneProcessTwoCgroups(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APP_CONTAINERS=2"),
		container(procscan.App, "app0", 8), container(procscan.App, "app1", 16), container(procscan.Sidecar, "pilot-agent", 100))
	app0, app1 := h.proc(8), h.proc(16)
	app1.exit(exited(1))
	waitLog(t, h, `"container":"app1","message":"app failed under restartPolicy OnFailure`)
	moving := container(procscan.App, "/", 66) // app1's restart, not yet in its cgroup
	h.pod.add(moving)
	waitLog(t, h, `"container":"/","replaces":"app1"`)
	app0.exit(exited(1))
	waitLog(t, h, `"container":"app0","message":"app failed under restartPolicy OnFailure`)
	settled := container(procscan.App, "app1-r1", 66)
	h.pod.mu.Lock()
	for i, c := range h.pod.containers {
		if c.ID == "/" {
			h.pod.containers[i] = settled
		}
	}
	scans := h.pod.scans
	h.pod.mu.Unlock()
	// Let the run see pid 66 in app1-r1 (it scans while a restart is
	// awaited; a run that wrongly ended scans no more).
	for deadline := time.Now().Add(time.Second); h.pod.scanCount() < scans+2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	h.proc(66).exit(exited(0))
	noSignalFor(t, h, 200*time.Millisecond) // app0's restart is still to come
	h.pod.add(container(procscan.App, "app0-r1", 70))
	h.proc(70).exit(exited(0))
	res, err := h.wait()
	if err != nil || res.Outcome != Success {
		t.Fatalf("res %+v err %v; log:\n%s", res, err, h.log)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	var names []string
	for _, a := range res.Apps {
		names = append(names, a.Container)
	}
	if !strings.Contains(h.log.String(), `"container":"app1-r1","was":"/","message":"app seen in another cgroup`) {
		t.Errorf("the move is not logged; log:\n%s", h.log)
	}
	if diff := cmp.Diff([]string{"app1-r1", "app0-r1"}, names); diff != "" {
		t.Errorf("decided on (-want +got):\n%s\nlog:\n%s", diff, h.log)
	}
}

// waitLog waits (bounded) until the run's log holds s.
func waitLog(t *testing.T, h *harness, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		h.logw.mu.Lock()
		ok := strings.Contains(h.log.String(), s)
		h.logw.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the log never said %s; log:\n%s", s, h.log)
}

// TestOnFailureUnknown: with no status, a restart is awaited for
// RestartTimeout; none comes, so the app is taken as finished (unknown).
func TestOnFailureUnknown(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_TIMEOUT=300ms"),
		container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10).exit(unknownStatus())
	noSignalFor(t, h, 150*time.Millisecond)
	res, _ := h.wait()
	if res.Outcome != Unknown {
		t.Errorf("outcome %v, want unknown", res.Outcome)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
}

// TestOnFailureUnknownRestarted: an unknown status followed by a restart
// was a failure after all: the new container is watched.
func TestOnFailureUnknownRestarted(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_RESTART_TIMEOUT=1m"),
		container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10).exit(unknownStatus())
	h.pod.add(container(procscan.App, "app-r1", 11))
	noSignalFor(t, h, 100*time.Millisecond)
	h.proc(11).exit(exited(0))
	res, _ := h.wait()
	if res.Outcome != Success {
		t.Errorf("outcome %v, want success; log:\n%s", res.Outcome, h.log)
	}
}

// TestAlways: the sidecar is never stopped on an app's exit; SIGTERM ends
// the idle supervisor.
func TestAlways(t *testing.T) {
	for _, env := range [][]string{{"SUPERVISOR_RESTART_POLICY=Always"}, {"SUPERVISOR_RESTART_POLICY=Always", "SUPERVISOR_NATIVE_SIDECAR=true"}} {
		h := start(t, testConfig(t, env...), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		noSignalFor(t, h, 100*time.Millisecond)
		scans := h.pod.scanCount()
		time.Sleep(50 * time.Millisecond)
		if got := h.pod.scanCount(); got != scans {
			t.Errorf("%v: idle supervisor scanned /proc %d more times", env, got-scans)
		}
		h.cancel()
		res, err := h.wait()
		if err != nil || !res.Deleted {
			t.Errorf("%v: res %+v err %v", env, res, err)
		}
	}
}

// TestNativeSidecar: the kubelet stops a native sidecar; the supervisor
// stays out of the way and ends at once.
func TestNativeSidecar(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_NATIVE_SIDECAR=true"), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	res, err := h.wait()
	if err != nil || res.Deleted || !strings.Contains(res.Summary, "native sidecar") || len(h.kernel.sent()) != 0 {
		t.Errorf("res %+v err %v signals %v", res, err, h.kernel.sent())
	}
}

// TestSidecarActions: several sidecars, each with its own action.
func TestSidecarActions(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,cloud-sql-proxy,vault-agent",
		"SUPERVISOR_SIDECAR_ACTIONS=cloud-sql-proxy=SIGINT,vault-agent=http://127.0.0.1:8200/quit"),
		container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100),
		container(procscan.Sidecar, "cloud-sql-proxy", 101), container(procscan.Sidecar, "vault-agent", 102))
	go func() { p := h.proc(102); <-time.After(20 * time.Millisecond); p.exit(exited(0)) }()
	h.proc(10).exit(exited(3))
	res, err := h.wait()
	if err != nil || res.Outcome != Failure {
		t.Fatalf("res %+v err %v", res, err)
	}
	if diff := cmp.Diff([]string{"SIGKILL 100", "SIGINT 101"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"http://127.0.0.1:8200/quit"}, h.posts); diff != "" {
		t.Errorf("posts (-want +got):\n%s", diff)
	}
}

// TestSidecarComesBack: a sidecar that reappears while being stopped
// (restarted by the kubelet) is stopped too, and the log says why it may
// have come back.
func TestSidecarComesBack(t *testing.T) {
	h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
	h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
		if !h.pod.has("pilot-agent-r1") {
			h.pod.add(container(procscan.Sidecar, "pilot-agent-r1", 101))
		}
		return &exitwatch.Status{Known: true, Code: 0}
	})
	h.proc(10).exit(exited(0))
	res, err := h.wait()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100", "SIGTERM 101"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	if !strings.Contains(h.log.String(), "NATIVE_SIDECAR=true") {
		t.Errorf("no hint in the log:\n%s", h.log)
	}
	_ = res
}

func noSignalFor(t *testing.T, h *harness, d time.Duration) {
	t.Helper()
	select {
	case <-h.kernel.signaled:
		t.Fatalf("sidecar signalled too early: %v\nlog:\n%s", h.kernel.sent(), h.log)
	case <-time.After(d):
	}
}

// move replaces the container whose main process is pid by c.
func (f *fakePod) move(pid int, c procscan.Container) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.containers {
		if f.containers[i].Main.PID == pid {
			f.containers[i] = c
			return
		}
	}
	f.containers = append(f.containers, c)
}

func (f *fakePod) scanCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.scans
}

func (f *fakePod) has(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// TestRandomTimelines drives the run loop through many generated pod
// timelines (start orders, exit codes, restarts under OnFailure, late
// sidecars, deletions) and checks two invariants on each: the sidecar is
// never stopped while an app runs or is about to be restarted, and it is
// stopped within the configured bounds of the last app's end.
func TestRandomTimelines(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	const n = 150
	for i := 0; i < n; i++ {
		tl := newTimeline(rand.New(rand.NewSource(seed + int64(i))))
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			t.Parallel()
			tl.run(t)
		})
	}
}

// attempt is one run of an app container.
type attempt struct {
	after  time.Duration // after the previous attempt ended (or t0)
	runs   time.Duration
	status exitwatch.Status
	// moving is how long its main process shows in no container of its
	// own before the runtime moves it into its cgroup (issue 15): as
	// procscan reports it, Starting, or, with no pause container to
	// compare with, an App in the creator's cgroup "/".
	moving   time.Duration
	movingAs procscan.Kind
}

func (a attempt) String() string {
	s := fmt.Sprintf("{%v %v %v", a.after, a.runs, a.status)
	if a.moving > 0 {
		s += fmt.Sprintf(" moving %v as %v", a.moving, a.movingAs)
	}
	return s + "}"
}

type timeline struct {
	policy       RestartPolicy
	apps         [][]attempt // per slot
	sidecarAfter time.Duration
	deleteAt     time.Duration // 0: never
	desc         string
}

func newTimeline(r *rand.Rand) timeline {
	ms := func(max int) time.Duration { return time.Duration(r.Intn(max)) * time.Millisecond }
	tl := timeline{policy: Never}
	if r.Intn(2) == 0 {
		tl.policy = OnFailure
	}
	slots := 1 + r.Intn(3)
	for s := 0; s < slots; s++ {
		var atts []attempt
		for k := 0; ; k++ {
			st := exited(0)
			switch r.Intn(4) {
			case 0:
				st = exited(1 + r.Intn(3))
			case 1:
				st = killed(exitwatch.SIGKILL)
			}
			first := time.Duration(0)
			if k == 0 {
				first = ms(60)
			} else {
				first = 20*time.Millisecond + ms(60) // the kubelet's back-off
			}
			if tl.policy == OnFailure && k == 3 {
				st = exited(0) // the Job gives up on the pod otherwise (deletion, below)
			}
			att := attempt{after: first, runs: 20*time.Millisecond + ms(150), status: st}
			if r.Intn(3) == 0 {
				att.moving, att.movingAs = 1+ms(50), procscan.Starting
				if r.Intn(2) == 0 {
					att.movingAs = procscan.App
				}
				att.runs += att.moving
			}
			atts = append(atts, att)
			if tl.policy == Never || st.Success() {
				break
			}
		}
		tl.apps = append(tl.apps, atts)
	}
	if r.Intn(3) == 0 {
		tl.sidecarAfter = ms(400) // starts late, maybe after the apps
	}
	if r.Intn(6) == 0 {
		tl.deleteAt = ms(400)
	}
	tl.desc = fmt.Sprintf("%s apps=%v sidecarAfter=%v deleteAt=%v", tl.policy, tl.apps, tl.sidecarAfter, tl.deleteAt)
	return tl
}

func (tl timeline) run(t *testing.T) {
	env := []string{
		"SUPERVISOR_RESTART_POLICY=" + string(tl.policy), fmt.Sprintf("SUPERVISOR_APP_CONTAINERS=%d", len(tl.apps)),
		"SUPERVISOR_APP_START_TIMEOUT=1s", "SUPERVISOR_SIDECAR_START_TIMEOUT=2s", "SUPERVISOR_STOP_TIMEOUT=1s",
		"SUPERVISOR_SCAN_INTERVAL=10ms", "SUPERVISOR_DELETION_GRACE=0s", "SUPERVISOR_RESTART_TIMEOUT=1s",
	}
	if tl.policy == OnFailure {
		env = append(env, "SUPERVISOR_ON_FAILURE=SIGTERM")
	}
	cfg := testConfig(t, env...)
	pod := &fakePod{containers: []procscan.Container{container(procscan.Pause, "pause", 1), container(procscan.Self, "supervisor", 2)}}
	k := newFakeKernel()
	var mu sync.Mutex
	var lastEnd time.Time   // when the last attempt of any slot ended
	var lastStart time.Time // when the last attempt started
	var firstSignal time.Time
	k.onSignal = func(sig exitwatch.Signal) *exitwatch.Status {
		mu.Lock()
		if firstSignal.IsZero() {
			firstSignal = time.Now()
		}
		mu.Unlock()
		return &exitwatch.Status{Known: true, Signal: sig}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		pid := 10
		for s, atts := range tl.apps {
			wg.Add(1)
			base := pid
			pid += 10
			go func(s int, atts []attempt, base int) {
				defer wg.Done()
				for k2, a := range atts {
					time.Sleep(a.after)
					p := base + k2
					name := fmt.Sprintf("app%d-r%d", s, k2)
					mu.Lock()
					lastStart = time.Now()
					mu.Unlock()
					fp := k.spawn(p)
					if a.moving > 0 {
						pod.add(container(a.movingAs, "/", p))
						time.Sleep(a.moving)
						pod.move(p, container(procscan.App, name, p))
						time.Sleep(a.runs - a.moving)
					} else {
						pod.add(container(procscan.App, name, p))
						time.Sleep(a.runs)
					}
					mu.Lock()
					lastEnd = time.Now()
					mu.Unlock()
					fp.exit(a.status)
				}
			}(s, atts, base)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(tl.sidecarAfter)
			k.spawn(100)
			pod.add(container(procscan.Sidecar, "pilot-agent", 100))
		}()
		wg.Wait()
	}()
	if tl.deleteAt > 0 {
		time.AfterFunc(tl.deleteAt, cancel)
	}
	log := &syncWriter{w: &bytes.Buffer{}}
	ran := make(chan runResult, 1)
	go func() {
		res, err := New(cfg, zerolog.New(log), pod, k, func(context.Context, *url.URL, time.Duration) (int, error) { return 200, nil }).Run(ctx)
		ran <- runResult{res, err}
	}()
	var res Result
	var err error
	select {
	case r := <-ran:
		res, err = r.res, r.err
	case <-time.After(30 * time.Second):
		// Every bound of the timeline's configuration is 2 s at most.
		log.mu.Lock()
		defer log.mu.Unlock()
		t.Fatalf("%s: Run did not return within 30s; log:\n%s", tl.desc, log.w)
	}
	<-done
	if err != nil {
		t.Fatalf("%s: %v", tl.desc, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Deleted {
		return // deletion may come at any point; nothing must be signalled after it (the kubelet's job)
	}
	if firstSignal.IsZero() {
		t.Fatalf("%s: sidecar never stopped (%+v)", tl.desc, res)
	}
	// Invariant 1: not while an app runs or before its restart started.
	if firstSignal.Before(lastEnd) || firstSignal.Before(lastStart) {
		t.Errorf("%s: sidecar signalled at %v, last app start %v end %v", tl.desc,
			firstSignal.Sub(t0), lastStart.Sub(t0), lastEnd.Sub(t0))
	}
	// Invariant 2: within the bounds after the last app's end. An app that
	// was never seen (it ended before the first scan) costs the
	// APP_START_TIMEOUT; a late sidecar, the time it takes to appear.
	bound := cfg.AppStartTimeout + cfg.ScanInterval*5 + 500*time.Millisecond
	if end := lastEnd; tl.sidecarAfter > 0 && t0.Add(tl.sidecarAfter).After(end) {
		lastEnd = t0.Add(tl.sidecarAfter)
	}
	if late := firstSignal.Sub(lastEnd); late > bound {
		t.Errorf("%s: sidecar signalled %v after the last app ended, bound %v", tl.desc, late, bound)
	}
	// The outcome matches the last attempts.
	want := Success
	for _, atts := range tl.apps {
		if !atts[len(atts)-1].status.Success() && tl.policy == Never {
			want = Failure
		}
	}
	if res.Outcome != want && res.Outcome != Unknown {
		t.Errorf("%s: outcome %v, want %v", tl.desc, res.Outcome, want)
	}
}

// TestHold: the hold returns once every app has exited, or at its bound.
func TestHold(t *testing.T) {
	pod := &fakePod{containers: []procscan.Container{
		container(procscan.Pause, "pause", 1), container(procscan.Self, "istio-proxy", 2),
		container(procscan.App, "app", 10), container(procscan.App, "worker", 11),
	}}
	k := newFakeKernel()
	k.spawn(10)
	k.spawn(11)
	go func() {
		time.Sleep(30 * time.Millisecond)
		k.proc(10).exit(exited(143))
		time.Sleep(30 * time.Millisecond)
		k.proc(11).exit(exited(0))
	}()
	res, err := Hold(context.Background(), zerolog.Nop(), pod, k, 10*time.Second)
	if err != nil || res.TimedOut() || res.Apps != 2 {
		t.Fatalf("res %+v err %v", res, err)
	}
	if !strings.Contains(res.String(), "all 2 app containers have exited") {
		t.Errorf("%q", res)
	}

	k2 := newFakeKernel()
	k2.spawn(10)
	k2.spawn(11).exit(exited(0))
	res, err = Hold(context.Background(), zerolog.Nop(), pod, k2, 50*time.Millisecond)
	if err != nil || !res.TimedOut() || !cmp.Equal(res.Left, []string{"app"}) {
		t.Fatalf("res %+v err %v, want a timeout with app left", res, err)
	}
	if !strings.Contains(res.String(), "gave up") {
		t.Errorf("%q", res)
	}
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	dst, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm() != 0o755 || fi.Size() == 0 {
		t.Errorf("installed %s: %v %v", dst, fi, err)
	}
	if _, err := Install(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "emptyDir") {
		t.Errorf("install into a missing dir: %v", err)
	}
}

// TestKindIsFirstSight: a container keeps the kind it had when first seen.
// An ignored container whose main process exited and into which a process
// named pilot-agent was exec'd (PPID 0: it now looks like the main one) is
// not a sidecar to stop; nor is an app's.
func TestKindIsFirstSight(t *testing.T) {
	h := start(t, testConfig(t, "SUPERVISOR_IGNORE_PROCESSES=fluent-bit"),
		container(procscan.App, "app", 10), container(procscan.Ignored, "logs", 20),
		container(procscan.Sidecar, "pilot-agent", 100))
	h.proc(10)
	// Both containers' main processes end; an exec'd pilot-agent remains.
	h.pod.mu.Lock()
	for i, c := range h.pod.containers {
		if c.Name == "logs" || c.Name == "app" {
			impostor := container(procscan.Sidecar, c.Name, 30+i)
			impostor.ID = c.ID
			h.pod.containers[i] = impostor
		}
	}
	h.pod.mu.Unlock()
	h.proc(10).exit(exited(0))
	res, err := h.wait()
	if err != nil || res.Outcome != Success {
		t.Fatalf("res %+v err %v", res, err)
	}
	if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
		t.Errorf("signals (-want +got):\n%s\nlog:\n%s", diff, h.log)
	}
}
