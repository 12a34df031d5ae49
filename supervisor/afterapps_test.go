package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// kubeContainer is container named as the kubelet names it.
func kubeContainer(kind procscan.Kind, name, comm string, pid int) procscan.Container {
	c := container(kind, comm, pid)
	c.ID, c.Name, c.Kube = name, name, procscan.Kube{Name: name, PodUID: "0f3c5a2b-1111-2222-3333-444444444444"}
	return c
}

// TestAfterAppsStartsTheLook: with the supervisor placed before the apps,
// an app not yet seen may still have its image pulled: the look for it
// (APP_START_TIMEOUT) counts only from the first sighting of a container
// the kubelet starts after the apps (istio-proxy), never from the
// supervisor's start.
func TestAfterAppsStartsTheLook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_APPS=app,late", "SUPERVISOR_AFTER_APPS=istio-proxy",
			"SUPERVISOR_APP_START_TIMEOUT=100ms", "SUPERVISOR_AFTER_APPS_TIMEOUT=1m")
		h := startWith(t, cfg, func(h *harness) { h.pod.named = true }, kubeContainer(procscan.App, "app", "job", 10))
		h.proc(10).exit(exited(0))
		// The images take their time: half of AFTER_APPS_TIMEOUT, 300
		// times APP_START_TIMEOUT.
		time.Sleep(cfg.AfterAppsTimeout / 2)
		synctest.Wait()
		select {
		case r := <-h.result:
			t.Fatalf("the run ended before istio-proxy was seen: %+v; log:\n%s", r.res, h.logged())
		default:
		}
		h.pod.add(kubeContainer(procscan.Sidecar, "istio-proxy", "pilot-agent", 100))
		waitLog(t, h, "a container started after the apps is seen")
		seen := time.Now()
		res := h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, seen.Add(cfg.AppStartTimeout), "APP_START_TIMEOUT after istio-proxy's sighting")
		if !strings.Contains(res.Reason, "late") || !strings.Contains(res.Reason, "never seen within SUPERVISOR_APP_START_TIMEOUT") {
			t.Errorf("reason %q", res.Reason)
		}
		if !strings.Contains(h.logged(), "a container started after the apps is seen") {
			t.Errorf("no log line for istio-proxy's sighting:\n%s", h.logged())
		}
	})
}

// TestAfterAppsTimeout: the wait for a container started after the apps
// is itself bounded.
func TestAfterAppsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_APPS=app", "SUPERVISOR_AFTER_APPS=istio-proxy",
			"SUPERVISOR_APP_START_TIMEOUT=10ms", "SUPERVISOR_AFTER_APPS_TIMEOUT=150ms", "SUPERVISOR_SIDECAR_START_TIMEOUT=50ms")
		began := time.Now()
		h := startWith(t, cfg, func(h *harness) { h.pod.named = true })
		res := h.finish(Unknown)
		// The look, then the wait for a sidecar to stop: both bounded.
		if took, want := time.Since(began), cfg.AfterAppsTimeout+cfg.SidecarStartTimeout; took != want {
			t.Errorf("the run took %v, want AFTER_APPS_TIMEOUT and SIDECAR_START_TIMEOUT (%v)", took, want)
		}
		if !strings.Contains(res.Reason, "never seen within SUPERVISOR_AFTER_APPS_TIMEOUT (none of SUPERVISOR_AFTER_APPS was seen either)") {
			t.Errorf("reason %q", res.Reason)
		}
	})
}

// TestAfterAppsUnnamed: where the kubelet's names cannot be read, the
// setting cannot work: it is ignored, with a warning, and the look counts
// from the start.
func TestAfterAppsUnnamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_AFTER_APPS=istio-proxy",
			"SUPERVISOR_APP_START_TIMEOUT=50ms", "SUPERVISOR_AFTER_APPS_TIMEOUT=1h")
		began := time.Now()
		h := start(t, cfg, container(procscan.App, "app-a", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res := h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, began.Add(cfg.AppStartTimeout), "APP_START_TIMEOUT after the start")
		if !strings.Contains(res.Reason, "never seen within SUPERVISOR_APP_START_TIMEOUT") {
			t.Errorf("reason %q", res.Reason)
		}
		if !strings.Contains(h.logged(), "SUPERVISOR_AFTER_APPS ignored") {
			t.Errorf("no warning:\n%s", h.logged())
		}
	})
}

// TestAfterAppsConfig: a container cannot be both an app and one started
// after the apps; the names are checked like the others.
func TestAfterAppsConfig(t *testing.T) {
	for env, want := range map[string]string{
		"SUPERVISOR_AFTER_APPS=job":       `SUPERVISOR_AFTER_APPS="job": "job" is also in SUPERVISOR_APPS`,
		"SUPERVISOR_AFTER_APPS=Istio":     `SUPERVISOR_AFTER_APPS="Istio": "Istio": want container names`,
		"SUPERVISOR_AFTER_APPS_TIMEOUT=0": `SUPERVISOR_AFTER_APPS_TIMEOUT="0": want a positive duration`,
	} {
		_, _, err := LoadConfig([]string{"SUPERVISOR_APPS=job", env})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %s", env, err, want)
		}
	}
}

// TestLookWithoutReadyFile: where the ready file cannot be written, the
// kubelet's hooks on it hold the apps back up to WaitLimit: the look for
// them counts APP_START_TIMEOUT from there, so that an app so held is not
// counted missing as it starts.
func TestLookWithoutReadyFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		// A directory under a file: unwritable, even for root.
		cfg := testConfig(t, "SUPERVISOR_APP_CONTAINERS=2", "SUPERVISOR_APP_START_TIMEOUT=50ms", "SUPERVISOR_STATE_DIR="+file+"/state")
		began := time.Now()
		h := start(t, cfg, container(procscan.App, "app-a", 10), container(procscan.Sidecar, "pilot-agent", 100))
		h.proc(10).exit(exited(0))
		res := h.finish(Unknown, "SIGTERM 100")
		h.signalledAt(0, began.Add(cfg.AppStartTimeout+WaitLimit), "APP_START_TIMEOUT after the ready file's bound")
		if !strings.Contains(res.Reason, "never seen within SUPERVISOR_APP_START_TIMEOUT, plus the 30s the kubelet's hooks wait for the ready file") {
			t.Errorf("reason %q", res.Reason)
		}
		if !strings.Contains(h.logged(), "cannot write the ready file") {
			t.Errorf("no warning:\n%s", h.logged())
		}
	})
}
