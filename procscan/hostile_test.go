package procscan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestHostileFixture reads testdata/hostile (see make-fixtures.sh): odd
// names do not shift any field, the app is found by its main process, no
// process named pilot-agent outside the sidecar's container makes a
// sidecar, a zombie joins its container by its unified line, and a
// container whose main process has exited has none, even with a
// pilot-agent exec'd into it.
func TestHostileFixture(t *testing.T) {
	pod, members, self := scanFixture(t, "hostile")
	if self != 25 {
		t.Fatalf("self = %d", self)
	}
	want := []summary{
		{Kind: "pause", Name: "ffeeddccbbaa", Main: 1, PIDs: []int{1}},
		{Kind: "sidecar", Name: "7d2c5f1a9be0", Main: 7, PIDs: []int{7, 8}},
		{Kind: "app", Name: "3a1f0e9d8c7b", Main: 13, PIDs: []int{13, 20, 21, 22, 30}, Stray: []int{20, 22}},
		{Kind: "self", Name: "0b1c2d3e4f5a", Main: 25, PIDs: []int{25}},
		// Main process gone: the orphan 41 is older than the exec'd 42.
		{Kind: "app", Name: "9a8b7c6d5e4f", PIDs: []int{41, 42}, Stray: []int{42}},
	}
	if diff := cmp.Diff(want, summarize(pod, members)); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	app := pod.Containers[2].Main
	if app.Comm != "my app (v2)\n\xff)" || app.Argv0 != "/opt/my\napp \xfe(x)" || app.PPID != 0 || app.StartTime != 210 {
		t.Errorf("app main %+v", app)
	}
	if app.Name() != "my\napp \xfe(x)" {
		t.Errorf("app Name() = %q", app.Name())
	}
	for _, p := range members[pod.Containers[2].ID] {
		switch p.PID {
		case 21:
			if p.Comm != ") S 0 1 1 (" || p.PPID != 13 || p.StartTime != 221 {
				t.Errorf("pid 21 %+v: its comm shifted the fields", p)
			}
		case 30:
			if !p.Exiting || p.Cgroup != pod.Containers[2].ID {
				t.Errorf("zombie %+v: want exiting, placed with cgroup %q", p, pod.Containers[2].ID)
			}
		}
		if strings.Contains(fmt.Sprintf("%+v", p), "hunter2") {
			t.Errorf("pid %d: an argument beyond argv[0] was read: %+v", p.PID, p)
		}
	}
	if sc := pod.Containers[1].Main; sc.Argv0 != "pilot-agent: main (istio-proxy)" || sc.Name() != "pilot-agent: main (istio-proxy)" {
		t.Errorf("sidecar main %+v: matched by its comm when argv[0] is a title", sc)
	}
}

