package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// TestOnFailureRestart: a failed app is restarted by the kubelet as a new
// container; the sidecar stays up until the restart succeeds, then gets
// the (graceful) success action.
func TestOnFailureRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure"),
			container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(1))
		noSignalFor(t, h, 100*time.Millisecond)
		h.pod.add(container(procscan.App, "app-r1", 11))
		// OOM-killed: restarted again, after the kubelet's back-off.
		h.proc(11).exit(killed(exitwatch.SIGKILL))
		noSignalFor(t, h, backoff(2))
		h.pod.add(container(procscan.App, "app-r2", 12))
		h.proc(12).exit(exited(0))
		res := h.finish(Success, "SIGTERM 100")
		if len(res.Apps) != 1 || res.Apps[0].Container != "app-r2" {
			t.Errorf("decided on %+v, want only the last instance", res.Apps)
		}
	})
}

// TestOnFailureRestartDuringDiscovery: an app fails and is restarted while
// the supervisor still waits for another app container to start, and the
// restart and the late container show up in the same scan. The restart
// takes the failed one's slot (the exit is taken into account before the
// new containers), so the run ends when both succeed instead of awaiting a
// restart that already came.
func TestOnFailureRestartDuringDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APP_CONTAINERS=2"),
			container(procscan.App, "a", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(1))
		h.pod.mu.Lock()
		h.pod.containers = append(h.pod.containers, container(procscan.App, "a-r1", 11), container(procscan.App, "b", 20))
		h.pod.mu.Unlock()
		h.proc(11).exit(exited(0))
		h.proc(20).exit(exited(0))
		res, err := h.wait()
		if err != nil || res.Outcome != Success {
			t.Fatalf("res %+v err %v; log:\n%s", res, err, h.logged())
		}
		if !strings.Contains(h.logged(), `"container":"a-r1","replaces":"a"`) {
			t.Errorf("a-r1 not taken as a's restart; log:\n%s", h.logged())
		}
		if diff := cmp.Diff([]string{"SIGTERM 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestOnFailureOneProcessTwoCgroups: issue 15. A restarted app's main
// process is first seen before the runtime moved it into its cgroup (here
// "/", as procscan reports one when it cannot tell: no pause container to
// compare with), then in its real cgroup. It is one instance: it fills one
// slot, and its one exit 0 does not end the run while the other app still
// awaits its own restart.
func TestOnFailureOneProcessTwoCgroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APP_CONTAINERS=2"),
			container(procscan.App, "app0", 8), container(procscan.App, "app1", 16), container(procscan.Sidecar, "pilot-agent", 100))
		app0, app1 := h.proc(8), h.proc(16)
		app1.exit(exited(1))
		waitLog(t, h, `"container":"app1","restart":1`)
		moving := container(procscan.App, "/", 66) // app1's restart, not yet in its cgroup
		h.pod.add(moving)
		waitLog(t, h, `"container":"/","replaces":"app1"`)
		app0.exit(exited(1))
		waitLog(t, h, `"container":"app0","restart":1`)
		settled := container(procscan.App, "app1-r1", 66)
		h.pod.mu.Lock()
		for i, c := range h.pod.containers {
			if c.ID == "/" {
				h.pod.containers[i] = settled
			}
		}
		h.pod.mu.Unlock()
		// Let the run see pid 66 in app1-r1 (it scans while a restart is
		// awaited; a run that wrongly ended scans no more).
		waitLog(t, h, `"container":"app1-r1","was":"/","message":"app seen in another cgroup`)
		h.proc(66).exit(exited(0))
		noSignalFor(t, h, 200*time.Millisecond) // app0's restart is still to come
		h.pod.add(container(procscan.App, "app0-r1", 70))
		h.proc(70).exit(exited(0))
		res := h.finish(Success, "SIGTERM 100")
		var names []string
		for _, a := range res.Apps {
			names = append(names, a.Container)
		}
		if !strings.Contains(h.logged(), `"container":"app1-r1","was":"/","message":"app seen in another cgroup`) {
			t.Errorf("the move is not logged; log:\n%s", h.logged())
		}
		if diff := cmp.Diff([]string{"app1-r1", "app0-r1"}, names); diff != "" {
			t.Errorf("decided on (-want +got):\n%s\nlog:\n%s", diff, h.logged())
		}
	})
}

