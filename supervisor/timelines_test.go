package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"net/url"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// TestRandomTimelines drives the run loop through many generated pod
// timelines (start orders, exit codes, restarts under OnFailure, late
// sidecars, deletions) and checks two invariants on each: the sidecar is
// never stopped while an app runs or is about to be restarted, and it is
// stopped within the configured bounds of the last app's end. Each
// timeline runs in its own bubble (testing/synctest), in virtual time: its
// events and the run's timers come in their exact order whatever the
// machine's speed, and a timeline costs well under a millisecond of real
// time. What the clock does not order is the events of one same instant
// (a scan and an app's start): they run in whatever order the scheduler
// picks, as in a pod, so runs of one seed may differ there.
func TestRandomTimelines(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	const n = 500
	for i := 0; i < n; i++ {
		tl := newTimeline(rand.New(rand.NewSource(seed + int64(i))))
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, tl.run)
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
	case <-time.After(30 * time.Second): // the bubble's time
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
		// Deletion may come at any point; nothing must be signalled after
		// it (the kubelet's job).
		for i, sig := range k.sent() {
			if at := k.sentAt(i); at.After(t0.Add(tl.deleteAt)) {
				t.Errorf("%s: %s at %v, after the deletion", tl.desc, sig, at.Sub(t0))
			}
		}
		return
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
	// was never seen (it ended before the first scan) would cost the
	// APP_START_TIMEOUT, a restart never seen the RESTART_TIMEOUT; but on
	// the bubble's clock every attempt, of 20 ms at least, is seen: the
	// fast look (2 ms) or the scan (SCAN_INTERVAL) finds it while it runs.
	// So the sidecar is stopped at the last app's end, or, when it comes
	// later, at the first scan after it appears: one SCAN_INTERVAL at most.
	bound := cfg.ScanInterval
	if end := lastEnd; tl.sidecarAfter > 0 && t0.Add(tl.sidecarAfter).After(end) {
		lastEnd = t0.Add(tl.sidecarAfter)
	}
	if late := firstSignal.Sub(lastEnd); late > bound {
		t.Errorf("%s: sidecar signalled %v after the last app ended, bound %v", tl.desc, late, bound)
	}
	// The outcome matches the last attempts: with every attempt seen,
	// never unknown.
	want := Success
	for _, atts := range tl.apps {
		if !atts[len(atts)-1].status.Success() && tl.policy == Never {
			want = Failure
		}
	}
	if res.Outcome != want {
		t.Errorf("%s: outcome %v, want %v", tl.desc, res.Outcome, want)
	}
}
