package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// A timeline is its seed and index: the same pair draws the same Job, and
// the next seed another. Every timeline is one the cluster can carry out
// as the oracle says: the backoffLimit leaves room for what must succeed,
// the pods are few, and the mix covers every kind of Job.
func TestGenerate(t *testing.T) {
	kinds := map[string]int{}
	differ := 0
	for seed := uint64(0); seed < 20; seed++ {
		for i := 0; i < 200; i++ {
			tl := generate(seed, i)
			if again := generate(seed, i); again.String() != tl.String() {
				t.Fatalf("timeline %d drawn twice:\n%s\n%s", i, tl, again)
			}
			if generate(seed+1, i).String() != tl.String() {
				differ++
			}
			o := tl.want
			if len(o.pods) == 0 || len(o.pods) > 4 {
				t.Fatalf("%s: %d pods", tl, len(o.pods))
			}
			for _, a := range tl.apps {
				if len(a.steps) == 0 {
					t.Fatalf("%s: %s has no step", tl, a.name)
				}
			}
			restarts := restartsIn(tl)
			if tl.restart == corev1.RestartPolicyOnFailure && o.cond == batchv1.JobComplete &&
				!(restarts < int(tl.backoffLimit) || (restarts == 0 && tl.backoffLimit == 0)) {
				t.Fatalf("%s: %d restarts reach backoffLimit %d", tl, restarts, tl.backoffLimit)
			}
			if tl.deadline > 0 && !tl.deadlineHit && tl.deadline < 600 {
				t.Fatalf("%s: a deadline not to be reached is near", tl)
			}
			if tl.deletePod > 0 || tl.deadlineHit {
				for _, a := range tl.apps {
					if a.steps[0].d < 60*time.Second {
						t.Fatalf("%s: %s's first run may end before the pod is deleted", tl, a.name)
					}
				}
			}
			switch {
			case tl.deletePod > 0:
				kinds["deleted"]++
			case tl.deadlineHit:
				kinds["deadline"]++
			default:
				kinds[string(tl.restart)+" "+string(o.cond)+" "+o.reason]++
			}
			if tl.none {
				kinds["none"]++
			}
			if restarts > 0 {
				kinds["restarts"]++
			}
			if k := tl.kill; k != nil {
				checkKillPlan(t, tl)
				kinds[fmt.Sprintf("kill %s %s %d", tl.restart, tl.shape(), k.moment)]++
			}
		}
	}
	for _, policy := range []string{"Never native", "OnFailure native", "OnFailure container"} {
		for m := killRun; m <= killStop; m++ {
			if k := fmt.Sprintf("kill %s %d", policy, m); kinds[k] < 20 {
				t.Errorf("only %d timelines of kind %q in 4000: %v", kinds[k], k, kinds)
			}
		}
	}
	if differ < 3600 {
		t.Errorf("seeds and the next drew %d different timelines out of 4000", differ)
	}
	for _, k := range []string{"deleted", "deadline", "none", "restarts",
		"Never Complete ", "Never Failed BackoffLimitExceeded", "OnFailure Complete ", "OnFailure Failed BackoffLimitExceeded"} {
		if kinds[k] < 100 {
			t.Errorf("only %d timelines of kind %q in 4000: %v", kinds[k], k, kinds)
		}
	}
}

// checkKillPlan: a kill is drawn for a pod that runs to its end, at an
// instance it runs; under Never the supervisor is native (the only shape
// restarted there), and under OnFailure the backoffLimit leaves room for
// the supervisor's restart beside the apps'.
func checkKillPlan(t *testing.T, tl timeline) {
	t.Helper()
	k := tl.kill
	if tl.deletePod > 0 || tl.deadlineHit || k.pod >= len(tl.want.pods) || tl.want.pods[k.pod].deleted {
		t.Fatalf("%s: the kill's pod is deleted or not there", tl)
	}
	w := tl.want.pods[k.pod]
	if k.n < w.first[k.app] || k.n > w.last[k.app] {
		t.Fatalf("%s: %s #%d does not run in pod %d", tl, k.app, k.n, k.pod+1)
	}
	switch tl.restart {
	case corev1.RestartPolicyNever:
		if !tl.native {
			t.Fatalf("%s: a container supervisor killed under Never is never restarted", tl)
		}
	case corev1.RestartPolicyOnFailure:
		if tl.want.cond != batchv1.JobComplete || restartsIn(tl)+1 >= int(tl.backoffLimit) {
			t.Fatalf("%s: no room in backoffLimit for the supervisor's restart", tl)
		}
	}
}

