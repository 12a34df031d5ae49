package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// table is the report's one table: a row per figure, a column per method.
type table struct {
	rows [][]string
}

const dash = "—"

func (t *table) section(title string) {
	row := []string{"**" + title + "**"}
	for range methods {
		row = append(row, "")
	}
	t.rows = append(t.rows, row)
}

// add adds a figure; methods without a cell get a dash.
func (t *table) add(figure string, cells map[method]string) {
	row := []string{figure}
	for _, m := range methods {
		c, ok := cells[m]
		if !ok || c == "" {
			c = dash
		}
		row = append(row, c)
	}
	t.rows = append(t.rows, row)
}

func (t *table) write(w io.Writer) {
	head := []string{"figure"}
	for _, m := range methods {
		head = append(head, m.title())
	}
	measure.Table(w, "", head, t.rows...)
}

// supervisorCells puts s under pidfd, and says the ptrace supervisor is
// the same there.
func supervisorCells(s, same string) map[method]string {
	return map[method]string{pidfd: s, ptrace: same}
}

func report(w io.Writer, r *results) error {
	m := r.machine
	fmt.Fprintf(w, "# Benchmarks\n\n")
	fmt.Fprintf(w, "Measured in one run of `sudo e2e/bench.sh` on %s, in %s.\n\n", r.started.Format("2006-01-02 15:04 UTC"), r.took.Round(time.Second))
	fmt.Fprintf(w, "- Machine: %s, %d CPUs, %.1f GiB; %s; Linux %s; %s\n", m.cpu, m.cpus, m.memGB, m.os, m.kernel, m.goVersion)
	fmt.Fprintf(w, "- Code: commit %s\n", m.commit)
	if r.waited != "" {
		fmt.Fprintf(w, "- Before starting: %s\n", r.waited)
	}
	fmt.Fprintf(w, "- Load average (1, 5, 15 min) at each part's start and at the end: %s. (The last parts fork and kill thousands of processes of their own, which the load average counts for minutes.)\n", strings.Join(r.loads, "; "))
	fmt.Fprintf(w, "\n")

	var t table
	if r.latency != nil {
		latencyRows(&t, r)
	}
	footprintRows(&t, r)
	if r.scale != nil || r.gobench != nil {
		scaleRows(&t, r)
	}
	if r.signals != nil {
		signalRows(&t, r)
	}
	if r.memory != nil {
		memoryRows(&t, r)
	}
	t.write(w)
	fmt.Fprintln(w)
	writeMethod(w, r)
	if r.gobenchRaw != "" {
		fmt.Fprintf(w, "\n<details><summary>The product's benchmarks as <code>go test -bench</code> printed them</summary>\n\n```\n%s\n```\n</details>\n", rawBenchLines(r.gobenchRaw))
	}
	if len(r.errs) > 0 {
		fmt.Fprintf(w, "\nErrors:\n\n")
		for _, e := range r.errs {
			fmt.Fprintf(w, "- %s\n", e)
		}
	}
	return nil
}

func withFailures(cell string, s *stopLatency) string {
	if s.failed > 0 {
		cell += fmt.Sprintf(" — %d run(s) failed", s.failed)
	}
	return cell
}

func latencyRows(t *table, r *results) {
	t.section("1. Exit-to-stop latency, ms: p50 / p99 (min, max; runs)")
	fromReap, fromExit := map[method]string{}, map[method]string{}
	for _, m := range methods {
		s := r.latency[m]
		if m == seed {
			fromReap[m] = "n/a (the wrapper's shell reaps the app)"
		} else {
			fromReap[m] = withFailures(latencyCell(s.fromReap), s)
		}
		fromExit[m] = withFailures(latencyCell(s.fromExit), s)
	}
	t.add("from the app's reap (the pod's wait for it returned) to pilot-agent's receipt of SIGTERM", fromReap)
	t.add("from the app's exit (its last clock reading before exit_group) to pilot-agent's receipt of SIGTERM", fromExit)
}

