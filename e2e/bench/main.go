// Command bench measures sidecar-supervisor side by side with the ways of
// stopping a sidecar it replaces, on this machine, in one run, and prints
// the result as a markdown document with one table (BENCHMARKS.md):
//
//   - exit-to-stop latency in the simulated pod (e2e/pod): the seed's
//     shell wrapper, a /proc poller at 1 s and at 50 ms (e2e/bench/poller),
//     the supervisor with pidfd and with ptrace;
//   - footprint: binary and image size, memory, and CPU time and wake-ups
//     while idle with an app running;
//   - scale: discovery against processes and app containers (the product's
//     testing.B benchmarks, and whole pods);
//   - ptrace's overhead on an app that receives many signals;
//   - on demand only (-sections memory): the supervisor's peak memory in
//     pods of 1,000, 10,000 and 100,000 processes.
//
// It needs root (namespaces, cgroups). e2e/bench.sh builds the image and
// runs it:
//
//	sudo e2e/bench.sh > BENCHMARKS.md
//	sudo e2e/bench.sh -sections memory   # about 10 minutes, 8 GiB of RAM
//	go -C e2e run ./bench -h
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

type options struct {
	runs, slowRuns int
	idle           time.Duration
	signalRounds   int
	signalWindow   time.Duration
	scaleRuns      int
	benchtime      string
	supervisor     string // binary under test; empty: pod.BuildTools's
	image          string // OCI archive
	sections       map[string]bool
	waitLoad       float64
	waitMax        time.Duration
	memoryRuns     int
	memoryProcs    []int
}

// allSections are measured by default; memory only when asked for: its
// 100,000 processes take minutes and GiBs.
var allSections = []string{"latency", "footprint", "scale", "signals", "gobench"}

func main() {
	var o options
	var sections string
	flag.IntVar(&o.runs, "runs", 100, "exit-to-stop runs per method")
	flag.IntVar(&o.slowRuns, "slow-runs", 100, "runs of the 1 s poller (each takes about a second more)")
	flag.DurationVar(&o.idle, "idle", 3*time.Minute, "idle window of the footprint measure")
	flag.IntVar(&o.signalRounds, "signal-rounds", 5, "rounds of the signal-rate measure (a fresh pod per method each)")
	flag.DurationVar(&o.signalWindow, "signal-window", 3*time.Second, "length of each signal-rate round")
	flag.IntVar(&o.scaleRuns, "scale-runs", 10, "pods per shape in the pod-level scale runs")
	flag.StringVar(&o.benchtime, "benchtime", "1s", "go test -benchtime for the product's benchmarks")
	flag.StringVar(&o.supervisor, "supervisor", "", "the supervisor binary to measure (build-image.sh's SUPERVISOR_BINARY); default: built here as the Dockerfile does, without the version stamp")
	flag.StringVar(&o.image, "image", "", "the image's OCI archive (build-image.sh's SUPERVISOR_IMAGE_ARCHIVE); none: no image row")
	flag.StringVar(&sections, "sections", strings.Join(allSections, ","), "what to measure: any of "+strings.Join(allSections, ",")+",memory (memory: pods of up to 100,000 processes, about 8 GiB of RAM; not by default)")
	flag.IntVar(&o.memoryRuns, "memory-runs", 3, "pods per size in the memory section")
	memoryProcs := flag.String("memory-procs", "1000,10000,100000", "pod sizes (processes) of the memory section")
	flag.Float64Var(&o.waitLoad, "wait-load", 0, "before measuring, wait until the 1-minute load average is below this (0: do not wait)")
	flag.DurationVar(&o.waitMax, "wait-max", 30*time.Minute, "the longest wait for -wait-load; then measure anyway, and say so")
	flag.Parse()
	o.sections = map[string]bool{}
	for _, s := range strings.Split(sections, ",") {
		s = strings.TrimSpace(s)
		if s != "memory" && !slices.Contains(allSections, s) {
			log.Fatalf("-sections: no section %q; the sections are %s,memory", s, strings.Join(allSections, ","))
		}
		o.sections[s] = true
	}
	for _, f := range strings.Split(*memoryProcs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 100 {
			log.Fatalf("-memory-procs: %q is not a process count of 100 or more", f)
		}
		o.memoryProcs = append(o.memoryProcs, n)
	}
	log.SetFlags(log.Ltime)
	log.SetPrefix("bench: ")
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the simulated pods need namespaces and cgroups")
	}
	// Every temporary file of the run (tools, pods, go test's) in one
	// directory of ours: a concurrent clean-up of /tmp/podsim-* by someone
	// else's test run must not pull the tools from under a running pod.
	tmp, err := os.MkdirTemp("", "sidecar-bench-")
	if err != nil {
		log.Fatal(err)
	}
	// Containers run as several uids and must reach their files.
	if err := os.Chmod(tmp, 0o755); err != nil {
		log.Fatal(err)
	}
	os.Setenv("TMPDIR", tmp)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = run(ctx, o, os.Stdout)
	stop()
	os.RemoveAll(tmp)
	if err != nil {
		log.Fatal(err)
	}
}

