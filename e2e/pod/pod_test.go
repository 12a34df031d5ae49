package pod

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) { RunTests(m) }

// needTools skips the test unless it runs as root, and builds the tools.
func needTools(t *testing.T) Tools {
	t.Helper()
	NeedRoot(t)
	return MustTools(t)
}

// onBackends runs f as a subtest on every backend, named by it (the runc
// backend's runc installed if missing).
func onBackends(t *testing.T, tl Tools, f func(t *testing.T, b Backend)) {
	for _, b := range []Backend{Namespaces{Podsim: tl.Podsim}, MustRunc(t, tl)} {
		t.Run(b.Name(), func(t *testing.T) { f(t, b) })
	}
}

func startPod(t *testing.T, b Backend, spec Spec) *Pod {
	t.Helper()
	return MustStart(t, b, spec, nil)
}

// waitFor is p.WaitFor for a test: the status once cond holds; the test
// fails if ctx ends first.
func waitFor(t *testing.T, ctx context.Context, p *Pod, cond func(Status) bool) Status {
	t.Helper()
	st, err := p.WaitFor(ctx, cond)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// running is the condition that container name runs.
func running(name string) func(Status) bool {
	return func(s Status) bool { return s.Container(name).Running }
}

// TestPodShape: the containers see one another as a pod with
// shareProcessNamespace does: pause is PID 1, each main process has PPID 0,
// each container has its own cgroup (itself "/", others "/../name"), and
// uids are as set.
func TestPodShape(t *testing.T) {
	tl := needTools(t)
	onBackends(t, tl, func(t *testing.T, b Backend) {
		p := startPod(t, b, Spec{Name: "shape", Containers: []Container{
			{Name: "app", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}, UID: 1000, GID: 1000},
			{Name: "viewer", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}, UID: 1337, GID: 1337},
		}})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		waitFor(t, ctx, p, running("viewer"))
		out, err := p.Exec(ctx, "viewer", tl.Podsim, "ps")
		if err != nil {
			t.Fatalf("ps: %v\n%s", err, out)
		}
		procs := map[string][]string{} // by PID: PID PPID UID COMM CGROUP
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 5 {
				procs[f[0]] = f
			}
		}
		// PID 1 is pause, in its own cgroup.
		if f := procs["1"]; f == nil || f[3] != "podsim" || f[4] != "/../pause" {
			t.Errorf("PID 1 = %v, want pause in /../pause; ps:\n%s", f, out)
		}
		var app []string
		own := 0 // the viewer's main process and ps itself (exec'd from outside)
		for _, f := range procs {
			switch {
			case f[4] == "/../app" && f[1] == "0":
				app = f
			case f[4] == "/" && f[1] == "0" && f[3] == "podsim" && f[2] == "1337":
				own++
			}
		}
		if app == nil || app[2] != "1000" {
			t.Errorf("app main process = %v, want PPID 0, uid 1000, cgroup /../app; ps:\n%s", app, out)
		}
		if own != 2 {
			t.Errorf("%d processes of uid 1337 with PPID 0 in the viewer's cgroup, want 2 (its main process and the exec'd ps); ps:\n%s", own, out)
		}
	})
}

// TestPodPhases: exit codes are recorded and the phase follows the policy.
func TestPodPhases(t *testing.T) {
	tl := needTools(t)
	app := func(name string, args ...string) Container {
		return Container{Name: name, Argv: append([]string{tl.Podsim, "app"}, args...)}
	}
	tests := []struct {
		name   string
		policy RestartPolicy
		ctrs   []Container
		phase  Phase
		codes  map[string]int
	}{
		{"never ok", Never, []Container{app("a"), app("b", "--sleep", "100ms")}, Succeeded, map[string]int{"a": 0, "b": 0}},
		{"never fail", Never, []Container{app("a", "--exit", "3"), app("b")}, Failed, map[string]int{"a": 3, "b": 0}},
		{"never killed", Never, []Container{app("a", "--kill", "9")}, Failed, map[string]int{"a": 137}},
		{"onfailure ok", OnFailure, []Container{app("a")}, Succeeded, map[string]int{"a": 0}},
	}
	onBackends(t, tl, func(t *testing.T, b Backend) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p := startPod(t, b, Spec{Name: "phases", RestartPolicy: tt.policy, Containers: tt.ctrs})
				st := p.MustWaitPhase(t, 2*time.Minute)
				if st.Phase != tt.phase {
					t.Errorf("phase %s, want %s", st.Phase, tt.phase)
				}
				for name, code := range tt.codes {
					if got := st.Container(name).ExitCode; got != code {
						t.Errorf("%s exit %d, want %d", name, got, code)
					}
				}
			})
		}
	})
}

