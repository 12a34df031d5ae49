package procscan

import (
	"fmt"
	"testing"
)

// TestScanAllocations: on Linux a scan allocates nothing for a process it
// does not keep, so what it allocates does not grow with the pod's
// processes: a few per container and per scan (its buffers, the pod it
// returns). This is what keeps the supervisor's memory flat from 1,000
// to 100,000 processes (BENCHMARKS.md, section 5).
func TestScanAllocations(t *testing.T) {
	allocs := func(total int) float64 {
		procs := benchPodProcs(3, total)
		var files []procFiles
		for _, p := range procs {
			files = append(files, fakeProc{pid: p.pid, ppid: p.ppid, comm: p.comm, argv: p.argv, cgroup: p.cgroup + "\n", start: p.start}.files())
		}
		s := newScanner(t, writeTree(t, "", benchSelf, files...))
		return testing.AllocsPerRun(5, func() {
			pod, err := s.Scan(benchSelf, benchRules)
			if err != nil || len(pod.Containers) != 6 {
				panic(fmt.Sprintf("scan of %d processes: %d containers, %v", total, len(pod.Containers), err))
			}
		})
	}
	small, large := allocs(100), allocs(3000)
	t.Logf("allocations per scan: %.0f at 100 processes, %.0f at 3,000", small, large)
	if large > small+10 {
		t.Errorf("a scan of 3,000 processes allocates %.0f times, of 100 %.0f: it allocates per process", large, small)
	}
}
