package procscan

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// classifyKept is Classify keeping every process where it was placed: the
// pod, and each container's processes by PID, keyed by its ID.
func classifyKept(procs []Process, self int, rules Rules) (Pod, map[string][]Process) {
	b := newBuilder(self, rules)
	b.keep = true
	for _, p := range procs {
		b.add(p)
	}
	pod := b.pod()
	members := map[string][]Process{}
	for id, g := range b.live {
		ps := slices.Clone(g.all)
		slices.SortFunc(ps, func(a, b Process) int { return a.PID - b.PID })
		members[id] = ps
	}
	return pod, members
}

// scanKept scans s as the supervisor does (Scan), checks that it gives
// what Classify gives over Processes, and returns the pod with where
// each process went (classifyKept).
func scanKept(t *testing.T, s *Scanner, self int, rules Rules) (Pod, []Process, map[string][]Process) {
	t.Helper()
	procs, err := s.Processes()
	if err != nil {
		t.Fatal(err)
	}
	pod, err := s.Scan(self, rules)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Classify(procs, self, rules), pod); diff != "" {
		t.Fatalf("Scan differs from Classify(Processes()) (-classify +scan):\n%s", diff)
	}
	checkPod(t, procs, self, rules, pod)
	_, members := classifyKept(procs, self, rules)
	return pod, procs, members
}

// TestScanKeepsOne: a scan of a pod of 10,000 processes keeps one process
// per container, and counts the rest.
func TestScanKeepsOne(t *testing.T) {
	procs := benchPodProcs(3, 10000)
	var files []procFiles
	for _, p := range procs {
		files = append(files, fakeProc{pid: p.pid, ppid: p.ppid, comm: p.comm, argv: p.argv, cgroup: p.cgroup + "\n", start: uint64(100 + p.pid)}.files())
	}
	s := newScanner(t, writeTree(t, "", benchSelf, files...))
	pod, _, _ := scanKept(t, s, benchSelf, benchRules)
	var got []string
	total := 0
	for _, c := range pod.Containers {
		got = append(got, fmt.Sprintf("%s main=%d count=%d kept=%d", c.Kind, c.Main.PID, c.Count, len(c.Processes)))
		total += c.Count
	}
	// The app containers' children go round-robin: 9,993 children of 3.
	want := []string{"pause main=1 count=1 kept=1", "sidecar main=2 count=2 kept=1", "self main=5 count=1 kept=1",
		"app main=10 count=3332 kept=1", "app main=11 count=3332 kept=1", "app main=12 count=3332 kept=1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	if total != 10000 {
		t.Errorf("counts add up to %d, want 10000", total)
	}
}