// TestExiting places processes that have begun to exit, whose v1 lines
// read "/", on generated hybrid trees.
func TestExiting(t *testing.T) {
	const self = 25
	hy := func(id string) string { return "4:memory:/kubepods/" + id + "\n0::/kubepods/" + id + "\n" }
	zombie := func(pid, ppid int, unified string) fakeProc {
		return fakeProc{pid: pid, ppid: ppid, comm: "sh", state: "Z", flags: pfExiting, start: uint64(300 + pid),
			cgroup: "4:memory:/\n" + unified + "\n"}
	}
	base := []fakeProc{
		{pid: 1, comm: "pause", start: 1, cgroup: hy("pause")},
		{pid: 7, comm: "pilot-agent", start: 2, cgroup: hy("proxy")},
		{pid: 13, comm: "job", start: 3, cgroup: hy("app")},
		{pid: self, comm: "sidecar-supervi", start: 4, cgroup: hy("self")},
	}
	tests := []struct {
		name  string
		extra []fakeProc
		want  []summary
	}{
		{
			name:  "a zombie child joins its container by the unified line",
			extra: []fakeProc{zombie(40, 13, "0::/kubepods/app")},
			want: []summary{{Kind: "app", Name: "app", Main: 13, PIDs: []int{13, 40}},
				{Kind: "self", Name: "self", Main: self, PIDs: []int{self}}},
		},
		{
			name:  "an exiting child that no unified line places is left out",
			extra: []fakeProc{zombie(40, 13, "0::/elsewhere")},
			want: []summary{{Kind: "app", Name: "app", Main: 13, PIDs: []int{13}},
				{Kind: "self", Name: "self", Main: self, PIDs: []int{self}}},
		},
		{
			name:  "an exited main process alone keeps a container: its status can still be read",
			extra: []fakeProc{zombie(40, 0, "0::/kubepods/gone")},
			want: []summary{{Kind: "app", Name: "app", Main: 13, PIDs: []int{13}},
				{Kind: "self", Name: "self", Main: self, PIDs: []int{self}},
				{Kind: "app", Name: "gone", Main: 40, PIDs: []int{40}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var files []procFiles
			for _, p := range append(append([]fakeProc{}, base...), tt.extra...) {
				files = append(files, p.files())
			}
			s := newScanner(t, writeTree(t, "", self, files...))
			pod, _, members := scanKept(t, s, self, Rules{Sidecar: []string{"pilot-agent"}})
			got := summarize(pod, members)[2:] // pause and sidecar are as ever
			for i := range got {
				got[i].Name = strings.TrimPrefix(got[i].Name, "kubepods/")
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("containers (-want +got):\n%s", diff)
			}
		})
	}
	// Where the unified line tells no container apart (all "0::/", as on
	// the v1-hybrid fixture's node), an exiting child is left out rather
	// than made a container of its own.
	procs := []Process{
		{PID: 12, Cgroup: "12:pids:/kubepods/app\n0::/", StartTime: 1},
		{PID: 14, PPID: 12, Cgroup: "12:pids:/\n0::/", StartTime: 2, Exiting: true, State: "Z"},
		{PID: 15, Cgroup: "12:pids:/kubepods/self\n0::/", StartTime: 3},
	}
	pod := Classify(procs, 15, Rules{})
	checkPod(t, procs, 15, Rules{}, pod)
	_, members := classifyKept(procs, 15, Rules{})
	if diff := cmp.Diff([]summary{{Kind: "app", Name: "app", Main: 12, PIDs: []int{12}}, {Kind: "self", Name: "self", Main: 15, PIDs: []int{15}}},
		summarize(pod, members)); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
}

func TestOlder(t *testing.T) {
	main := Process{PID: 30000, PPID: 0, StartTime: 10}
	tests := []struct {
		a, b Process
		want bool
	}{
		{Process{PID: 5, StartTime: 9}, main, true},
		{main, Process{PID: 5, StartTime: 11}, true},
		// Same tick, PIDs wrapped: the child has the lower PID, the main
		// process is still the older.
		{main, Process{PID: 300, PPID: 30000, StartTime: 10}, true},
		{Process{PID: 300, PPID: 30000, StartTime: 10}, main, false},
		// Same tick, both PPID 0 (an exec'd process): the lower PID.
		{main, Process{PID: 30001, StartTime: 10}, true},
		{Process{PID: 30001, StartTime: 10}, main, false},
		{main, main, false},
	}
	for _, tt := range tests {
		if got := older(tt.a, tt.b); got != tt.want {
			t.Errorf("older(%+v, %+v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

// TestArgv0 reads argv[0] and nothing after it, within argv0Max bytes, but
// whether the rest is the one argument "init" (Process.InitArg).
func TestArgv0(t *testing.T) {
	long := strings.Repeat("/x", 2500) + "/pilot-agent" // 5012 bytes
	tests := []struct {
		name    string
		cmdline []byte
		argv0   string
		initArg bool
	}{
		{"argv", []byte("/bin/app\x00--password=hunter2\x00"), "/bin/app", false},
		{"zombie", []byte{}, "", false},
		{"a title without NUL (setproctitle)", []byte("postgres: writer process   "), "postgres: writer process   ", false},
		{"empty argv[0]", []byte("\x00pilot-agent\x00"), "", false},
		{"newline and invalid UTF-8", []byte("a\nb\xff\x00c\x00"), "a\nb\xff", false},
		{"the longest that fits", append([]byte(strings.Repeat("y", argv0Max-1)), 0), strings.Repeat("y", argv0Max-1), false},
		// Longer than any path: read as none, so a name cut at the bound
		// ("...pilot-agent" from a longer one) cannot match.
		{"longer than the bound", append([]byte(long), 0), "", false},
		{"no NUL within the bound", []byte(strings.Repeat("z", argv0Max+100)), "", false},
		{"a runtime's init", []byte("/usr/bin/kata-agent\x00init\x00"), "/usr/bin/kata-agent", true},
		{"init and more", []byte("/sbin/init\x00init\x00--now\x00"), "/sbin/init", false},
		{"init alone", []byte("/sbin/init\x00"), "/sbin/init", false},
		{"init with no argv[0]", []byte("\x00init\x00"), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := writeTree(t, "", 9, procFiles{pid: 9, stat: statLine(fakeProc{pid: 9, comm: "c"}), cmdline: tt.cmdline, cgroup: []byte("0::/\n")})
			p, err := newScanner(t, root).Process(9)
			if err != nil {
				t.Fatal(err)
			}
			if p.Argv0 != tt.argv0 || p.InitArg != tt.initArg {
				t.Errorf("Argv0 = %q, InitArg = %v; want %q, %v", p.Argv0, p.InitArg, tt.argv0, tt.initArg)
			}
			if tt.argv0 == "" && p.Name() != "c" {
				t.Errorf("Name() = %q, want the comm", p.Name())
			}
		})
	}
}

// TestVanished: a process that disappears between the directory listing
// and its files (any of them) is left out, and Process says ErrGone.
func TestVanished(t *testing.T) {
	ok := fakeProc{pid: 10, comm: "ok", cgroup: "0::/\n", argv: []string{"ok"}}.files()
	stat := statLine(fakeProc{pid: 11, comm: "x"})
	root := writeTree(t, "", 10, ok,
		procFiles{pid: 11},                                                     // directory only
		procFiles{pid: 12, stat: stat},                                         // stat only
		procFiles{pid: 13, stat: stat, cmdline: []byte("x\x00")},               // no cgroup
		procFiles{pid: 14, cmdline: []byte("x\x00"), cgroup: []byte("0::/\n")}, // no stat
	)
	s := newScanner(t, root)
	procs, err := s.Processes()
	if err != nil || len(procs) != 1 || procs[0].PID != 10 {
		t.Fatalf("Processes() = %+v, %v; want pid 10 alone", procs, err)
	}
	if pod, err := s.Scan(10, Rules{}); err != nil || len(pod.Containers) != 1 || pod.Containers[0].Count != 1 || pod.Containers[0].Main.PID != 10 {
		t.Fatalf("Scan() = %+v, %v; want pid 10 alone", pod, err)
	}
	for pid := 11; pid <= 14; pid++ {
		if _, err := s.Process(pid); !errors.Is(err, ErrGone) {
			t.Errorf("Process(%d) = %v, want ErrGone", pid, err)
		}
		if pid != 14 {
			continue
		}
		if _, err := s.StartTime(pid); !errors.Is(err, ErrGone) {
			t.Errorf("StartTime(%d) = %v, want ErrGone", pid, err)
		}
	}
}

// trapFiles are files of /proc/PID that procscan must never open. environ
// holds the process's secrets (other containers' credentials); the rest it
// has no use for. A test makes each a FIFO: opening one blocks until a
// writer comes, so a scan that opened one would never return.
var trapFiles = []string{"environ", "mem", "maps", "smaps", "smaps_rollup", "status", "auxv", "stack",
	"syscall", "io", "limits", "personality", "sched", "schedstat", "wchan", "mountinfo", "mounts",
	"comm", "loginuid", "oom_score", "pagemap", "timerslack_ns", "coredump_filter", "setgroups"}

// trapDirs hold a FIFO: fd/0 and the like.
var trapDirs = []string{"fd", "fdinfo", "task", "ns", "attr", "map_files", "net", "root", "cwd"}

// TestReadsNothingElse scans a tree where every /proc/PID file but stat,
// cmdline and cgroup is a FIFO trap (see trapFiles): Processes, Process,
// StartTime and Self must all return, and afterwards no trap may have a
// reader (a non-blocking open for writing fails with ENXIO only when no
// process has the FIFO open for reading).
func TestReadsNothingElse(t *testing.T) {
	var procs []procFiles
	for _, p := range []fakeProc{
		{pid: 1, comm: "pause", start: 1, cgroup: "0::/../pause\n", argv: []string{"/pause"}},
		{pid: 7, comm: "pilot-agent", start: 2, cgroup: "0::/../proxy\n", argv: []string{"pilot-agent"}},
		{pid: 13, comm: "job", start: 3, cgroup: "0::/../app\n", argv: []string{"/job", "--token=s3cret"}},
		{pid: 25, comm: "sidecar-supervi", start: 4, cgroup: "0::/\n", argv: []string{"/sidecar-supervisor"}},
	} {
		procs = append(procs, p.files())
	}
	root := writeTree(t, "", 25, procs...)
	var traps []string
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		for _, name := range trapFiles {
			traps = append(traps, filepath.Join(dir, name))
		}
		for _, d := range trapDirs {
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
			traps = append(traps, filepath.Join(dir, d, "0"))
		}
	}
	for _, f := range traps {
		if err := syscall.Mkfifo(f, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	// On failure, release any reader blocked in a trap.
	t.Cleanup(func() {
		for _, f := range traps {
			if fd, err := syscall.Open(f, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				syscall.Close(fd)
			}
		}
	})

	done := make(chan error, 1)
	go func() {
		s, err := NewScanner(root)
		if err != nil {
			done <- err
			return
		}
		if _, err := s.Self(); err != nil {
			done <- err
			return
		}
		all, err := s.Processes()
		if err != nil {
			done <- err
			return
		}
		if len(all) != 4 {
			done <- fmt.Errorf("Processes() found %d processes, want 4", len(all))
			return
		}
		for _, p := range all {
			if _, err := s.Process(p.PID); err != nil {
				done <- err
				return
			}
			if _, err := s.StartTime(p.PID); err != nil {
				done <- err
				return
			}
		}
		Classify(all, 25, Rules{Sidecar: []string{"pilot-agent"}})
		if _, err := s.Scan(25, Rules{Sidecar: []string{"pilot-agent"}}); err != nil {
			done <- err
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the scan did not return within 10s: it opened a trap (a file it must not read)")
	}
	for _, f := range traps {
		fd, err := syscall.Open(f, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			syscall.Close(fd)
			t.Errorf("%s has a reader: procscan opened it", f)
		} else if !errors.Is(err, syscall.ENXIO) {
			t.Errorf("%s: %v", f, err)
		}
	}
}