// TestAlways: the sidecar is never stopped on an app's exit; SIGTERM ends
// the idle supervisor.
func TestAlways(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, env := range [][]string{{"SUPERVISOR_RESTART_POLICY=Always"}, {"SUPERVISOR_RESTART_POLICY=Always", "SUPERVISOR_NATIVE_SIDECAR=true"}} {
			h := start(t, testConfig(t, env...), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
			synctest.Wait() // idle
			scans := h.pod.scanCount()
			noSignalFor(t, h, time.Hour)
			if got := h.pod.scanCount(); got != scans {
				t.Errorf("%v: idle supervisor scanned /proc %d more times", env, got-scans)
			}
			h.cancel()
			res, err := h.wait()
			if err != nil || !res.Deleted {
				t.Errorf("%v: res %+v err %v", env, res, err)
			}
		}
	})
}

// TestNativeSidecar: the kubelet stops a native sidecar; the supervisor
// stays out of the way and ends at once.
func TestNativeSidecar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_NATIVE_SIDECAR=true"), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		res, err := h.wait()
		if err != nil || res.Deleted || !strings.Contains(res.Summary, "native sidecar") || len(h.kernel.sent()) != 0 {
			t.Errorf("res %+v err %v signals %v", res, err, h.kernel.sent())
		}
	})
}

// TestSidecarActions: several sidecars, each with its own action.
func TestSidecarActions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, testConfig(t, "SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,cloud-sql-proxy,vault-agent",
			"SUPERVISOR_SIDECAR_ACTIONS=cloud-sql-proxy=SIGINT,vault-agent=http://127.0.0.1:8200/quit"), func(h *harness) {
			// vault-agent exits once it has answered its quit.
			h.answer = func(int) (int, error) {
				go h.kernel.proc(102).exit(exited(0))
				return 200, nil
			}
		}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100),
			container(procscan.Sidecar, "cloud-sql-proxy", 101), container(procscan.Sidecar, "vault-agent", 102))
		h.proc(10).exit(exited(3))
		h.finish(Failure, "SIGKILL 100", "SIGINT 101")
		if diff := cmp.Diff([]string{"http://127.0.0.1:8200/quit"}, h.postsSent()); diff != "" {
			t.Errorf("posts (-want +got):\n%s", diff)
		}
	})
}

// TestSidecarComesBack: a sidecar that reappears while being stopped
// (restarted by the kubelet) is stopped too, and the log says why it may
// have come back.
func TestSidecarComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t), container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
			if !h.pod.has("pilot-agent-r1") {
				h.pod.add(container(procscan.Sidecar, "pilot-agent-r1", 101))
			}
			return &exitwatch.Status{Known: true, Code: 0}
		})
		h.proc(10).exit(exited(0))
		res, err := h.wait()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100", "SIGTERM 101"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
		if !strings.Contains(h.logged(), "NATIVE_SIDECAR=true") {
			t.Errorf("no hint in the log:\n%s", h.logged())
		}
		_ = res
	})
}

// move replaces the container whose main process is pid by c.
func (f *fakePod) move(pid int, c procscan.Container) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.containers {
		if f.containers[i].Main.PID == pid {
			f.containers[i] = c
			return
		}
	}
	f.containers = append(f.containers, c)
}

func (f *fakePod) scanCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.scans
}

