package hardening

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// Odd names, as prctl(PR_SET_NAME) and execve let any process have them:
// the app's main process has both, and the decoys try to pass for the
// sidecar, or to shift /proc/PID/stat's fields (a comm with ") S 0").
const (
	oddComm  = "my app (v2)\n\xff)" // 14 bytes: spaces, parentheses, a newline, invalid UTF-8
	oddArgv0 = "/opt/my\napp \xfe(x)"
	fakeStat = "a) S 0 1 1 (b" // parsed naively, PPID 0: a container's main process
)

// TestHostilePod runs the supervisor, under strace, in a pod built to
// mislead it, and checks that it is not misled:
//
//   - the app container's main process has an odd comm and argv[0]; the
//     container also holds children named pilot-agent and fakeStat, and a
//     pilot-agent exec'd into it (PPID 0, like a main process, but
//     younger), all of uid 1337, the supervisor's and the sidecar's uid;
//   - a bystander container (ignored by SUPERVISOR_IGNORE_PROCESSES) holds
//     pilot-agent children and an exec'd pilot-agent too, and outlives the
//     supervisor, so a wrong signal would reach a live decoy.
//
// It must find the app by its main process and read its exit code, stop
// the real sidecar and nothing else, and do so only through pidfds (no
// kill(2)), reading only stat, cmdline and cgroup under /proc (never
// environ), with no socket at all, and a log of one JSON object per line.
func TestHostilePod(t *testing.T) {
	straceBin := strace(t)
	b, tl := buildNamespaces(t, scenarios.Desc{
		Name: "hostile",
		// The app runs until the supervisor has found it.
		Apps: []scenarios.App{{Name: "app", UID: scenarios.ProxyUID, Cued: true}},
		// The sidecar drains until a decoy has been exec'd into the app's
		// container, before the stop's next scan.
		ProxyDrainCued: true,
		SupervisorEnv:  patient("SUPERVISOR_APP_CONTAINERS=1", "SUPERVISOR_IGNORE_PROCESSES=bystander"),
	})
	rec := func(name string) string { return filepath.Join(b.Shared, name+".record") }
	runHostile(b, "app", "--comm", oddComm, "--argv0", oddArgv0, "--decoy", "pilot-agent", "--decoy", fakeStat)
	proxyAt := slices.IndexFunc(b.Spec.Containers, func(c pod.Container) bool { return c.Name == "istio-proxy" })
	b.Spec.Containers = slices.Insert(b.Spec.Containers, proxyAt, pod.Container{
		Name: "bystander", UID: scenarios.ProxyUID, GID: scenarios.ProxyUID, NoNewPrivs: true, Caps: []int{},
		Argv: []string{tl.Podsim, "hostile", "--comm", "bystander", "--decoy", "pilot-agent", "--decoy", "pilot-agent",
			"--record", rec("bystander")},
	})
	sup := scenarios.Container(&b.Spec, "supervisor")
	trace := filepath.Join(b.Dir, "supervisor.strace")
	sup.Argv = straceArgs(straceBin, trace, sup.Argv...)
	// The exec'd decoys go in before the supervisor's first scan: it starts
	// once they run.
	execd := make(chan struct{})
	sup.StartAfter = scenarios.Gate(execd)
	termLog := sup.TerminationMessage

	p := scenarios.Start(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*scenarios.EventBound)
	defer cancel()
	// kubectl exec: a pilot-agent with PPID 0 in container c, running until
	// the end of the test, recorded in record; it returns once it runs.
	execCtx, stopExec := context.WithCancel(ctx)
	defer stopExec()
	execDecoy := func(c, record string) {
		go p.Exec(execCtx, c, tl.Podsim, "hostile", "--comm", "pilot-agent", "--argv0", "pilot-agent", "--record", rec(record))
		waitUntil(t, scenarios.EventBound, "the decoy "+record, func() bool { return started(scenarios.Record(rec(record))) })
	}
	for _, c := range []string{"app", "bystander"} {
		if _, err := p.WaitRunning(ctx, c, 0); err != nil {
			t.Fatal(err)
		}
		execDecoy(c, "exec-"+c)
	}
	close(execd)
	appPID := nsPID(t, p.Status().Container("app").PID)
	proxy, err := p.WaitRunning(ctx, "istio-proxy", 0)
	if err != nil {
		t.Fatal(err)
	}
	sidecarPID := nsPID(t, proxy.PID)
	st, err := p.WaitRunning(ctx, "supervisor", 0)
	if err != nil {
		t.Fatal(err)
	}
	// The supervisor is strace's child, in the pod's PID namespace too.
	var supPID int
	waitUntil(t, scenarios.EventBound, "the supervisor under strace", func() bool {
		for _, c := range children(st.PID) {
			if commOf(c) == "sidecar-supervi" {
				supPID = nsPID(t, c)
			}
		}
		return supPID != 0
	})

	// Once the app has exited and the sidecar drains, a pilot-agent is
	// exec'd into the app's container: its only process, PPID 0, so a
	// snapshot of /proc takes it for that container's main process. The
	// stop scans again once the sidecar is gone (for late sidecars), and
	// must not take this container, an app's, for a sidecar's. (Kubernetes
	// refuses an exec into a stopped container; this stands in, every
	// time, for a process exec'd just before the main process exited,
	// which the runtime kills only after the supervisor may have looked.)
	releaseFound(t, p, b, "app")
	waitUntil(t, scenarios.EventBound, "the sidecar's SIGTERM", func() bool {
		return slices.Contains(scenarios.Record(b.PilotRecord), "signal SIGTERM")
	})
	execDecoy("app", "late-app")
	release(t, b, scenarios.ProxyDrainCue)

	if sst := ended(t, p, "supervisor").Container("supervisor"); sst.ExitCode != 0 {
		t.Errorf("supervisor exit %d, want 0", sst.ExitCode)
	}
	out := p.Logs("supervisor")

	t.Run("found the app by its main process", func(t *testing.T) {
		found := scenarios.LogWhere(p, scenarios.Is("app found"))
		if len(found) != 1 || found[0].Str("pid") != strconv.Itoa(appPID) {
			t.Fatalf("app found: %v, want one line for pid %d", found, appPID)
		}
		// zerolog writes invalid UTF-8 as U+FFFD.
		if got, want := found[0].Str("comm"), strings.ToValidUTF8(oddComm, "\uFFFD"); got != want {
			t.Errorf("app comm %q, want %q", got, want)
		}
		exited := scenarios.LogWhere(p, scenarios.Is("app exited"))
		if len(exited) != 1 || exited[0].Str("exit_code") != "0" {
			t.Errorf("app exited: %v, want exit_code 0", exited)
		}
		if msg := p.TerminationMessage("supervisor"); !strings.Contains(msg, "success: app exit 0; action SIGTERM; sidecar stopped") {
			t.Errorf("termination message %q", msg)
		}
		strays := map[string]bool{}
		for _, l := range scenarios.LogWhere(p, scenarios.Is("process has a sidecar name but is not the main process of its container: not a sidecar, never stopped")) {
			strays[l.Str("container")+" "+l.Str("comm")] = true
		}
		if !strays["app pilot-agent"] || !strays["bystander pilot-agent"] {
			t.Errorf("stray warnings %v: want the decoys of app and bystander", strays)
		}
	})

	t.Run("stopped the sidecar and nothing else", func(t *testing.T) {
		if got := scenarios.Record(b.PilotRecord); len(got) < 1 || !slices.Equal(got[1:], []string{"signal SIGTERM", "exit 0"}) {
			t.Errorf("pilot-agent record %q, want start, signal SIGTERM, exit 0", got)
		}
		sig := scenarios.LogWhere(p, scenarios.Is("sidecar signalled"))
		if len(sig) != 1 || sig[0].Str("pid") != strconv.Itoa(sidecarPID) {
			t.Errorf("sidecar signalled: %v, want one line for pid %d", sig, sidecarPID)
		}
		decoys := 0
		for _, r := range []string{"app", "bystander", "exec-app", "exec-bystander", "late-app"} {
			for _, line := range scenarios.Record(rec(r)) {
				if strings.HasPrefix(line, "start ") && strings.Contains(line, `comm="pilot-agent"`) {
					decoys++
				}
				if strings.HasPrefix(line, "signal ") {
					t.Errorf("%s record: a decoy got %q", r, line)
				}
			}
		}
		if decoys != 6 {
			t.Errorf("%d decoys named pilot-agent started, want 6: a child in app, two in bystander, one exec'd into each, one late into app", decoys)
		}
		if by := p.Status().Container("bystander"); !by.Running {
			t.Errorf("bystander %+v: its main process was stopped", by)
		}
	})

	calls := parseStrace(t, trace)
	tids := map[int]bool{} // the supervisor's threads and children
	for _, c := range calls {
		tids[c.tid] = true
	}

	t.Run("signals only through pidfds, only the sidecar", func(t *testing.T) {
		sent := 0
		for _, c := range calls {
			switch c.name {
			case "pidfd_send_signal":
				target, sig := pidfdTarget(c.args), argN(c.args, 1)
				switch {
				case sig == "0" && tids[target]:
					// The Go runtime's probe of pidfd support, on itself
					// (the supervisor or its exit probe): signal 0
					// delivers nothing.
				case target == sidecarPID && sig == "SIGTERM":
					sent++
				default:
					t.Errorf("pidfd_send_signal(%s) = %s: not the sidecar's SIGTERM", c.args, c.ret)
				}
			case "tgkill":
				// The Go runtime preempts its own threads with SIGURG: in
				// the supervisor, or in its exit probe (its own child, and
				// the same binary).
				tgid, _ := strconv.Atoi(argN(c.args, 0))
				if !tids[tgid] || argN(c.args, 2) != "SIGURG" {
					t.Errorf("tgkill(%s): not the Go runtime's SIGURG to one of its own threads", c.args)
				}
			case "kill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "ptrace", "process_vm_readv",
				"process_vm_writev", "pidfd_getfd":
				t.Errorf("%s(%s) = %s: never called in this mode", c.name, c.args, c.ret)
			case "pidfd_open":
				pid, _ := strconv.Atoi(argN(c.args, 0))
				if pid != appPID && pid != sidecarPID && !tids[pid] && pid != supPID {
					t.Errorf("pidfd_open(%s) = %s: neither the app's nor the sidecar's main process", c.args, c.ret)
				}
			}
		}
		if sent != 1 {
			t.Errorf("%d SIGTERMs to the sidecar through its pidfd, want 1", sent)
		}
	})

	t.Run("opens no socket", func(t *testing.T) {
		for _, c := range calls {
			switch c.name {
			case "socket", "bind", "listen", "connect", "accept", "accept4":
				t.Errorf("%s(%s) = %s: a signal action needs no network", c.name, c.args, c.ret)
			}
		}
	})

	t.Run("reads only stat, cmdline and cgroup, and of the sidecar what its stop needs", func(t *testing.T) {
		checkOpens(t, calls, termLog, appPID, sidecarPID)
	})

	t.Run("log lines are JSON", func(t *testing.T) { checkJSONLog(t, out) })
}

