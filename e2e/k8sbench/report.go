package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/measure"
)

// line is a result as the progress log shows it.
func (r result) line() string {
	if r.failure != "" {
		return fmt.Sprintf("%s FAILED: %s", r.job, r.failure)
	}
	return fmt.Sprintf("%s: app exit -> pod Succeeded %.2fs, Job Complete %.2fs; other containers %.3f CPU-s, %.1f MiB; istio-proxy %s%s",
		r.job, r.podDone.Sub(r.appExit).Seconds(), r.jobDone.Sub(r.appExit).Seconds(),
		r.other.cpu.Seconds(), mib(r.other.peak), r.proxy, summarySuffix(r.summary))
}

func summarySuffix(s string) string {
	if s == "" {
		return ""
	}
	return "; supervisor: " + s
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// report is the run's document.
type report struct {
	o        options
	all      []approach
	use      []int
	results  []result
	started  time.Time
	took     time.Duration
	loads    [2]string
	versions map[string]string
	images   [2]string
	commit   string
}

// figures are one approach's measured Jobs.
type figures struct {
	ok, failed             int
	fellBack               int       // the supervisor's POST failed, then SIGTERM
	toPod, toJob, lifetime []float64 // seconds
	cpu, mem               []float64 // CPU-s, MiB: containers other than the app
	supCPU, supMem         []float64
	sampled, containers    int
	supStart               []float64 // s from the app's exit to the supervisor's start
	onSuccess, summary     string
	failures               []string
}

func (r *report) figures(i int) figures {
	var f figures
	for _, res := range r.results {
		if res.approach != i {
			continue
		}
		f.onSuccess = cmp.Or(f.onSuccess, res.onSuccess)
		if res.failure != "" {
			f.failed++
			f.failures = append(f.failures, res.job+": "+res.failure)
			continue
		}
		f.ok++
		if fellBack(res.summary) {
			f.fellBack++
		}
		f.toPod = append(f.toPod, res.podDone.Sub(res.appExit).Seconds())
		f.toJob = append(f.toJob, res.jobDone.Sub(res.appExit).Seconds())
		f.lifetime = append(f.lifetime, res.jobDone.Sub(res.created).Seconds())
		f.cpu = append(f.cpu, res.other.cpu.Seconds())
		f.mem = append(f.mem, mib(res.other.peak))
		if r.all[i].shape.hasSupervisor() {
			f.supCPU = append(f.supCPU, res.super.cpu.Seconds())
			f.supMem = append(f.supMem, mib(res.super.peak))
			f.supStart = append(f.supStart, res.supStart.Sub(res.appExit).Seconds())
			f.summary = cmp.Or(f.summary, res.summary)
		}
		f.sampled += res.sampled
		f.containers += containersMeasured(r.all[i].shape)
	}
	return f
}

func containersMeasured(s shape) int {
	if s.hasSupervisor() {
		return 2
	}
	return 1
}

func median(v []float64) float64 { return measure.Quantile(v, 0.5) }

// pair is "p50 / max" with the given precision, or n/a.
func pair(v []float64, prec int) string {
	if len(v) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("**%.*f** / %.*f", prec, median(v), prec, slices.Max(v))
}

func (r *report) write(w io.Writer) error {
	fmt.Fprintf(w, "# Job completion on a real kubelet\n\n")
	fmt.Fprintf(w, "Measured in one run of `sudo e2e/k8sbench.sh` on %s, in %s: %d Jobs per approach after %d warm-up round(s), round-robin with the order rotating, one Job at a time.\n\n",
		r.started.UTC().Format("2006-01-02 15:04 UTC"), r.took.Round(time.Second), r.o.jobs, r.o.warmup)
	fmt.Fprintf(w, "- Machine: %s\n", machine())
	fmt.Fprintf(w, "- Load average (1, 5, 15 min) at the start and at the end: %s; %s\n", r.loads[0], r.loads[1])
	fmt.Fprintf(w, "- Cluster (e2e/cluster): %s\n", clusterVersions())
	fmt.Fprintf(w, "- Images: supervisor `%s`, istio-proxy `%s` (Istio's pilot-agent, stand-in envoy); app `%s`\n", r.images[0], r.images[1], r.versions["BUSYBOX_IMAGE"])
	fmt.Fprintf(w, "- Code: commit %s\n\n", r.commit)

	var rows [][]string
	for _, i := range r.use {
		f := r.figures(i)
		cpu, mem := pair(f.cpu, 3), pair(f.mem, 1)
		if len(f.supCPU) > 0 {
			cpu += fmt.Sprintf(" (%.3f)", median(f.supCPU))
			mem += fmt.Sprintf(" (%.1f)", median(f.supMem))
		}
		life := "n/a"
		if len(f.lifetime) > 0 {
			life = fmt.Sprintf("%.2f", median(f.lifetime))
		}
		done := fmt.Sprintf("%d of %d", f.ok, f.ok+f.failed)
		if f.fellBack > 0 {
			done += fmt.Sprintf(" (in %d the POST failed: SIGTERM)", f.fellBack)
		}
		rows = append(rows, []string{r.all[i].rowTitle(f.onSuccess), done, pair(f.toPod, 2), pair(f.toJob, 2), life, cpu, mem})
	}
	measure.Table(w, "", []string{"approach", "Jobs completed", "app exit → pod Succeeded, s: p50 / max", "app exit → Job Complete, s: p50 / max",
		"Job created → Complete, s: p50", "CPU-s of the containers other than the app, per Job: p50 / max (supervisor's p50)",
		"their peak memory, MiB, per Job: p50 / max (supervisor's p50)"}, rows...)
	fmt.Fprintln(w)
	r.method(w)
	return nil
}

// fellBack tells from the supervisor's summary that its HTTP action failed
// and it sent SIGTERM instead ("...; POST failed (...), sent SIGTERM; ...").
func fellBack(summary string) bool {
	return strings.Contains(summary, "POST failed")
}

// hexID is a container ID as the supervisor's summary shows it.
var hexID = regexp.MustCompile(`\b[0-9a-f]{12}\b`)

func (r *report) method(w io.Writer) {
	sampled, measured := 0, 0
	var summaries, failures []string
	for _, i := range r.use {
		f := r.figures(i)
		sampled += f.sampled
		measured += f.containers
		if f.summary != "" {
			summaries = append(summaries, fmt.Sprintf("%s: `%s`, its first log line %+.3f s from the app's exit (median; min %+.3f)",
				r.all[i].key, hexID.ReplaceAllString(f.summary, "{app}"), median(f.supStart), slices.Min(f.supStart)))
		}
		failures = append(failures, f.failures...)
	}
	fmt.Fprintf(w, `## How it is measured

**The Job.** One busybox container, `+"`sh -c 'echo working; sleep %d; adjtimex'`"+` (the quick row:
`+"`adjtimex`"+` alone), backoffLimit 0, restartPolicy Never (OnFailure in its row), the label
`+"`sidecar.istio.io/inject: \"true\"`"+`, its image already on the node. The API server sends each pod
to Istio's own injector (istio.io/istio/pkg/kube/inject, served by this process as istiod
would, with Istio's chart rendered with deploy/istio/values-supervisor.yaml, so Istio's
"sidecar" template then our "supervisor" template), exactly as in e2e/k8sjobs:
interceptionMode NONE (no istio-init: the stand-in envoy proxies nothing), istio-proxy a
classic sidecar unless the pod asks for a native one. Istio's defaults otherwise:
terminationDrainDuration 5 s (pilot-agent drains that long on SIGTERM, and exits at once on
a POST to /quitquitquit), the status port 15020, terminationGracePeriodSeconds 30 s. The
wrapper rows opt out of our template (`+"`supervisor.sidecar-supervisor.io/inject: \"false\"`"+`); the
benchmark checks each pod's shape (the native sidecar an init container with restartPolicy
Always and no supervisor; the supervisor first, or in the native-sidecar rows an init container
with restartPolicy Always and SUPERVISOR_SHAPE native; its SUPERVISOR_ON_SUCCESS and
RESTART_POLICY) and
stops if the injector made anything else. Each Job and its pod are deleted before the next
Job starts.

**The older Istio releases** (rows "Istio 1.20's", "1.21-1.25's", "1.26+'s pilot-agent"):
only the newest pilot-agent can be built here, so these pods customise istio-proxy (a
container of that name in the Job, which Istio merges over its own) to run the stand-in
that follows that release's pilot-agent (e2e/cmd/podsim, `+"`pilot-agent`"+` mode with
PILOT_ISTIO; read in each release's source: its /quitquitquit, /drain and SIGTERM), with
Istio's default drain of 5 s. Their stop and the kubelet's part are comparable with the
other rows; their CPU and memory are the stand-in's, not pilot-agent's.

**App exit.** The app's last command is busybox's `+"`adjtimex`"+`, which prints CLOCK_REALTIME with
nanoseconds (busybox's date has no %%N); the shell exits right after it. The node and this
process share the clock.

**Pod Succeeded, Job Complete.** This process watches the namespace's pods and Jobs
(client-go informers: one watch each on the API server) and stamps, with its own clock, the
arrival of the first event showing the pod in phase Succeeded and the Job with condition
Complete (the API's own timestamps have whole seconds). Each figure holds the sidecar's
stop (pilot-agent's drain, or none), the kubelet noticing the exits (its PLEG relists
containers every second), its status update to the API server, and for the Job the Job
controller. *Job created → Complete* runs from just before the create call: the node time
the Job holds.

**CPU and memory.** Of every container of the pod but the app: istio-proxy (pilot-agent and
envoy) and, where present, the supervisor; the sandbox's pause process is the same in every
pod and left out, and the wrappers' own work (killall, wget) runs in the app's container.
The kubelet here runs with cgroupsPerQOS false and the cgroupfs driver, so containerd's CRI
plugin, given no cgroup parent, has runc put each container in `+"`/%s/<container ID>`"+` of every
hierarchy. On this hybrid host the v1 hierarchies hold the controllers; the v2 one
(`+"`/sys/fs/cgroup/unified`"+`) has none but keeps each cgroup's base CPU time (cpu.stat
usage_usec: user and system, every thread) and a cgroup.events file. This process follows
those directories (listing them every 100 ms, sampling each), watches each cgroup.events
with inotify, and when it says `+"`populated 0`"+` (the container's last process is gone) reads
the final CPU time and the v1 memory.max_usage_in_bytes (the high-water mark, page cache
charged to the container included) before runc removes the cgroup, which it does only after
containerd has handled the exit. %d of the %d containers measured were read from the last
100 ms sample instead, having been removed first. Memory per Job is the sum of each
container's own peak. Page cache is charged to the first cgroup that reads a page: the
warm-up round reads the binaries first, so the figures are mostly anonymous memory.
`, r.o.appSeconds, r.o.cgroup, sampled, measured)
	var fallbacks []string
	for _, res := range r.results {
		if res.failure == "" && fellBack(res.summary) {
			fallbacks = append(fallbacks, fmt.Sprintf("%s: `%s`", res.job, hexID.ReplaceAllString(res.summary, "{app}")))
		}
	}
	if len(fallbacks) > 0 {
		fmt.Fprintf(w, "\n**Fallbacks to SIGTERM**, the Job still completed (the pods' logs were printed to stderr): %s.\n", strings.Join(fallbacks, "; "))
	}
	if len(summaries) > 0 {
		fmt.Fprintf(w, "\n**The supervisor's summary** (its termination message) in the first Job of each row, and when it started (its first log line, `starting`, millisecond timestamps) from the app's exit: %s.\n", strings.Join(summaries, "; "))
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "\n**Failed runs** (their pods were printed to stderr): %s.\n", strings.Join(failures, "; "))
	}
}

