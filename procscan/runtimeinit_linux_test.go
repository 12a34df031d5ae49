package procscan

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRealRuntimeInits: a container created, not yet started, by the real
// runc and crun (Debian's, which e2e/scripts/install-deps.sh installs, and
// e2e/test.sh runs that first): its init process, as this package reads it,
// is a runtime's init; once started, the same process (PID and start time)
// is the entrypoint, and no longer is. TestRuntimeInitIsNotAnApp has the
// names of runtimes not installed here.
func TestRealRuntimeInits(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates containers")
	}
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"runc", "crun"} {
		t.Run(name, func(t *testing.T) {
			bin, err := exec.LookPath(name)
			if err != nil {
				t.Skipf("%s is not installed (e2e/scripts/install-deps.sh installs it): %v", name, err)
			}
			rt := runtimeCmd(t, name, bin)
			id := "procscan-" + name + "-" + strconv.Itoa(os.Getpid())
			bundle := testBundle(t, rt)
			// Before create: a create that fails half-way may leave an init.
			t.Cleanup(func() {
				rt(t, "kill", id, "KILL")
				rt(t, "delete", "--force", id)
			})
			rt(t, "create", "--bundle", bundle, id)
			var state struct{ Pid int }
			if err := json.Unmarshal(rt(t, "state", id), &state); err != nil || state.Pid <= 0 {
				t.Fatalf("%s state: pid %d, %v", name, state.Pid, err)
			}
			created, err := s.Process(state.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if !runtimeInit(created) || created.UID != 1337 {
				t.Errorf("created: comm %q argv0 %q uid %d: want %s's init, with the container's uid 1337", created.Comm, created.Argv0, created.UID, name)
			}
			// runc runs its init as "runc init" (Process.InitArg); crun's is
			// a fork of `crun create`.
			if created.InitArg != (name == "runc") {
				t.Errorf("created: InitArg %v, want %v for %s's init", created.InitArg, name == "runc", name)
			}
			rt(t, "start", id)
			// The event: the init's exec of the entrypoint, which changes its comm.
			started := created
			for deadline := time.Now().Add(time.Minute); started.Comm == created.Comm; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the init (pid %d) never exec'd the entrypoint within a minute of %s start", created.PID, name)
				}
				if started, err = s.Process(state.Pid); err != nil {
					t.Fatal(err)
				}
			}
			if runtimeInit(started) || started.Comm != "sleep" || started.StartTime != created.StartTime {
				t.Errorf("started: comm %q argv0 %q start %d (created: %d): want the entrypoint sleep, in place", started.Comm, started.Argv0, started.StartTime, created.StartTime)
			}
			t.Logf("%s: created as comm %q argv0 %q; started as %q", name, created.Comm, created.Argv0, started.Comm)
		})
	}
}

// runtimeCmd runs an OCI runtime's command, with a state root of the test's.
// crun refuses a cgroup v1/v2 hybrid host (this one, and older nodes) unless
// it manages no cgroups; it then also wants /sys/fs/cgroup to read as
// cgroup v2, which a private mount namespace gives it.
func runtimeCmd(t *testing.T, name, bin string) func(*testing.T, ...string) []byte {
	root := t.TempDir()
	return func(t *testing.T, args ...string) []byte {
		t.Helper()
		argv := append([]string{bin, "--root", root}, args...)
		if name == "crun" {
			argv = append([]string{"unshare", "-m", "sh", "-c",
				`mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup && exec "$@"`, "sh",
				bin, "--root", root, "--cgroup-manager=disabled"}, args...)
		}
		// Files, not pipes: the container's init inherits the runtime's
		// stdio, and a pipe it holds would never reach EOF. Stdout apart
		// from stderr: `state` prints the JSON read back.
		dir := t.TempDir()
		out, err := os.Create(filepath.Join(dir, "stdout"))
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		errs, err := os.Create(filepath.Join(dir, "stderr"))
		if err != nil {
			t.Fatal(err)
		}
		defer errs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = out, errs
		err = cmd.Run()
		b, _ := os.ReadFile(out.Name())
		if err != nil && args[0] != "kill" && args[0] != "delete" {
			e, _ := os.ReadFile(errs.Name())
			t.Fatalf("%s: %v: %s%s", strings.Join(argv, " "), err, b, e)
		}
		return b
	}
}

// testBundle makes a bundle from the runtime's own default spec: the host's
// /usr read-only as the rootfs's, uid 1337, `sleep 1h` as the entrypoint.
func testBundle(t *testing.T, rt func(*testing.T, ...string) []byte) string {
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"usr", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(rootfs, l)); err != nil {
			t.Fatal(err)
		}
	}
	rt(t, "spec", "--bundle", dir)
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/usr/bin/sleep", "3600"}
	proc["user"] = map[string]any{"uid": 1337, "gid": 1337}
	spec["root"] = map[string]any{"path": "rootfs", "readonly": true}
	spec["mounts"] = append(spec["mounts"].([]any), map[string]any{
		"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"}})
	if b, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