func footprintRows(t *table, r *results) {
	t.section("2. Footprint")
	t.add("binary (`CGO_ENABLED=0 go build -trimpath -ldflags='-s -w'`, as the Dockerfile)", map[method]string{
		seed:     "none of its own: `sh` and `pkill` must be in the app's image",
		poll1s:   r.pollBinary.String(),
		poll50ms: r.pollBinary.String(),
		pidfd:    r.supBinary.String(),
		ptrace:   r.supBinary.String(),
	})
	if r.image != nil {
		im := r.image
		t.add("image (build-image.sh's OCI archive)", supervisorCells(fmt.Sprintf("archive %s; %d layer(s): %s compressed, %s unpacked",
			bytesMB(im.archive), im.layers, bytesMB(im.compressed), bytesMB(im.unpacked)), "the same image"))
	}
	if r.footprint == nil {
		return
	}
	mem, cpu, wake, sleeps := map[method]string{}, map[method]string{}, map[method]string{}, map[method]string{}
	var window time.Duration
	for _, m := range methods {
		c, ok := r.footprint[m]
		if !ok {
			continue
		}
		if c.err != nil {
			mem[m] = "failed: " + oneLine(c.err)
			continue
		}
		window = c.window
		mem[m] = fmt.Sprintf("%s / %s MiB", sig3(float64(c.mem.rssKB)/1024), sig3(float64(c.mem.hwmKB)/1024))
		cpu[m] = fmt.Sprintf("%s ms", sig3(c.perMinute(c.use.cpuNS)/1e6))
		wake[m] = count(c.perMinute(c.use.switches))
		sleeps[m] = fmt.Sprintf("%d: %s", c.threads, c.sleeps)
	}
	t.add("memory while watching a running app: VmRSS / VmHWM", mem)
	t.add(fmt.Sprintf("CPU time per minute while idle (over %s)", window.Round(time.Second)), cpu)
	t.add("wake-ups per minute while idle: context switches, all threads", wake)
	t.add("threads, and where in the kernel they sleep at the window's end (wchan)", sleeps)
}

// gb formats one benchmark's metric, or "?".
func (r *results) gb(name, unit string, scale float64) string {
	b, ok := r.gobench[name]
	if !ok {
		return "?"
	}
	v, ok := b.metrics[unit]
	if !ok {
		return "?"
	}
	return sig3(v / scale)
}

