package procscan

// Benchmarks of discovery, the only /proc reading the supervisor does
// before it blocks: Scan (read every process and group them into
// containers as they are read), against the number of processes in the pod
// and against the number of app containers; Classify alone, over
// processes already read. Each runs over a generated fixture
// tree (any size, no privileges), and the process-count one also over a
// real /proc: a new PID namespace holding N real processes (root only).
// ns/proc is ns/op over the processes read. Nothing here asserts a time.
//
//	go test -run '^$' -bench . ./procscan

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// benchRules are the supervisor's defaults.
var benchRules = Rules{Sidecar: []string{"pilot-agent"}}

// benchSelf is the supervisor's PID in generated trees.
const benchSelf = 5

// benchProc is one process of a generated tree.
type benchProc struct {
	pid, ppid int
	comm      string
	argv      []string
	cgroup    string
	start     uint64
}

// benchPodProcs lays out a pod as a Kubernetes node on cgroup v2 shows it
// from the supervisor's container: pause (1), pilot-agent (2) and envoy
// (3), the supervisor (5, "0::/"), then apps app containers whose main
// processes' children make up the rest of total.
func benchPodProcs(apps, total int) []benchProc {
	id := func(n int) string { return fmt.Sprintf("0::/../%064x", n) }
	procs := []benchProc{
		{pid: 1, comm: "pause", argv: []string{"/pause"}, cgroup: id(1)},
		{pid: 2, comm: "pilot-agent", argv: []string{"/usr/local/bin/pilot-agent", "proxy", "sidecar"}, cgroup: id(2)},
		{pid: 3, ppid: 2, comm: "envoy", argv: []string{"/usr/local/bin/envoy", "-c", "envoy.json"}, cgroup: id(2)},
		{pid: benchSelf, comm: "sidecar-supervi", argv: []string{"/sidecar-supervisor"}, cgroup: "0::/"},
	}
	pid := 10
	mains := make([]int, apps)
	for a := 0; a < apps; a++ {
		mains[a] = pid
		procs = append(procs, benchProc{pid: pid, comm: "python3", argv: []string{"python3", "/app/job.py"}, cgroup: id(100 + a)})
		pid++
	}
	for i := 0; len(procs) < total; i++ {
		a := i % apps
		procs = append(procs, benchProc{pid: pid, ppid: mains[a], comm: "worker", argv: []string{"python3", "-c", "work"}, cgroup: id(100 + a)})
		pid++
	}
	for i := range procs {
		procs[i].start = uint64(100 + procs[i].pid)
	}
	return procs
}

// benchStat is /proc/PID/stat in the kernel's format (fs/proc/array.c):
// 52 fields, the comm in parentheses; those procscan does not read are
// plausible constants.
func benchStat(p benchProc) string {
	f := make([]string, 52)
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[2], f[3] = strconv.Itoa(p.pid), "("+p.comm+")", "S", strconv.Itoa(p.ppid)
	f[4], f[5], f[7], f[8] = strconv.Itoa(p.pid), strconv.Itoa(p.pid), "-1", "4194560"
	f[17], f[19], f[21], f[22], f[23] = "20", "1", strconv.FormatUint(p.start, 10), "1245184", "300"
	f[24], f[37] = "18446744073709551615", "17"
	return strings.Join(f, " ") + "\n"
}

// benchTree writes procs as a fake /proc under a temporary directory.
func benchTree(b *testing.B, procs []benchProc) string {
	b.Helper()
	root := b.TempDir()
	for _, p := range procs {
		d := filepath.Join(root, strconv.Itoa(p.pid))
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
		files := map[string]string{
			"stat":    benchStat(p),
			"cmdline": strings.Join(p.argv, "\x00") + "\x00",
			"cgroup":  p.cgroup + "\n",
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(d, name), []byte(content), 0o444); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := os.Symlink(strconv.Itoa(benchSelf), filepath.Join(root, "self")); err != nil {
		b.Fatal(err)
	}
	return root
}

// benchScan runs Scan over root in a loop, as the supervisor does, and
// reports ns/proc and the allocations; want is how many processes each
// scan must count.
func benchScan(b *testing.B, root string, self, want int) {
	s, err := NewScanner(root)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var pod Pod
	for b.Loop() {
		pod, err = s.Scan(self, benchRules)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, c := range pod.Containers {
			n += c.Count
		}
		if n != want {
			b.Fatalf("%d processes read, want %d", n, want)
		}
	}
	if len(pod.Containers) == 0 {
		b.Fatal("no containers")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(want), "ns/proc")
}

// BenchmarkScanFixture: discovery over generated trees, by processes in
// the pod (one app container holds all but the pod's four) and by app
// containers (each a main process and one child).
func BenchmarkScanFixture(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("procs=%d", n), func(b *testing.B) {
			benchScan(b, benchTree(b, benchPodProcs(1, n)), benchSelf, n)
		})
	}
	for _, apps := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("apps=%d", apps), func(b *testing.B) {
			n := 4 + 2*apps
			benchScan(b, benchTree(b, benchPodProcs(apps, n)), benchSelf, n)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(apps), "ns/app")
		})
	}
}

// BenchmarkClassify: the grouping alone, over processes already read:
// what is left of discovery once /proc has been read.
func BenchmarkClassify(b *testing.B) {
	for _, c := range []struct{ apps, procs int }{{1, 10000}, {50, 104}} {
		b.Run(fmt.Sprintf("apps=%d/procs=%d", c.apps, c.procs), func(b *testing.B) {
			s, err := NewScanner(benchTree(b, benchPodProcs(c.apps, c.procs)))
			if err != nil {
				b.Fatal(err)
			}
			procs, err := s.Processes()
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				Classify(procs, benchSelf, benchRules)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(procs)), "ns/proc")
		})
	}
}
