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

// procStatus reads fields of a host process's /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func capMask(caps []int) string {
	var m uint64
	for _, c := range caps {
		m |= 1 << c
	}
	return fmt.Sprintf("%016x", m)
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
	if _, err := p.WaitRunning(ctx, "locked", 0); err != nil {
		t.Fatal(err)
	}
	def := capMask(DefaultCaps)
	tests := []struct {
		name                   string
		uid, bnd, eff, noNewPr string
	}{
		// Root keeps the set; a non-root process loses its effective
		// capabilities at execve, as in any container runtime.
		{"root", "0", def, def, "0"},
		{"default", "1000", def, capMask(nil), "0"},
		{"locked", "1337", capMask(nil), capMask(nil), "1"},
	}
	for _, tt := range tests {
		st := procStatus(t, p.Status().Container(tt.name).PID)
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

// TestRuncLeftovers: when a main process ends, what it left in its
// container is killed (runc does it, as containerd's shim); a signal death
// reads 128+signal; Close leaves no runc container and no cgroup behind.
func TestRuncLeftovers(t *testing.T) {
	tl := needTools(t)
	b := MustRunc(t, tl)
	// parent runs until its processes have been counted.
	cue, mount := newCue(t)
	p := startPod(t, b, Spec{Name: "leftovers", Containers: []Container{
		{Name: "viewer", Argv: []string{tl.Podsim, "app", "--sleep", "1h"}},
		{Name: "parent", Argv: []string{tl.Podsim, "app", "--fifo", cue, "--orphan", "1h", "--kill", "15"}, Mounts: []Mount{mount}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.WaitRunning(ctx, "parent", 0); err != nil {
		t.Fatal(err)
	}
	// The app starts its orphan-to-be after its own start: look until
	// both are there (the app waits on its cue meanwhile).
	for {
		out, err := p.Exec(ctx, "viewer", tl.Podsim, "ps")
		if err != nil {
			t.Fatalf("ps: %v\n%s", err, out)
		}
		n := strings.Count(string(out), "/../parent\n")
		if n == 2 {
			break
		}
		if n > 2 || ctx.Err() != nil {
			t.Fatalf("parent's container holds %d processes, want 2 (the app and its orphan-to-be); ps:\n%s", n, out)
		}
	}
	release(t, cue)
	st, err := p.WaitFor(ctx, Ended("parent"))
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Container("parent"); c.ExitCode != 143 {
		t.Errorf("parent killed by SIGTERM: exit %d, want 143", c.ExitCode)
	}
	out, err := p.Exec(ctx, "viewer", tl.Podsim, "ps")
	if err != nil {
		t.Fatalf("ps: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "/../parent") {
		t.Errorf("the orphan outlived its container:\n%s", out)
	}
	// While the pod runs its cgroups exist; after Close, none.
	dirs, err := runcCgroupDirs(filepath.Base(p.Dir))
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
		t.Errorf("pod dir %s (runc's state) left after Close", p.Dir)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pause)); !os.IsNotExist(err) {
		t.Errorf("pause pid %d still there after Close", pause)
	}
}