func scaleRows(t *table, r *results) {
	t.section("3. Scale: discovery (reading /proc and grouping it into containers)")
	if r.gobench != nil {
		per := func(prefix string, keys []string, perUnit string) string {
			var ops, each []string
			for _, k := range keys {
				ops = append(ops, r.gb(prefix+k, "ns/op", 1e6))
				each = append(each, r.gb(prefix+k, perUnit, 1e3))
			}
			return fmt.Sprintf("%s ms per scan; %s µs per %s", strings.Join(ops, " / "), strings.Join(each, " / "), strings.TrimPrefix(perUnit, "ns/"))
		}
		procs := []string{"procs=10", "procs=1000", "procs=10000"}
		t.add("scan of a generated /proc tree (testing.B), 10 / 1,000 / 10,000 processes", supervisorCells(per("BenchmarkScanFixture/", procs, "ns/proc"), "the same scan"))
		t.add("scan of a real /proc (testing.B; a PID namespace holding exactly N real processes), 10 / 1,000 / 10,000", supervisorCells(per("BenchmarkScanProc/", procs, "ns/proc"), "the same scan"))
		t.add("scan of a generated tree, 1 / 10 / 50 app containers (2 processes each)", supervisorCells(per("BenchmarkScanFixture/", []string{"apps=1", "apps=10", "apps=50"}, "ns/app"), "the same scan"))
		t.add("of which grouping alone (Classify), 10,000 processes; 50 apps (104 processes)", supervisorCells(fmt.Sprintf("%s; %s µs per process",
			r.gb("BenchmarkClassify/apps=1/procs=10000", "ns/proc", 1e3), r.gb("BenchmarkClassify/apps=50/procs=104", "ns/proc", 1e3)), "the same"))
		t.add("holding one app: pidfd_open, start-time check, epoll_ctl (testing.B)", map[method]string{pidfd: r.gb("BenchmarkPidfdOpen", "ns/op", 1e3) + " µs"})
		t.add("an exit seen in-process (testing.B): parent's wait returned → status read; SIGKILL → status read", map[method]string{pidfd: fmt.Sprintf("%s µs; %s µs",
			r.gb("BenchmarkPidfdExit", "ns/reap-to-done", 1e3), r.gb("BenchmarkPidfdExit", "ns/kill-to-done", 1e3))})
		t.add("the same, the status read from its process accounting record (2,000 records before it)", map[method]string{pidfd: fmt.Sprintf("%s µs; %s µs",
			r.gb("BenchmarkAccountingExit", "ns/reap-to-done", 1e3), r.gb("BenchmarkAccountingExit", "ns/kill-to-done", 1e3))})
	}
	if r.scale == nil {
		return
	}
	type col struct {
		label string
		pts   []scalePoint
	}
	byProcs := col{"10 / 1,000 / 10,000 processes", []scalePoint{{10, 1}, {1000, 1}, {10000, 1}}}
	byApps := col{"1 / 10 / 50 app containers", []scalePoint{{10, 1}, {0, 10}, {0, 50}}}
	for _, c := range []col{byProcs, byApps} {
		var cpu, wall, lat []string
		failed := 0
		for _, pt := range c.pts {
			s := r.scale[pt]
			if s == nil {
				cpu, wall, lat = append(cpu, "?"), append(wall, "?"), append(lat, "?")
				continue
			}
			failed += s.failed
			cpu = append(cpu, ms(s.watcherCPU.quantile(0.5)))
			wall = append(wall, ms(s.watching.quantile(0.5)))
			lat = append(lat, fmt.Sprintf("%s (max %s)", ms(s.fromReap.quantile(0.5)), ms(s.fromReap.max())))
		}
		note := ""
		if failed > 0 {
			note = fmt.Sprintf(" — %d run(s) failed", failed)
		}
		t.add(fmt.Sprintf("pod, %s: supervisor CPU from exec to watching every app, median ms", c.label), map[method]string{pidfd: strings.Join(cpu, " / ") + note})
		t.add(fmt.Sprintf("pod, %s: log's \"starting\" → last \"app found\", median ms", c.label), map[method]string{pidfd: strings.Join(wall, " / ")})
		t.add(fmt.Sprintf("pod, %s: exit-to-stop from the (last) reap, median ms", c.label), map[method]string{pidfd: strings.Join(lat, " / ")})
	}
}

func signalRows(t *table, r *results) {
	t.section("4. ptrace overhead on a signal-heavy app")
	rate, cost := map[method]string{}, map[method]string{}
	base := r.signals[pidfd].rate.quantile(0.5)
	for _, m := range []method{pidfd, ptrace} {
		s := r.signals[m]
		if len(s.rate) == 0 {
			rate[m] = "failed: " + oneLine(s.lastErr)
			continue
		}
		v := s.rate.quantile(0.5)
		rate[m] = fmt.Sprintf("%s (%s–%s)", count(v), count(s.rate.min()), count(s.rate.max()))
		if m == ptrace && base > 0 {
			rate[m] += fmt.Sprintf(", %.0f%% of untraced", 100*v/base)
		} else if m == pidfd {
			rate[m] += ", not traced"
		}
		cost[m] = fmt.Sprintf("%s µs CPU, %s context switches", small(s.cpuPerSignal.quantile(0.5)/1e3), small(s.switchesPerSignal.quantile(0.5)))
	}
	t.add(fmt.Sprintf("signals per second an app receives and acknowledges one at a time, median of %d rounds (min–max)", r.o.signalRounds), rate)
	t.add("the supervisor's cost per signal to the app", cost)
}