func machine() string {
	kernel, _ := measure.Kernel()
	mem := "?"
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		mem = fmt.Sprintf("%.1f GiB", float64(si.Totalram)*float64(si.Unit)/(1<<30))
	}
	return fmt.Sprintf("%d CPUs, %s; Linux %s; %s", runtime.NumCPU(), mem, kernel, runtime.Version())
}

// clusterVersions names what the cluster runs.
func clusterVersions() string {
	parts := []string{}
	if v := versionsEnv("KUBERNETES_VERSION"); v != "" {
		parts = append(parts, "Kubernetes "+v+" (built from the Go module proxy)")
	}
	for _, tool := range [][]string{{"containerd", "--version"}, {"runc", "--version"}} {
		out, err := exec.Command(tool[0], tool[1:]...).Output()
		if err == nil {
			parts = append(parts, strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0])
		}
	}
	if v := versionsEnv("ISTIO_VERSION"); v != "" {
		parts = append(parts, "Istio (injector and pilot-agent) "+v)
	}
	return strings.Join(parts, "; ")
}

func versionsEnv(name string) string {
	dir, err := injector.DeployDir()
	if err != nil {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, "..", "e2e", "versions.env"))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func commit() string {
	dir, err := injector.DeployDir()
	if err != nil {
		return "?"
	}
	return measure.Commit(dir)
}