// TestPodRestartAndDelete: under OnFailure a failing container is restarted
// as a new container; deletion sends SIGTERM and the pod stops.
func TestPodRestartAndDelete(t *testing.T) {
	tl := needTools(t)
	onBackends(t, tl, func(t *testing.T, b Backend) {
		// The grace only bounds the wait for the server's exit on SIGTERM:
		// long, so that a slow exit is not taken for an ignored SIGTERM.
		p := startPod(t, b, Spec{Name: "restart", RestartPolicy: OnFailure, RestartBackoff: 50 * time.Millisecond,
			TerminationGracePeriod: time.Minute, Containers: []Container{
				{Name: "flaky", Argv: []string{tl.Podsim, "app", "--sleep", "50ms", "--exit", "1"}},
				{Name: "server", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
			}})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		waitFor(t, ctx, p, func(s Status) bool { return s.Container("flaky").Restarts >= 2 })
		if ph := p.Status().Phase; ph != Running {
			t.Errorf("phase while restarting = %s, want Running", ph)
		}
		st := p.Delete(ctx)
		// The app handles SIGTERM and exits 143, as a shell would report.
		if c := st.Container("server"); c.Running || c.ExitCode != 143 {
			t.Errorf("server after delete = %+v, want exit 143 after SIGTERM", c)
		}
		if !strings.Contains(p.Logs("server"), "app signal SIGTERM") {
			t.Errorf("server never got SIGTERM")
		}
	})
}

// TestPodNames: every container instance has the kubelet's
// termination-message mount, <root>/pods/<pod UID>/containers/<name>/<8
// hex>, a new file for each restart; with NoNames none has. Each run of
// flaky waits on a cue until its mount has been read.
func TestPodNames(t *testing.T) {
	tl := needTools(t)
	onBackends(t, tl, func(t *testing.T, b Backend) {
		for _, noNames := range []bool{false, true} {
			t.Run(fmt.Sprintf("nonames=%v", noNames), func(t *testing.T) {
				cue, mount := newCue(t)
				p := startPod(t, b, Spec{Name: "names", RestartPolicy: OnFailure, RestartBackoff: 50 * time.Millisecond, NoNames: noNames,
					Containers: []Container{
						{Name: "flaky", Argv: []string{tl.Podsim, "app", "--fifo", cue, "--exit", "1"}, Mounts: []Mount{mount}},
						{Name: "server", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
					}})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				seen := map[string]bool{}
				for run := 0; run < 2; run++ {
					st := waitFor(t, ctx, p, func(s Status) bool { c := s.Container("flaky"); return c.Running && c.Restarts == run })
					mount := kubeMount(t, st.Container("flaky").PID)
					if noNames {
						if mount != "" {
							t.Fatalf("a kubelet mount without names: %s", mount)
						}
						return
					}
					want := "/pods/" + p.UID + "/containers/flaky/"
					if !strings.Contains(mount, want) {
						t.Fatalf("flaky's mount %q lacks %q", mount, want)
					}
					seen[mount] = true
					release(t, cue)
					// The run is over before the next one waits on the cue.
					waitFor(t, ctx, p, func(s Status) bool { c := s.Container("flaky"); return !c.Running || c.Restarts > run })
				}
				if len(seen) < 2 {
					t.Errorf("the restart did not get a file of its own: %v", seen)
				}
				// server may still be starting: its PID is known once it runs.
				st := waitFor(t, ctx, p, running("server"))
				if m := kubeMount(t, st.Container("server").PID); !strings.Contains(m, "/containers/server/") {
					t.Errorf("server's mount: %q", m)
				}
			})
		}
	})
}

// newCue makes a FIFO for `podsim app --fifo`, at one path on the host and
// in every container (the runc backend's need the returned mount): the
// app runs until release.
func newCue(t *testing.T) (path string, mount Mount) {
	t.Helper()
	dir := t.TempDir()
	path = filepath.Join(dir, "cue")
	if err := MakeCue(path); err != nil {
		t.Fatal(err)
	}
	return path, Mount{Host: dir, Container: dir}
}

// release ends the run of the app waiting on the cue (ReleaseCue, within
// a minute).
func release(t *testing.T, cue string) {
	t.Helper()
	if err := ReleaseCue(cue, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// kubeMount is the root (field 4) of pid's mount whose source lies under
// a kubelet-like "pods/UID/containers" directory, or "".
func kubeMount(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.Contains(f[3], "/containers/") && strings.Contains(f[3], "/pods/") {
			return f[3]
		}
	}
	return ""
}

// TestPodNativeAndEphemeral: a native sidecar starts before the app without
// holding it back, is restarted when it exits, is stopped (SIGTERM) once the
// app is done, and keeps the pod Running until then; an ephemeral container
// started while the app runs does not count in the phase.
func TestPodNativeAndEphemeral(t *testing.T) {
	tl := needTools(t)
	onBackends(t, tl, func(t *testing.T, b Backend) {
		// The app runs until the native sidecar has been restarted and
		// the ephemeral container runs.
		cue, mount := newCue(t)
		p := startPod(t, b, Spec{Name: "native", RestartPolicy: Never, RestartBackoff: 50 * time.Millisecond,
			Containers: []Container{
				{Name: "logship", Native: true, Argv: []string{tl.Podsim, "app", "--sleep", "300ms"}},
				{Name: "app", Argv: []string{tl.Podsim, "app", "--fifo", cue}, Mounts: []Mount{mount}},
				{Name: "debugger", Ephemeral: true, Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
			}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		waitFor(t, ctx, p, running("app"))
		if err := p.StartEphemeral(ctx, "debugger"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, p, func(s Status) bool { return s.Container("logship").Restarts >= 1 })
		release(t, cue)
		st := waitFor(t, ctx, p, func(s Status) bool { return s.Phase == Succeeded || s.Phase == Failed })
		if st.Phase != Succeeded {
			t.Errorf("phase %s, want Succeeded (%s)", st.Phase, st)
		}
		if c := st.Container("logship"); c.Restarts < 1 || c.Running {
			t.Errorf("native sidecar %+v: want restarted while the app ran, and stopped after it", c)
		}
		if c := st.Container("debugger"); !c.Running {
			t.Errorf("ephemeral container %+v: want still running (it does not hold the phase)", c)
		}
	})
}

// TestPodStartAfter: a container held back by StartAfter starts only once
// it returns, and the containers after it wait too; one still held back
// when the pod is closed never starts, and Close does not wait for it.
func TestPodStartAfter(t *testing.T) {
	tl := needTools(t)
	never := func(ctx context.Context, p *Pod) error { <-ctx.Done(); return ctx.Err() }
	onBackends(t, tl, func(t *testing.T, b Backend) {
		p := startPod(t, b, Spec{Name: "after", Containers: []Container{
			{Name: "first", Argv: []string{tl.Podsim, "app", "--exit", "3"}},
			{Name: "second", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}, StartAfter: When(Ended("first"))},
			{Name: "third", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
			{Name: "held", Argv: []string{tl.Podsim, "app"}, StartAfter: never},
		}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		early := ""
		waitFor(t, ctx, p, func(s Status) bool {
			first, second, third := s.Container("first"), s.Container("second"), s.Container("third")
			if (second.Started && first.Running) || (third.Started && !second.Started) {
				early = s.String()
			}
			return third.Running
		})
		if early != "" {
			t.Errorf("a container started before the one it waits for: %s", early)
		}
		if c := p.Status().Container("first"); c.ExitCode != 3 {
			t.Errorf("first %+v, want exit 3", c)
		}
		begun := time.Now()
		if err := p.Close(); err != nil {
			t.Errorf("close with a container held back: %v", err)
		}
		if c := p.Status().Container("held"); c.Started {
			t.Errorf("held %+v: started although StartAfter never returned", c)
		}
		t.Logf("closed in %s", time.Since(begun).Round(time.Millisecond))
	})
}

// TestLogMeansRunning: a container's output is seen only once its status
// says it runs, with its PID, as `kubectl logs` has nothing of a container
// the kubelet has not started. Tests wait for a log line and then read the
// PID from the status (scenarios TestSupervisorImage did, and failed once
// in a clean-clone CI run with "open /proc/0/status": the supervisor had
// logged before runc's start had returned). Many containers, each
// printing at once, on every backend.
func TestLogMeansRunning(t *testing.T) {
	tl := needTools(t)
	const n = 12
	onBackends(t, tl, func(t *testing.T, b Backend) {
		var cs []Container
		for i := range n {
			cs = append(cs, Container{Name: fmt.Sprintf("c%d", i), Argv: []string{tl.Podsim, "app", "--sleep", "1h"}})
		}
		p := startPod(t, b, Spec{Name: "logs", Containers: cs})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, c := range cs {
			var st ContainerStatus
			if err := p.Await(ctx, func() bool {
				if p.Logs(c.Name) == "" {
					return false
				}
				st = p.Status().Container(c.Name)
				return true
			}); err != nil {
				t.Fatalf("%s: no output: %v", c.Name, err)
			}
			if !st.Running || st.PID <= 0 {
				t.Errorf("%s has written %q, yet its status is %+v", c.Name, p.Logs(c.Name), st)
			}
		}
	})
}

// TestPodLeftovers: when a main process ends, what it left in its
// container is killed (runc does it, as containerd's shim; on namespaces
// KillAll); a signal death reads 128+signal; Close leaves no container, no
// cgroup, no pause and no pod directory behind.
func TestPodLeftovers(t *testing.T) {
	tl := needTools(t)
	onBackends(t, tl, func(t *testing.T, b Backend) {
		// parent runs until its processes have been counted.
		cue, mount := newCue(t)
		p := startPod(t, b, Spec{Name: "leftovers", Containers: []Container{
			{Name: "viewer", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
			{Name: "parent", Argv: []string{tl.Podsim, "app", "--fifo", cue, "--orphan", "1h", "--kill", "15"}, Mounts: []Mount{mount}},
		}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		waitFor(t, ctx, p, running("parent"))
		// awaitParent runs ps in viewer until it sees n processes in
		// parent's container, within ctx: nothing tells when the app has
		// started its orphan-to-be, nor when a leftover is gone (the
		// namespaces backend's cgroup.kill is not waited for).
		awaitParent := func(n int, failure string) {
			for {
				out, err := p.Exec(ctx, "viewer", tl.Podsim, "ps")
				if err != nil {
					t.Fatalf("ps: %v\n%s", err, out)
				}
				if strings.Count(string(out), "/../parent\n") == n {
					return
				}
				if ctx.Err() != nil {
					t.Fatalf("%s; ps:\n%s", failure, out)
				}
			}
		}
		awaitParent(2, "parent's container never held the app and its orphan-to-be")
		release(t, cue)
		st := waitFor(t, ctx, p, Ended("parent"))
		if c := st.Container("parent"); c.ExitCode != 143 {
			t.Errorf("parent killed by SIGTERM: exit %d, want 143", c.ExitCode)
		}
		awaitParent(0, "the orphan outlived its container")
		// While the pod runs its cgroups exist; after Close, none.
		dirs, err := runcCgroupDirs(filepath.Base(p.Dir))
		if st, ok := p.BackendState.(*nsState); ok {
			dirs = []string{st.cgroup}
		}
		if err != nil || len(dirs) == 0 {
			t.Fatalf("pod cgroups: %v, %v", dirs, err)
		}
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, "viewer")); err != nil {
				t.Errorf("viewer's cgroup: %v", err)
			}
		}
		pause := p.PausePID
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("cgroup %s left after Close (%v)", d, err)
			}
		}
		if _, err := os.Stat(p.Dir); !os.IsNotExist(err) {
			t.Errorf("pod dir %s left after Close", p.Dir)
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pause)); !os.IsNotExist(err) {
			t.Errorf("pause pid %d still there after Close", pause)
		}
	})
}

// TestCgroupHold: on the namespaces backend, each attempt's main process
// stays out of its container's cgroup until CgroupHold returns, and the
// container reads as running only after that; an error fails the start.
func TestCgroupHold(t *testing.T) {
	tl := needTools(t)
	var held []string // each attempt's cgroup.procs, read while held
	hold := func(ctx context.Context, p *Pod, attempt int) error {
		dir := filepath.Join(p.BackendState.(*nsState).cgroup, "app")
		if attempt > 0 {
			dir += "-r1"
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		held = append(held, strings.TrimSpace(string(b)))
		if s := p.Status().Container("app"); s.Running {
			t.Errorf("attempt %d reads as running while held out of its cgroup", attempt)
		}
		return err
	}
	p := startPod(t, Namespaces{Podsim: tl.Podsim}, Spec{Name: "hold", RestartPolicy: OnFailure, RestartBackoff: 50 * time.Millisecond,
		Containers: []Container{{Name: "app", Argv: []string{tl.Podsim, "app", "--fail-first", "1", "--record", filepath.Join(t.TempDir(), "app.record")},
			CgroupHold: hold}}})
	st := p.MustWaitPhase(t, 2*time.Minute)
	if c := st.Container("app"); st.Phase != Succeeded || c.Restarts != 1 {
		t.Errorf("status %s, want Succeeded after one restart", st)
	}
	if len(held) != 2 || held[0] != "" || held[1] != "" {
		t.Errorf("cgroup.procs while held: %q, want both attempts' empty", held)
	}
}

// TestRuncSecurity: the CRI's default capabilities unless Caps says
// otherwise, none for Caps: []int{}, no_new_privs, uid and gid.
func TestRuncSecurity(t *testing.T) {
	tl := needTools(t)
	b := MustRunc(t, tl)
	p := startPod(t, b, Spec{Name: "security", Containers: []Container{
		{Name: "root", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
		{Name: "default", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}, UID: 1000, GID: 1000},
		{Name: "locked", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}, UID: 1337, GID: 1337, Caps: []int{}, NoNewPrivs: true},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitFor(t, ctx, p, running("locked"))
	def := CapMask(DefaultCaps...)
	tests := []struct {
		name                   string
		uid, bnd, eff, noNewPr string
	}{
		// Root keeps the set; a non-root process loses its effective
		// capabilities at execve, as in any container runtime.
		{"root", "0", def, def, "0"},
		{"default", "1000", def, CapMask(), "0"},
		{"locked", "1337", CapMask(), CapMask(), "1"},
	}
	for _, tt := range tests {
		st, err := ProcStatus(p.Status().Container(tt.name).PID)
		if err != nil {
			t.Fatal(err)
		}
		got := []string{strings.Fields(st["Uid"])[0], strings.Fields(st["Gid"])[0], st["CapBnd"], st["CapEff"], st["NoNewPrivs"]}
		want := []string{tt.uid, tt.uid, tt.bnd, tt.eff, tt.noNewPr}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: uid gid CapBnd CapEff NoNewPrivs = %q, want %q", tt.name, got, want)
		}
	}
}

// TestRuncFilesystem: a container's own rootfs, read-only when asked, with
// bind mounts and the termination message file mounted where it says.
func TestRuncFilesystem(t *testing.T) {
	tl := needTools(t)
	b := MustRunc(t, tl)
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	data := filepath.Join(dir, "data")
	for _, d := range []string{rootfs, data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(tl.Podsim, filepath.Join(rootfs, "podsim")); err != nil {
		t.Fatal(err)
	}
	app := func(name string, args ...string) Container {
		return Container{Name: name, Rootfs: rootfs, ReadOnlyRootfs: true, Argv: append([]string{"/podsim", "app"}, args...),
			Mounts: []Mount{{Host: data, Container: "/data"}}, TerminationMessage: "/dev/termination-log"}
	}
	p := startPod(t, b, Spec{Name: "fs", Containers: []Container{
		app("mount", "--record", "/data/mount.record"),
		app("message", "--record", "/dev/termination-log", "--exit", "4"),
		app("readonly", "--record", "/readonly.record"),
	}})
	st := p.MustWaitPhase(t, 2*time.Minute)
	if c := st.Container("message"); c.ExitCode != 4 {
		t.Errorf("message exit %d, want 4", c.ExitCode)
	}
	if b, err := os.ReadFile(filepath.Join(data, "mount.record")); err != nil || !strings.Contains(string(b), "app exit 0") {
		t.Errorf("record through the bind mount: %q, %v", b, err)
	}
	if msg := p.TerminationMessage("message"); !strings.Contains(msg, "app exit 4") {
		t.Errorf("termination message %q, want the app's record", msg)
	}
	if logs := p.Logs("readonly"); !strings.Contains(logs, "read-only file system") {
		t.Errorf("a write to the read-only rootfs did not fail:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "readonly.record")); err == nil {
		t.Errorf("the container wrote into its read-only rootfs")
	}
}