func memoryRows(t *table, r *results) {
	t.section("5. Memory against the pod's process count")
	var sizes, hwm, found []string
	for _, n := range r.o.memoryProcs {
		sizes = append(sizes, thousands(n))
		m := r.memory[n]
		switch {
		case m == nil:
			hwm, found = append(hwm, "?"), append(found, "?")
		case m.skipped != "":
			hwm, found = append(hwm, "not measured: "+strings.ReplaceAll(m.skipped, "|", "/")), append(found, "—")
		case len(m.hwmKB) == 0:
			hwm, found = append(hwm, "failed: "+oneLine(m.lastErr)), append(found, "—")
		default:
			cell := fmt.Sprintf("**%s** (max %s; n=%d)", sig3(m.hwmKB.quantile(0.5)/1024), sig3(m.hwmKB.max()/1024), len(m.hwmKB))
			if m.failed > 0 {
				cell += fmt.Sprintf(" — %d run(s) failed: %s", m.failed, oneLine(m.lastErr))
			}
			hwm, found = append(hwm, cell), append(found, ms(m.found.quantile(0.5)))
		}
	}
	label := strings.Join(sizes, " / ")
	t.add(fmt.Sprintf("pod of %s processes: the supervisor's peak memory (VmHWM) over its whole run, MiB: median (max; runs)", label),
		map[method]string{pidfd: strings.Join(hwm, " / ")})
	t.add("the same pods: log's \"starting\" → \"app found\" (about one scan of the pod), median ms",
		map[method]string{pidfd: strings.Join(found, " / ")})
}

