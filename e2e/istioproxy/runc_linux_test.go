package istioproxy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
)

// requireRunc returns runc's path, installing Debian's package through
// lib.sh's apt_install when it is missing (idempotent).
func requireRunc(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("runc"); err == nil {
		return p
	}
	out, err := exec.Command("bash", "-c", ". ../scripts/lib.sh && apt_install runc").CombinedOutput()
	if err != nil {
		t.Fatalf("installing runc with e2e/scripts/lib.sh apt_install: %v\n%s", err, out)
	}
	p, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("runc still missing after apt_install: %v", err)
	}
	return p
}

// runcSpec is a minimal OCI runtime spec for the istio-proxy container:
// the tree as a read-only rootfs, cwd "/", uid 1337, the writable
// directories bind-mounted read-write over it (as emptyDirs are), and the
// network namespace of the test's netns joined by path.
func runcSpec(p *istioproxy.Proxy, netnsPath string) map[string]any {
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, w := range p.Writable {
		mounts = append(mounts, map[string]any{
			"destination": "/" + w, "type": "bind", "source": p.Path(w), "options": []string{"rbind", "rw"},
		})
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user":            map[string]any{"uid": p.UID, "gid": p.GID},
			"args":            p.Argv,
			"env":             p.Env,
			"cwd":             "/",
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": p.Root, "readonly": true},
		"hostname": "job",
		"mounts":   mounts,
		"linux": map[string]any{
			"namespaces": []map[string]any{
				{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
				{"type": "network", "path": netnsPath},
			},
		},
	}
}

// TestRunc runs the same tree as a runc container: rootfs = Root, cwd = /,
// read-only root with only Proxy.Writable bind-mounted writable, uid 1337.
// It becomes ready and SIGTERM (forwarded by `runc run`) drains and exits 0.
func TestRunc(t *testing.T) {
	requireRoot(t)
	runc := requireRunc(t)
	tools, err := buildTools()
	if err != nil {
		t.Fatalf("building the tools with e2e/%s failed: %v", istioproxy.BuildScript, err)
	}
	dir := t.TempDir()
	p, err := istioproxy.Prepare(filepath.Join(dir, "rootfs"), istioproxy.Config{Tools: tools, TerminationDrainDuration: time.Second})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	ns := newNetns(t)
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := json.MarshalIndent(runcSpec(p, ns.path), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("istioproxy-test-%d", os.Getpid())
	state := filepath.Join(dir, "runc-state")
	cmd := exec.Command(runc, "--root", state, "run", "--bundle", bundle, id)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	a := &agent{t: t, proxy: p, ns: ns, http: ns.httpClient(requestGuard), cmd: cmd, out: out, done: make(chan struct{})}
	a.started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("runc run: %v", err)
	}
	a.watch("runc run "+id,
		func() { _ = exec.Command(runc, "--root", state, "kill", id, "KILL").Run() },
		func() { _ = exec.Command(runc, "--root", state, "delete", "--force", id).Run() })

	ready := a.waitReady(ctxTimeout(t, readyGuard))
	t.Logf("ready in runc after %v", ready.Round(time.Millisecond))
	start := a.envoyStart()
	if start.UID == nil || *start.UID != istioproxy.ProxyUID {
		t.Errorf("envoy runs as uid %v, want %d", start.UID, istioproxy.ProxyUID)
	}

	sent := a.signal(syscall.SIGTERM)
	// pilot-agent's exit is runc run's.
	if took := a.exitZero(t, sent, p.TerminationDrainDuration+exitGuard, "SIGTERM (through runc)"); took < p.TerminationDrainDuration {
		t.Errorf("SIGTERM to exit %v, less than terminationDrainDuration %v", took, p.TerminationDrainDuration)
	}
	drains := record.OfKind(a.record(), record.Drain)
	if len(drains) != 1 || !drains[0].Graceful || !drains[0].InboundOnly {
		t.Errorf("drains %v, want one graceful inboundonly", drains)
	} else {
		a.checkDrainThenWait(drains[0], sent, p.TerminationDrainDuration)
	}
	if strings.Contains(out.String(), "read-only file system") {
		t.Errorf("something wrote outside the writable mounts:\n%s", out.String())
	}
}