func (f *fakePod) has(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// TestHold: the hold returns once every app has exited, or at its bound.
func TestHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pod := &fakePod{containers: []procscan.Container{
			container(procscan.Pause, "pause", 1), container(procscan.Self, "istio-proxy", 2),
			container(procscan.App, "app", 10), container(procscan.App, "worker", 11),
		}}
		k := newFakeKernel()
		k.spawn(10)
		k.spawn(11)
		go func() {
			time.Sleep(30 * time.Millisecond)
			k.proc(10).exit(exited(143))
			time.Sleep(30 * time.Millisecond)
			k.proc(11).exit(exited(0))
		}()
		res, err := Hold(context.Background(), zerolog.Nop(), pod, k, 10*time.Second)
		if err != nil || res.TimedOut() || res.Apps != 2 {
			t.Fatalf("res %+v err %v", res, err)
		}
		if !strings.Contains(res.String(), "all 2 app containers have exited") {
			t.Errorf("%q", res)
		}
		if res.Elapsed != 60*time.Millisecond {
			t.Errorf("held for %v, want 60ms: until the last app's exit", res.Elapsed)
		}

		k2 := newFakeKernel()
		k2.spawn(10)
		k2.spawn(11).exit(exited(0))
		res, err = Hold(context.Background(), zerolog.Nop(), pod, k2, 50*time.Millisecond)
		if err != nil || !res.TimedOut() || !cmp.Equal(res.Left, []string{"app"}) {
			t.Fatalf("res %+v err %v, want a timeout with app left", res, err)
		}
		if !strings.Contains(res.String(), "gave up") {
			t.Errorf("%q", res)
		}
		if res.Elapsed != 50*time.Millisecond {
			t.Errorf("held for %v, want 50ms: the bound", res.Elapsed)
		}
	})
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	dst, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm() != 0o755 || fi.Size() == 0 {
		t.Errorf("installed %s: %v %v", dst, fi, err)
	}
	if _, err := Install(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "emptyDir") {
		t.Errorf("install into a missing dir: %v", err)
	}
}

// TestKindIsFirstSight: a container keeps the kind it had when first seen.
// An ignored container whose main process exited and into which a process
// named pilot-agent was exec'd (PPID 0: it now looks like the main one) is
// not a sidecar to stop; nor is an app's.
func TestKindIsFirstSight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, testConfig(t, "SUPERVISOR_IGNORE_PROCESSES=logrotate"),
			container(procscan.App, "app", 10), container(procscan.Ignored, "logs", 20),
			container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10)
		// Both containers' main processes end; an exec'd pilot-agent remains.
		h.pod.mu.Lock()
		for i, c := range h.pod.containers {
			if c.Name == "logs" || c.Name == "app" {
				impostor := container(procscan.Sidecar, c.Name, 30+i)
				impostor.ID = c.ID
				h.pod.containers[i] = impostor
			}
		}
		h.pod.mu.Unlock()
		h.proc(10).exit(exited(0))
		h.finish(Success, "SIGTERM 100")
	})
}

// TestOtherSaidOnce: a container neither waited for nor stopped (a native
// sidecar of the pod's own) is said once: not also when a scan sees it
// without its main process (between two of its restarts, a child left),
// before the one that pins its kind.
func TestOtherSaidOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		orphaned := container(procscan.Other, "logship", 50)
		orphaned.HasMain = false
		h := start(t, testConfig(t, "SUPERVISOR_APP_CONTAINERS=2"), container(procscan.App, "app", 10),
			orphaned, container(procscan.Sidecar, "pilot-agent", 100))
		time.Sleep(50 * time.Millisecond) // ten scans
		h.pod.remove("logship")
		h.pod.add(container(procscan.Other, "logship", 51))
		waitLog(t, h, `"message":"container neither waited for nor stopped"`)
		time.Sleep(50 * time.Millisecond)
		h.pod.add(container(procscan.App, "app2", 11))
		waitLog(t, h, `"container":"app2","uid":0,"method":"fake","message":"app found"`)
		h.proc(10).exit(exited(0))
		h.proc(11).exit(exited(0))
		h.finish(Success, "SIGTERM 100")
		if n := strings.Count(h.logged(), `"message":"container neither waited for nor stopped"`); n != 1 {
			t.Errorf("said %d times, want once; log:\n%s", n, h.logged())
		}
	})
}