// results is everything measured, for the report.
type results struct {
	o          options
	machine    machine
	loads      []string // 1-min load average at each section's start, and at the end
	waited     string   // what -wait-load did
	started    time.Time
	took       time.Duration
	latency    map[method]*stopLatency
	footprint  map[method]idleCost
	supBinary  binaryInfo
	pollBinary binaryInfo
	image      *imageInfo
	signals    map[method]*signalRate
	scale      map[scalePoint]*stopLatency
	gobench    map[string]goBench
	gobenchRaw string
	memory     map[int]*memPoint
	errs       []string
}

func run(ctx context.Context, o options, w io.Writer) error {
	res := &results{o: o, started: time.Now().UTC()}
	res.waited = waitForLoad(ctx, o.waitLoad, o.waitMax)
	res.machine = readMachine()
	repo := pod.RepoDir()

	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	tl, err := pod.BuildTools(bctx)
	cancel()
	if err != nil {
		return err
	}
	defer os.RemoveAll(tl.Dir)
	root, err := os.MkdirTemp("", "bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	if o.supervisor != "" {
		// The image's binary, where every container uid can run it.
		tl.Supervisor = filepath.Join(root, "sidecar-supervisor")
		if err := scenarios.InstallTool(o.supervisor, root, "sidecar-supervisor"); err != nil {
			return err
		}
	}
	poller := filepath.Join(root, "poller")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", poller, "./bench/poller")
	build.Dir = filepath.Join(repo, "e2e")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the poller: %v\n%s", err, out)
	}
	e := env{tools: tl, poller: poller, root: root}

	if res.supBinary, err = readBinary(tl.Supervisor); err != nil {
		return err
	}
	if res.pollBinary, err = readBinary(poller); err != nil {
		return err
	}
	if o.image != "" {
		im, err := readImage(o.image)
		if err != nil {
			return err
		}
		res.image = &im
	}
	section := func(name string) bool {
		if !o.sections[name] || ctx.Err() != nil {
			return false
		}
		res.loads = append(res.loads, fmt.Sprintf("%s %s", measure.LoadAvg(), name))
		log.Printf("%s (load %s)", name, measure.LoadAvg())
		return true
	}
	if section("latency") {
		res.latency = latencies(ctx, e, o.runs, o.slowRuns)
	}
	if section("footprint") {
		res.footprint = footprints(ctx, e, o.idle)
	}
	if section("signals") {
		res.signals = signalRates(ctx, e, o.signalRounds, o.signalWindow)
	}
	// Last, the parts that start and kill thousands of processes: the load
	// average counts them while they fork and die, for minutes after.
	if section("gobench") {
		res.gobench, res.gobenchRaw, err = runGoBench(ctx, repo, o.benchtime)
		if err != nil {
			res.errs = append(res.errs, err.Error())
		}
	}
	if section("scale") {
		res.scale = podScale(ctx, e, o.scaleRuns)
	}
	if section("memory") {
		res.memory = memoryScale(ctx, e, o.memoryProcs, o.memoryRuns)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res.loads = append(res.loads, measure.LoadAvg()+" end")
	res.took = time.Since(res.started)
	return report(w, res)
}

// waitForLoad waits for the 1-minute load average to drop below limit.
func waitForLoad(ctx context.Context, limit float64, most time.Duration) string {
	if limit <= 0 {
		return ""
	}
	start := time.Now()
	for {
		l := load1()
		if l < limit {
			if time.Since(start) < time.Second {
				return fmt.Sprintf("load was already below %.1f", limit)
			}
			return fmt.Sprintf("waited %s for the load to drop below %.1f", time.Since(start).Round(time.Second), limit)
		}
		if time.Since(start) > most {
			return fmt.Sprintf("the load stayed above %.1f for %s: measured anyway", limit, most)
		}
		log.Printf("load %.2f, waiting for < %.1f", l, limit)
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(15 * time.Second):
		}
	}
}

// load1 is the 1-minute load average, 0 if unknown.
func load1() float64 {
	v, _ := strconv.ParseFloat(strings.Fields(measure.LoadAvg())[0], 64)
	return v
}

// machine describes where the figures come from.
type machine struct {
	cpu, kernel, os, goVersion, commit string
	cpus                               int
	memGB                              float64
}

func readMachine() machine {
	m := machine{cpus: runtime.NumCPU(), goVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	release, arch := measure.Kernel()
	m.kernel = release + " " + arch
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.os = strings.Trim(v, `"`)
			}
		}
	}
	if st, err := measure.Counters("/proc/meminfo"); err == nil {
		m.memGB = float64(st["MemTotal"]) / (1 << 20)
	}
	m.commit = measure.Commit(pod.RepoDir())
	return m
}
