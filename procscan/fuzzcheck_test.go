package procscan

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// What FuzzClassify checks: its input decoding and the oracle.

func decodeProcs(data []byte) []Process {
	var out []Process
	seen := map[int]bool{}
	for len(data) >= 8 {
		b := data[:8]
		data = data[8:]
		pid := int(b[0]) + 1
		if seen[pid] {
			continue
		}
		seen[pid] = true
		p := Process{PID: pid, StartTime: uint64(binary.LittleEndian.Uint16(b[2:4]) & 0x3ff),
			Cgroup: fuzzCgroups[int(b[3])%len(fuzzCgroups)], State: "S"}
		if b[1] != 0 {
			p.PPID = int(b[1])
		}
		p.Comm = fuzzNames[int(b[4])%len(fuzzNames)]
		if b[5]&1 != 0 {
			p.State = "Z"
			p.Exiting = true
		}
		switch b[6] % 3 {
		case 1:
			p.Argv0 = "/bin/" + fuzzNames[int(b[7])%len(fuzzNames)]
		case 2:
			p.Argv0 = fuzzNames[int(b[7])%len(fuzzNames)] + "/"
		}
		out = append(out, p)
	}
	return out
}

// checkPod asserts the classification rules for pod = Classify(procs,
// self, rules): it classifies procs again keeping every process where it
// was placed (classifyKept), checks that keeping them changed nothing, then
// checks the partition by the rules, and pod's containers against it: their
// Count, the process each keeps (its oldest, as read), its main one, kind
// and strays (exactly its processes named like a sidecar, unless it is a
// sidecar or the supervisor).
func checkPod(t *testing.T, procs []Process, self int, rules Rules, pod Pod) {
	t.Helper()
	kept, members := classifyKept(procs, self, rules)
	if diff := cmp.Diff(pod, kept); diff != "" {
		t.Fatalf("keeping every process changed the pod (-pod +kept):\n%s", diff)
	}
	orig := map[int]Process{}
	liveIDs := map[string]bool{}
	exitingMains := map[string]bool{} // contents of exiting PPID-0 processes
	for _, p := range procs {
		orig[p.PID] = p
		if !p.Exiting {
			liveIDs[p.Cgroup] = true
		} else if p.PPID == 0 {
			exitingMains[p.Cgroup] = true
		}
	}
	// The unified lines that name exactly one live container.
	unique := map[string]int{}
	for id := range liveIDs {
		if u, ok := unifiedLine(id); ok {
			unique[u]++
		}
	}
	// The pause container, the reference for Settled.
	pauseCgroup := ""
	for _, c := range pod.Containers {
		if slices.ContainsFunc(members[c.ID], func(p Process) bool { return p.PID == 1 && p.PID != self }) {
			pauseCgroup = c.ID
		}
	}
	if len(members) != len(pod.Containers) {
		t.Fatalf("%d groups of processes, %d containers", len(members), len(pod.Containers))
	}
	where := map[int]int{} // pid -> container index
	ids := map[string]bool{}
	prevFirst := 0
	for i, c := range pod.Containers {
		if ids[c.ID] {
			t.Fatalf("two containers with ID %q", c.ID)
		}
		ids[c.ID] = true
		ps := members[c.ID]
		if len(ps) == 0 {
			t.Fatalf("container %q has no process", c.ID)
		}
		if c.Count != len(ps) {
			t.Fatalf("container %q: Count %d, %d processes placed in it", c.ID, c.Count, len(ps))
		}
		oldest := ps[0]
		for j, p := range ps {
			if _, dup := where[p.PID]; dup {
				t.Fatalf("pid %d in two containers", p.PID)
			}
			where[p.PID] = i
			if j > 0 && ps[j-1].PID >= p.PID {
				t.Fatalf("container %q: processes not in PID order", c.ID)
			}
			if p.Cgroup != c.ID {
				t.Fatalf("pid %d has cgroup %q in container %q", p.PID, p.Cgroup, c.ID)
			}
			o := orig[p.PID]
			switch {
			case o.Cgroup == c.ID:
			case !o.Exiting:
				t.Fatalf("live pid %d (cgroup %q) in container %q", p.PID, o.Cgroup, c.ID)
			default:
				// Placed by its unified line: the only live container with it.
				u, ok := unifiedLine(o.Cgroup)
				cu, _ := unifiedLine(c.ID)
				if !ok || u != cu || !liveIDs[c.ID] || unique[u] != 1 || liveIDs[o.Cgroup] {
					t.Fatalf("exiting pid %d (cgroup %q) placed in container %q", p.PID, o.Cgroup, c.ID)
				}
			}
			if older(p, oldest) {
				oldest = p
			}
		}
		// A container made of exiting processes only, none of them with
		// PPID 0, is a phantom: on a v1 or hybrid host every process that
		// is exiting shows "/" for its v1 lines, so its cgroup content is
		// no container's (the supervisor would take it for a new app
		// container).
		if !slices.ContainsFunc(ps, func(p Process) bool { return !p.Exiting || p.PPID == 0 }) {
			t.Fatalf("container %q holds only exiting non-main processes %+v: a phantom", c.ID, ps)
		}
		// The process kept is the oldest, as read but for its Cgroup.
		want := orig[oldest.PID]
		want.Cgroup = c.ID
		if diff := cmp.Diff([]Process{want}, c.Processes); diff != "" {
			t.Fatalf("container %q: the process kept is not its oldest (-want +got):\n%s", c.ID, diff)
		}
		// The main process is the oldest, if its parent is outside the pod
		// (the order itself is older's, tested in TestOlder).
		if c.HasMain != (oldest.PPID == 0) || (c.HasMain && c.Main != want) {
			t.Fatalf("container %q: HasMain %v, main %+v; its oldest process is %+v", c.ID, c.HasMain, c.Main, oldest)
		}
		hasSelf := slices.ContainsFunc(ps, func(p Process) bool { return p.PID == self })
		hasOne := slices.ContainsFunc(ps, func(p Process) bool { return p.PID == 1 })
		var kind Kind
		switch {
		case hasSelf:
			kind = Self
		case hasOne:
			kind = Pause
		case c.HasMain && !settledOracle(c.ID, pauseCgroup, c.Main.Exiting):
			kind = Starting
		case c.HasMain && c.Main.Matches(rules.Sidecar):
			kind = Sidecar
		case c.HasMain && c.Main.Matches(rules.Ignore):
			kind = Ignored
		case c.HasMain && runtimeInit(c.Main):
			kind = Starting
		default:
			kind = App
		}
		if c.Kind != kind {
			t.Fatalf("container %q is %s, want %s (main %+v)", c.ID, c.Kind, kind, c.Main)
		}
		var stray []Process
		for _, p := range ps {
			if kind != Sidecar && kind != Self && p.Matches(rules.Sidecar) {
				stray = append(stray, p)
			}
		}
		if diff := cmp.Diff(stray, c.Stray); diff != "" {
			t.Fatalf("%s container %q: strays (-want +got):\n%s", c.Kind, c.ID, diff)
		}
		// Ordered by main process, else by lowest PID.
		first := ps[0].PID
		if c.HasMain {
			first = c.Main.PID
		}
		if i > 0 && prevFirst > first {
			t.Fatalf("containers out of order at %d", i)
		}
		prevFirst = first
	}
	// Every live process is placed, and every exiting main process; an
	// exiting process that is no container's main is left out only when
	// no live container shares its content or its unified line, and no
	// exiting main process its content.
	for _, p := range procs {
		if _, ok := where[p.PID]; ok {
			continue
		}
		u, _ := unifiedLine(p.Cgroup)
		if !p.Exiting || p.PPID == 0 || liveIDs[p.Cgroup] || unique[u] == 1 || exitingMains[p.Cgroup] {
			t.Fatalf("pid %d (%+v) is in no container", p.PID, p)
		}
	}
}