// execdZombie is the container a scan makes of a process exec'd into an
// app container (kubectl exec: PPID 0, as a main process), seen once the
// app's main process has exited, as a zombie: its v1 cgroup lines read
// "/", so its content is no container's seen before; only its unified
// line (when the host has one) still names the container. The kubelet's
// mount is gone with it: no Kubernetes name.
func execdZombie(unified string, pid int) procscan.Container {
	c := container(procscan.App, "touch", pid)
	c.Main.Exiting, c.Main.State = true, "Z"
	c.Processes[0] = c.Main
	c.ID = "4:memory:/\n1:cpu:/"
	if unified != "" {
		c.ID += "\n" + unified
	}
	c.Name = procscan.Unified(c.ID)
	return c
}

// hybridContainer is kubeContainer on a cgroup v1/v2 hybrid host: its
// content has a unified line naming it.
func hybridContainer(kind procscan.Kind, name, comm string, pid int, id string) procscan.Container {
	c := kubeContainer(kind, name, comm, pid)
	c.ID = "4:memory:/k8s.io/" + id + "\n1:cpu:/k8s.io/" + id + "\n0::/k8s.io/" + id
	return c
}

// TestExecdZombieIsNoRestart: under OnFailure, a process exec'd into the
// failed app's container (the k8sjobs case's kubectl exec, still a zombie
// when the app's main process had exited) is not the app's restart, nor
// its exit 0 the app's: the real restart is waited for and decides. It
// failed in CI at 2ea57d4: the zombie, a container never seen to the
// scan, took the failed app's slot, and its real run was never waited for.
func TestExecdZombieIsNoRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APPS=flaky")
		h := startWith(t, cfg, func(h *harness) { h.pod.named = true },
			hybridContainer(procscan.App, "flaky", "sh", 10, "b92e15cf"),
			hybridContainer(procscan.Sidecar, "istio-proxy", "pilot-agent", 100, "1570"))
		h.proc(10)
		h.pod.mu.Lock()
		h.pod.containers[2] = execdZombie("0::/k8s.io/b92e15cf (deleted)", 30)
		h.pod.made++
		h.pod.mu.Unlock()
		h.proc(10).exit(exited(1))
		waitLog(t, h, `"message":"app failed under restartPolicy OnFailure`)
		noSignalFor(t, h, time.Second)
		if strings.Contains(h.logged(), `"replaces"`) {
			t.Fatalf("the exec'd zombie was taken for the restart; log:\n%s", h.logged())
		}
		h.pod.add(hybridContainer(procscan.App, "flaky", "sh", 40, "c0ffee"))
		h.proc(40).exit(exited(0))
		res := h.finish(Success, "SIGTERM 100")
		if len(res.Apps) != 1 || res.Apps[0].Container != "flaky" {
			t.Errorf("decided on %+v, want the restart alone", res.Apps)
		}
		if n := strings.Count(h.logged(), `"replaces":"flaky"`); n != 1 {
			t.Errorf("%d restarts said, want 1; log:\n%s", n, h.logged())
		}
	})
}

// TestExecdZombieV1: the same on a host of cgroup v1 alone, where nothing
// names the zombie's container: it started before the failed app's exit
// was seen, so it is no restart (execdBefore). One that started after it
// is the restart, seen only at its end (an app of milliseconds), as before.
func TestExecdZombieV1(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_RESTART_POLICY=OnFailure", "SUPERVISOR_APPS=flaky")
		h := startWith(t, cfg, func(h *harness) { h.pod.named = true },
			kubeContainer(procscan.App, "flaky", "sh", 10), kubeContainer(procscan.Sidecar, "istio-proxy", "pilot-agent", 100))
		h.proc(10)
		time.Sleep(time.Second)
		zombie := execdZombie("", 30)
		zombie.Main.StartTime = ticksAt(time.Now()) // exec'd while the app ran
		zombie.Processes[0] = zombie.Main
		time.Sleep(time.Second)
		h.pod.mu.Lock()
		h.pod.containers[2] = zombie
		h.pod.made++
		h.pod.mu.Unlock()
		h.proc(10).exit(exited(1))
		waitLog(t, h, `"message":"exiting process with no container named is no restart`)
		noSignalFor(t, h, time.Second)
		if strings.Contains(h.logged(), `"replaces"`) {
			t.Fatalf("the exec'd zombie was taken for the restart; log:\n%s", h.logged())
		}
		restart := execdZombie("", 40) // the restart, caught at its end
		restart.Main.StartTime = ticksAt(time.Now())
		restart.Main.Comm = "sh"
		restart.Processes[0] = restart.Main
		h.pod.add(restart)
		h.proc(40).exit(exited(0))
		h.finish(Success, "SIGTERM 100")
		if n := strings.Count(h.logged(), `"replaces":"flaky"`); n != 1 {
			t.Errorf("%d restarts said, want 1; log:\n%s", n, h.logged())
		}
		if n := strings.Count(h.logged(), `no restart`); n != 1 {
			t.Errorf("said %d times, want once; log:\n%s", n, h.logged())
		}
	})
}