func oneLine(err error) string {
	if err == nil {
		return "?"
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return strings.ReplaceAll(s, "|", "/")
}

func writeMethod(w io.Writer, r *results) {
	o := r.o
	fmt.Fprintf(w, `## How each figure is measured

Every pod is the simulated pod of e2e/pod (namespaces backend): a pause process as PID 1,
each container entered in the pod's namespaces with its own mount namespace, /proc, cgroup
and uid. The pod: one app container (podsim app, uid 1000, blocked reading a FIFO until the
benchmark opens and closes it), istio-proxy (the stand-in pilot-agent, uid 1337, with an
envoy child; 1 ms drain), and last the method's watcher. All times are CLOCK_REALTIME in
nanoseconds on this host.

**1. Exit-to-stop latency.** %d fresh pods per method (%d for the 1 s poller), run
round-robin with the order rotating, so that load drifts hit every method alike. Each pod
starts, the benchmark waits until the watcher watches (supervisor: its "app found" log
line; poller: its "watching" line; seed: the app has started) and pilot-agent runs, then
ends the app through its FIFO.
- *From the reap*: the pod harness plays the container runtime's shim and is the app's
  reaper; it reads the clock as soon as its wait for the app's main process returns
  (pod.Namespaces' ExitedAt). The end is the stand-in pilot-agent's clock reading when its
  signal channel delivers SIGTERM (PILOT_TIMESTAMPS), Go's signal hand-off included, which
  is the same for every method. The harness reads its clock only once its thread is back
  from the kernel's reap: when it is slow to run, a watcher woken by the reap can signal
  first and the figure goes below zero. With ptrace the tracer learns of the exit before
  the reaper may reap, so this row flatters ptrace: compare methods on the next one.
- *From the exit*: the app's own clock reading just before it exits (podsim app --stamps),
  so before the kernel's exit and the reap. This is the only start point the seed has: its
  wrapper shell, not the harness, reaps the app and then forks and execs pkill, which reads
  every process of the pod's /proc and sends SIGTERM. The wrapper runs as uid 1337 so that
  pkill may signal pilot-agent.
- The pollers (e2e/bench/poller, uid 1337, no capabilities) find the two main processes in
  /proc, then stat /proc/APP_PID every interval; once it is gone (reaped) they send SIGTERM.
  The app ends at a random moment of the poller's cycle, so expect a uniform delay over
  the interval: p50 about half of it.
- The supervisor is the image's binary with SUPERVISOR_EXIT_STATUS=pidfd (uid 1337, no
  capabilities) or =ptrace (root with SYS_PTRACE and KILL only, as deploy/job-ptrace.yaml),
  SUPERVISOR_APP_CONTAINERS=1. Its path from the exit: epoll wakes on the pidfd at the reap
  (ptrace: the tracer's wait4 gets the exit before the reaper may reap), the decision,
  pidfd_send_signal on pilot-agent's pidfd (held since discovery: no scan of /proc).

**2. Footprint.** Sizes are the built files. The image is e2e/scripts/build-image.sh's OCI
archive (the Dockerfile's runtime stage: the binary and CA certificates, FROM scratch).
Memory and idle costs come from one pod per method running at once, each with an app that
runs throughout: after the watcher is ready and %s more, the counters of every thread of
the watcher process (/proc/PID/task/*/schedstat: time on CPU; voluntary and involuntary
context switches from .../status, each a wake-up or a preemption) are read at the start and
end of a %s window and scaled to a minute; VmRSS and VmHWM (/proc/PID/status) at its end.
For the seed the watcher is the wrapper shell, blocked in wait(2).

**3. Scale.** The product's testing.B benchmarks (procscan/bench_test.go,
supervisor/pidfd_bench_test.go; -benchtime %s): Processes then Classify, as the supervisor's
scan does, over generated /proc trees (a pod's four processes plus app containers' main
processes and children, in the layout a cgroup v2 node shows) and over a real /proc: a new
PID namespace whose PID 1, sh, mounts its own /proc and forks exactly N-1 children that
block opening a FIFO; it is read through /proc/PID/root/proc. Per-process figures are ns/op
divided by the processes read. The pod rows: %d pods per shape with the supervisor (pidfd)
watching; extra processes are forks of sh in an extra container it ignores, all started
before it; its CPU time (all threads' schedstat) is read once it has logged "app found"
for every app; then the apps end and the exit-to-stop latency is read as in 1, from the
last app's reap.

**4. ptrace overhead.** A pod whose app answers each SIGUSR1 with one byte through a FIFO;
the benchmark sends SIGUSR1 with kill(2) to the app's main process and waits for the byte
before the next, for %s, after 200 to warm up; %d rounds, each with a fresh pod per method,
alternating which goes first. With ptrace every signal the traced thread takes becomes a
signal-delivery-stop: the supervisor's tracer thread is woken by SIGCHLD, collects the stop
with wait4 and resumes the app with PTRACE_CONT(signal). The supervisor's CPU time and
context switches over the window are divided by the signals sent.

Nothing here asserts a time; the tests never do. The machine is shared: the load averages
above are what else ran meanwhile.
`, o.runs, o.slowRuns, settle, o.idle, o.benchtime, o.scaleRuns, o.signalWindow, o.signalRounds)
	if r.memory != nil {
		writeMemoryMethod(w, r)
	}
}

func writeMemoryMethod(w io.Writer, r *results) {
	perProc := "?"
	most := 0
	for _, n := range r.o.memoryProcs {
		if m := r.memory[n]; m != nil && len(m.perProcKB) > 0 && n > most {
			most, perProc = n, fmt.Sprintf("%s kB each at %s", sig3(m.perProcKB.quantile(0.5)), thousands(n))
		}
	}
	fmt.Fprintf(w, `
**5. Memory** (`+"`-sections memory`"+`, not part of the default run). %d pods per size, one at
a time, each of the benchmark's pod (one app) plus a filler container holding the rest of
the processes: children of a minimal static program (e2e/bench/idle.go: no libc, a page
of code; it forks as many children as it has arguments, which sleep in pause(2) until
killed), %s (MemAvailable's drop over the pod's start, divided by its processes: page
tables, kernel stack, task structures), where forks of sh cost about 290 kB and sleep(1)
about 210 kB. The filler runs as root, whom RLIMIT_NPROC does not hold. For the section
the benchmark raises kernel.pid_max and kernel.threads-max if they are too low, and puts
them back after. The supervisor (pidfd) runs with GOMEMLIMIT=%s as the manifests
set it (their memory limit, 32 MiB) and SUPERVISOR_SCAN_INTERVAL=100ms, and is told to
expect two apps: it scans the whole pod again and again for the second, which never
comes, for 10 s plus 0.2 ms per process (SUPERVISOR_APP_START_TIMEOUT), then the app ends
and it stops the sidecar and exits. Its VmHWM (/proc/PID/status, the peak resident
set since it started) is read every 50 ms until it exits; the figure is the last
reading. The second row is one scan's time, roughly: from its "starting" log line to
"app found".
`, r.o.memoryRuns, perProc, memGOMEMLIMIT)
}