// The oracle on timelines written by hand.
func TestOracle(t *testing.T) {
	app := func(name string, steps ...step) appPlan { return appPlan{name: name, steps: steps} }
	s := func(code int) step { return step{time.Second, code} }
	for _, tc := range []struct {
		name string
		tl   timeline
		cond batchv1.JobConditionType
		pods int
	}{
		{"Never fails then succeeds", timeline{restart: corev1.RestartPolicyNever, backoffLimit: 1,
			apps: []appPlan{app("a", s(1), s(0)), app("b", s(0))}}, batchv1.JobComplete, 2},
		{"Never fails past backoffLimit", timeline{restart: corev1.RestartPolicyNever, backoffLimit: 1,
			apps: []appPlan{app("a", s(1), s(2), s(0))}}, batchv1.JobFailed, 2},
		{"OnFailure restarts", timeline{restart: corev1.RestartPolicyOnFailure, backoffLimit: 3,
			apps: []appPlan{app("a", s(1), s(2), s(0))}}, batchv1.JobComplete, 1},
		{"OnFailure forever", timeline{restart: corev1.RestartPolicyOnFailure, backoffLimit: 2,
			apps: []appPlan{app("a", s(0)), app("b", s(3))}}, batchv1.JobFailed, 1},
		{"deleted then succeeds", timeline{restart: corev1.RestartPolicyNever, backoffLimit: 1, deletePod: 1,
			apps: []appPlan{app("a", step{time.Minute, 0}, s(0))}}, batchv1.JobComplete, 2},
		{"deleted past backoffLimit", timeline{restart: corev1.RestartPolicyNever, backoffLimit: 0, deletePod: 1,
			apps: []appPlan{app("a", step{time.Minute, 0}, s(0))}}, batchv1.JobFailed, 1},
	} {
		o := tc.tl.oracle()
		if o.cond != tc.cond || len(o.pods) != tc.pods {
			t.Errorf("%s: %s with %d pods, want %s with %d", tc.name, o.cond, len(o.pods), tc.cond, tc.pods)
		}
	}
	tl := timeline{restart: corev1.RestartPolicyOnFailure, backoffLimit: 3, apps: []appPlan{app("a", s(1), s(2), s(0))}}
	if p := tl.oracle().pods[0]; p.first["a"] != 1 || p.last["a"] != 3 || p.restarts["a"] != 2 {
		t.Errorf("OnFailure pod: %+v, want instances 1 to 3, 2 restarts", p)
	}
}

// The app's script, run by busybox on this host: it counts its instances,
// stamps them, runs its plan's steps in turn and keeps the last.
func TestAppScript(t *testing.T) {
	sh, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox is not installed here (Debian: busybox-static); the pods run it")
	}
	dir := t.TempDir()
	script := strings.ReplaceAll(appScript, stateMount+"/", dir+"/")
	a := appPlan{name: "app1", steps: []step{{20 * time.Millisecond, 3}, {0, 0}, {150 * time.Millisecond, 42}}}
	for i, want := range []int{3, 0, 42, 42} {
		cmd := exec.Command(sh, "sh", "-c", script)
		cmd.Env = []string{"APP=app1", "PLAN=" + a.plan(), "POD_NAME=pod-" + string(rune('a'+i))}
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != want {
			t.Errorf("instance %d exited %d, want %d", i+1, code, want)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "app1.times"))
	if err != nil {
		t.Fatal(err)
	}
	list, err := parseStamps("app1", string(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 4 {
		t.Fatalf("%d instances stamped, want 4:\n%s", len(list), raw)
	}
	for i, in := range list {
		if in.n != i+1 || in.pod != "pod-"+string(rune('a'+i)) || in.code != a.at(i+1).code {
			t.Errorf("instance %d: %s", i+1, in)
		}
		took := in.end.Sub(in.start)
		if d := a.at(i + 1).d; took < d || took > d+30*time.Second {
			t.Errorf("%s: ran %s, want %s", in, took, d)
		}
		if time.Since(in.start) > time.Minute || time.Since(in.start) < 0 {
			t.Errorf("%s: stamped %s, not now", in, in.start)
		}
	}
}