// checkOpens asserts every file the supervisor opened is one it needs: of
// another process, only /proc/PID/{stat,cmdline,cgroup,mountinfo} (and the
// /proc listing, and /proc/PID itself, which the scan opens to read them), and of the sidecar's main process, which it stops, status
// (SigCgt, SigIgn) and task/*/children (has pilot-agent started envoy?),
// never environ (other containers' secrets), mem, maps, fd or
// anything else; of its own, the termination message and what the Go
// runtime reads at start. It also asserts that the scans were seen (the
// app's cmdline was opened), so that a broken trace cannot pass.
func checkOpens(t *testing.T, calls []straceCall, termLog string, appPID, sidecarPID int) {
	t.Helper()
	// Each file the supervisor may open besides /proc/PID/{stat,cmdline,cgroup}, and why.
	allowed := map[string]string{
		"/proc":          "the process listing (getdents)",
		termLog:          "the termination message it writes",
		"/dev/null":      "os/exec: the exit probe's stdio",
		"/etc/localtime": "the Go time package: the log's timestamps",
		"/proc/loadavg":  "the kernel's last PID, read while the apps are looked for (procscan.LastPID)",
		"/sys/kernel/mm/transparent_hugepage/hpage_pmd_size": "the Go runtime, at start",
		// The Go runtime sizes GOMAXPROCS from its own cgroup's CPU limit
		// (Go 1.25+): its own cgroup, never another container's.
		"/proc/self/cgroup":    "",
		"/proc/self/mountinfo": "",
	}
	goCPULimit := func(path string) bool {
		return strings.HasPrefix(path, "/sys/fs/cgroup/") && (strings.HasSuffix(path, "/cpu.max") ||
			strings.HasSuffix(path, "/cpu.cfs_quota_us") || strings.HasSuffix(path, "/cpu.cfs_period_us"))
	}
	// mountinfo: the Kubernetes name of each container's main process (and
	// of the supervisor's own), from the kubelet's termination-message mount.
	perPID := map[string]bool{"stat": true, "cmdline": true, "cgroup": true, "mountinfo": true}
	sawApp := false
	paths := openPaths{}
	for _, c := range calls {
		if c.name != "open" && c.name != "openat" && c.name != "openat2" && c.name != "creat" {
			continue
		}
		path := paths.path(c)
		if strings.HasSuffix(path, "/environ") {
			t.Errorf("%s(%s) = %s: another process's environment", c.name, c.args, c.ret)
			continue
		}
		if rest, ok := strings.CutPrefix(path, "/proc/"); ok {
			if _, err := strconv.Atoi(rest); err == nil {
				// The process's directory: the scan's handle on its files.
				continue
			}
			if pid, file, ok := strings.Cut(rest, "/"); ok {
				if n, err := strconv.Atoi(pid); err == nil {
					if n == sidecarPID && sidecarFile(file) {
						continue
					}
					if !perPID[file] {
						t.Errorf("%s(%s) = %s: /proc/PID/%s is not needed", c.name, c.args, c.ret, file)
					}
					if pid == strconv.Itoa(appPID) && file == "cmdline" {
						sawApp = true
					}
					continue
				}
			}
		}
		if _, ok := allowed[path]; !ok && !goCPULimit(path) {
			t.Errorf("%s(%s) = %s: not a file the supervisor needs", c.name, c.args, c.ret)
		}
	}
	if !sawApp {
		t.Errorf("no open of /proc/%d/cmdline in the trace: the scans were not seen", appPID)
	}
}

// sidecarFile: what the stop reads of the sidecar's main process, besides
// what every scan reads: status, task (the listing) and task/TID/children.
func sidecarFile(file string) bool {
	if file == "status" || file == "task" {
		return true
	}
	tid, rest, ok := strings.Cut(strings.TrimPrefix(file, "task/"), "/")
	_, err := strconv.Atoi(tid)
	return strings.HasPrefix(file, "task/") && ok && err == nil && rest == "children"
}

// started says whether a podsim hostile record has its start line.
func started(rec []string) bool {
	return slices.ContainsFunc(rec, func(l string) bool { return strings.HasPrefix(l, "start ") })
}
