package procscan

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Scans at the scale of a busy pod, generated and real.

// TestManyProcesses classifies a pod of 10,000 processes (a generated
// tree): the app's 9,990 children include 1,000 named pilot-agent, 100
// exec'd pilot-agents (PPID 0, younger) and 500 zombies whose v1 lines read
// "/". One sidecar, one app with its real main process, everyone placed.
func TestManyProcesses(t *testing.T) {
	hy := func(id string) string { return "4:memory:/kubepods/" + id + "\n0::/kubepods/" + id + "\n" }
	const self, total = 6, 10000
	files := []procFiles{
		fakeProc{pid: 1, comm: "pause", start: 1, cgroup: hy("pause"), argv: []string{"/pause"}}.files(),
		fakeProc{pid: 2, comm: "pilot-agent", start: 2, cgroup: hy("proxy"), argv: []string{"/usr/local/bin/pilot-agent"}}.files(),
		fakeProc{pid: 3, ppid: 2, comm: "envoy", start: 3, cgroup: hy("proxy"), argv: []string{"envoy"}}.files(),
		fakeProc{pid: 4, comm: "job", start: 4, cgroup: hy("app"), argv: []string{"/job"}}.files(),
		fakeProc{pid: self, comm: "sidecar-supervi", start: 6, cgroup: hy("self"), argv: []string{"/sidecar-supervisor"}}.files(),
	}
	decoys, zombies := 0, 0
	for pid := 10; len(files) < total; pid++ {
		p := fakeProc{pid: pid, ppid: 4, comm: "worker", start: uint64(pid), cgroup: hy("app"), argv: []string{"/worker", "--n", strconv.Itoa(pid)}}
		switch {
		case pid%10 == 0:
			p.comm, p.argv = "pilot-agent", []string{"pilot-agent"}
			decoys++
			if pid%100 == 0 {
				p.ppid = 0 // exec'd
			}
		case pid%20 == 5:
			p.state, p.flags, p.argv = "Z", pfExiting, nil
			p.cgroup = "4:memory:/\n0::/kubepods/app\n"
			zombies++
		}
		files = append(files, p.files())
	}
	s := newScanner(t, writeTree(t, "", self, files...))
	pod, procs, _ := scanKept(t, s, self, Rules{Sidecar: []string{"pilot-agent"}})
	if len(procs) != total {
		t.Fatalf("read %d processes, want %d", len(procs), total)
	}
	var got []string
	for _, c := range pod.Containers {
		got = append(got, fmt.Sprintf("%s %s main=%d n=%d stray=%d", c.Kind, c.Name, c.Main.PID, c.Count, len(c.Stray)))
	}
	want := []string{"pause pause main=1 n=1 stray=0", "sidecar proxy main=2 n=2 stray=0",
		fmt.Sprintf("app app main=4 n=%d stray=%d", total-4, decoys), "self self main=6 n=1 stray=0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	if zombies < 400 || decoys < 900 {
		t.Fatalf("generated %d zombies and %d decoys", zombies, decoys)
	}
}

// TestRealChurn scans this machine's /proc again and again while
// thousands of short-lived processes come and go: processes vanish
// between the listing and their files (ENOENT, ESRCH), zombies show "/"
// for their v1 lines on a hybrid host. No scan may fail, and no scan may
// hold a phantom container (one made only of exiting non-main processes).
func TestRealChurn(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("no sh: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var churners []*exec.Cmd
	for i := 0; i < 2; i++ {
		c := exec.CommandContext(ctx, sh, "-c", "while :; do /bin/true; /bin/true & wait; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		churners = append(churners, c)
	}
	t.Cleanup(func() {
		cancel()
		for _, c := range churners {
			c.Wait()
		}
	})
	s := newScanner(t, "/proc")
	self, err := s.Self()
	if err != nil {
		t.Fatal(err)
	}
	rules := Rules{Sidecar: []string{"pilot-agent"}}
	churnPIDs := map[int]bool{}
	for _, c := range churners {
		churnPIDs[c.Process.Pid] = true
	}
	scans, exiting, kids := 0, 0, 0
	// At least 3 s and 20 scans; longer (up to 30 s) until a scan has caught
	// a churned child alive, which takes longer on a slow machine (or under
	// -race) since each lives about a millisecond.
	least, most := time.Now().Add(3*time.Second), time.Now().Add(30*time.Second)
	for time.Now().Before(most) && (time.Now().Before(least) || scans < 20 || kids == 0) {
		// The supervisor's scan first: no error, one process kept per
		// container, never a phantom (a container of exiting non-main
		// processes only: then the one kept, its oldest, would be one).
		scanned, err := s.Scan(self, rules)
		if err != nil {
			t.Fatalf("scan %d: %v", scans, err)
		}
		for _, c := range scanned.Containers {
			if len(c.Processes) != 1 || c.Count < 1 || (c.Processes[0].Exiting && c.Processes[0].PPID != 0 && c.Count == 1) {
				t.Fatalf("scan %d: container %+v", scans, c)
			}
		}
		procs, err := s.Processes()
		if err != nil {
			t.Fatalf("scan %d: %v", scans, err)
		}
		for _, p := range procs {
			if p.Exiting {
				exiting++
			}
		}
		pod := Classify(procs, self, rules)
		checkPod(t, procs, self, rules, pod)
		_, members := classifyKept(procs, self, rules)
		// The churners' children are in this test's container while they
		// live. Once exiting, their v1 lines read "/", which on this host
		// is also the content of PID 1's cgroup: placed there is right,
		// but a process read as alive with that content is not (a scan
		// reads a process's files one after the other, and it may begin
		// to exit in between).
		for _, c := range pod.Containers {
			for _, p := range members[c.ID] {
				if churnPIDs[p.PPID] {
					kids++
					if c.Kind != Self && !p.Exiting {
						t.Fatalf("scan %d: live churned pid %d (%+v) in %s container %q, not this test's", scans, p.PID, p, c.Kind, c.ID)
					}
				}
			}
		}
		scans++
	}
	if kids == 0 {
		t.Fatal("no scan saw a churned process")
	}
	t.Logf("%d scans saw %d churned processes, %d exiting processes", scans, kids, exiting)
}
