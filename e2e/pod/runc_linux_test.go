package pod

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	waitFor(t, ctx, p, running("locked"))
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