// TestLeftRunningExitEndsNoWait: a sidecar left running (action none) that
// exits during the stop does not end the wait for the others: pilot-agent,
// which ignores its SIGTERM, still gets its SIGKILL after STOP_TIMEOUT.
func TestLeftRunningExitEndsNoWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_STOP_TIMEOUT=50ms", "SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,vault-agent",
			"SUPERVISOR_SIDECAR_ACTIONS=vault-agent=none")
		h := start(t, cfg, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100),
			container(procscan.Sidecar, "vault-agent", 102))
		h.kernel.setOnSignal(func(sig exitwatch.Signal) *exitwatch.Status {
			if sig == exitwatch.SIGKILL {
				return &exitwatch.Status{Known: true, Signal: exitwatch.SIGKILL}
			}
			// vault-agent ends on its own as pilot-agent is asked to stop.
			go h.kernel.proc(102).exit(exited(0))
			return nil
		})
		h.proc(10).exit(exited(0))
		if _, err := h.wait(); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"SIGTERM 100", "SIGKILL 100"}, h.kernel.sent()); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
	})
}

// TestRefusedNotAwaited: a sidecar the supervisor may not signal (another
// uid) is not awaited: the refusal lasts, so neither STOP_TIMEOUT nor a
// SIGKILL could end it. Refused its SIGTERM, the stop ends once the others
// have exited; asked over HTTP and still up, it gets its SIGKILL after
// STOP_TIMEOUT and, refused, is not awaited for the give-up wait after it.
// The summary says which one was refused.
func TestRefusedNotAwaited(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sidecar string
		pid     int
		actions string // SUPERVISOR_SIDECAR_ACTIONS
		took    time.Duration
		signals []string
		absent  string // not in the summary
	}{
		{"SIGTERM refused", "cloud-sql-proxy", 101, "", 0, []string{"SIGTERM 100", "SIGTERM 101"}, "SIGKILL"},
		{"SIGKILL refused", "vault-agent", 102, "vault-agent=http://127.0.0.1:8200/quit", 20 * time.Second,
			[]string{"SIGTERM 100", "SIGKILL 102"}, "still running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t, "SUPERVISOR_STOP_TIMEOUT=20s", "SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,"+tc.sidecar,
					"SUPERVISOR_SIDECAR_ACTIONS="+tc.actions)
				h := startWith(t, cfg, func(h *harness) {
					h.answer = func(int) (int, error) { return 200, nil } // and runs on
				}, container(procscan.App, "app", 10), container(procscan.Sidecar, "pilot-agent", 100),
					container(procscan.Sidecar, tc.sidecar, tc.pid))
				h.kernel.refuse(tc.pid)
				h.proc(10).exit(exited(0))
				ended := time.Now()
				res, err := h.wait()
				if err != nil {
					t.Fatal(err)
				}
				if d := time.Since(ended); d != tc.took {
					t.Errorf("the stop took %s (fake time), want %s: the refused sidecar was awaited", d, tc.took)
				}
				if diff := cmp.Diff(tc.signals, h.kernel.sent()); diff != "" {
					t.Errorf("signals (-want +got):\n%s", diff)
				}
				if !strings.Contains(res.Summary, "not permitted to signal "+tc.sidecar) || strings.Contains(res.Summary, tc.absent) {
					t.Errorf("summary %q", res.Summary)
				}
			})
		})
	}
}
