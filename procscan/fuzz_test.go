package procscan

// Fuzz targets for everything procscan parses or derives from /proc, whose
// content other containers of the pod control in part (comm, argv) or in
// whole (a fixture, a future kernel). Plain `go test` runs each seed corpus
// (the f.Add calls and testdata/fuzz/<Target>/, where every crasher found so
// far is kept); a longer run is on demand, one target at a time:
//
//	go test ./procscan -run '^$' -fuzz '^FuzzProcess$' -fuzztime 5m
//	go test ./procscan -run '^$' -fuzz '^FuzzProcessFields$' -fuzztime 5m
//	go test ./procscan -run '^$' -fuzz '^FuzzContainerName$' -fuzztime 5m
//	go test ./procscan -run '^$' -fuzz '^FuzzClassify$' -fuzztime 5m
//
// (SECURITY.md lists the same.)

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// FuzzProcess reads a one-process tree whose stat, cmdline and cgroup are
// arbitrary bytes: procscan must return an error or a process, never panic
// or hang, and Processes, Process and Classify must agree.
func FuzzProcess(f *testing.F) {
	ok := fakeProc{pid: 42, comm: "pilot-agent", start: 300, argv: []string{"/usr/local/bin/pilot-agent", "proxy"}, cgroup: "0::/\n"}
	f.Add(statLine(ok), cmdline(ok.argv), []byte(ok.cgroup))
	f.Add(statLine(fakeProc{pid: 42, comm: "a) S 0 1 1 (b", ppid: 7, start: 5}), []byte("x\x00"), []byte("0::/../x\n"))
	f.Add(statLine(fakeProc{pid: 42, comm: "\xff\xfe\n", state: "Z", flags: pfExiting}), []byte{}, []byte("1:cpu:/\n0::/\n"))
	f.Add([]byte("42 (x)"), []byte("\x00\x00"), []byte("0::/"))        // ends at the comm
	f.Add([]byte("42 )x( S 0"), []byte("a"), []byte("0::/"))           // parentheses reversed
	f.Add([]byte("42 (x) S"), []byte(""), []byte("garbage"))           // truncated; bad cgroup
	f.Add([]byte(""), []byte(""), []byte(""))                          // empty files
	f.Add([]byte("42 (x) S 0 0 0 0 -1 nope"), []byte("a"), []byte("")) // a field not a number
	f.Fuzz(func(t *testing.T, stat, cmd, cgroup []byte) {
		root := writeTree(t, "", 42, procFiles{pid: 42, stat: stat, cmdline: cmd, cgroup: cgroup})
		s := newScanner(t, root)
		p, err := s.Process(42)
		all, allErr := s.Processes()
		if err != nil {
			// A malformed process is an error, not a vanished one: the
			// files are all there.
			if errors.Is(err, ErrGone) && !strings.Contains(err.Error(), "kernel thread") {
				t.Fatalf("Process = %v: files present, want a parse error, not ErrGone", err)
			}
			if errors.Is(err, ErrGone) {
				if allErr != nil || len(all) != 0 {
					t.Fatalf("kernel thread: Processes = %v, %v; want it left out", all, allErr)
				}
				return
			}
			if allErr == nil {
				t.Fatalf("Process failed (%v) but Processes returned %v", err, all)
			}
			if _, err := s.Scan(42, Rules{}); err == nil {
				t.Fatalf("Process failed but Scan did not")
			}
			return
		}
		if allErr != nil || len(all) != 1 {
			t.Fatalf("Process = %+v but Processes = %v, %v", p, all, allErr)
		}
		if p.PID != 42 {
			t.Fatalf("PID %d, want 42", p.PID)
		}
		// The comm is what lies between the first '(' and the last ')'.
		l, r := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if l < 0 || r <= l || p.Comm != string(stat[l+1:r]) {
			t.Fatalf("Comm %q from stat %q", p.Comm, stat)
		}
		_ = p.Name()
		p.Matches([]string{"pilot-agent", "", strings.Repeat("x", 20)})
		rules := Rules{Sidecar: []string{"pilot-agent"}}
		pod := Classify(all, 42, rules)
		if len(pod.Containers) != 1 || pod.Containers[0].Kind != Self || pod.Containers[0].Count != 1 {
			t.Fatalf("one process, self: got %+v", pod)
		}
		scanned, err := s.Scan(42, rules)
		if err != nil {
			t.Fatalf("Processes worked, Scan: %v", err)
		}
		if diff := cmp.Diff(pod, scanned); diff != "" {
			t.Fatalf("Classify(Processes()) and Scan differ (-classify +scan):\n%s", diff)
		}
	})
}

// FuzzProcessFields writes a stat, cmdline and cgroup the way the kernel
// does, from fields that other containers control: the comm (any bytes but
// NUL, set by prctl), argv[0] (any bytes but NUL) and a cgroup path (no
// newline: the kernel refuses one in a cgroup's name). Every field must read
// back exactly: no comm can shift the fields after it, such as the PPID
// that marks a container's main process.
func FuzzProcessFields(f *testing.F) {
	f.Add("pilot-agent", "/usr/local/bin/pilot-agent", "/../7d2c5f1a9be0", 0, uint64(200), uint64(0x400100))
	f.Add("a) S 0 1 1 (b", "pilot-agent", "/", 13, uint64(5), uint64(0))
	f.Add("my (odd) app", "/opt/my (odd) app", "/../x:y", 0, uint64(1), uint64(0))
	f.Add("x\ny", "a\nb", "/a b/c", 1, uint64(1<<62), uint64(pfExiting))
	f.Add("\xff\xfe\x80", "\xc3\x28", "/\xff", 0, uint64(0), uint64(0))
	f.Add(")", ")", ")", 0, uint64(0), uint64(0))
	f.Add("", "", "", 0, uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, comm, argv0, cgpath string, ppid int, start, flags uint64) {
		// What the kernel allows: no NUL in either; comm cut to 15 bytes
		// (TASK_COMM_LEN-1); no newline in a cgroup path; PIDs up to 2^22.
		comm = strings.ReplaceAll(comm, "\x00", "")
		if len(comm) > 15 {
			comm = comm[:15]
		}
		argv0 = strings.ReplaceAll(argv0, "\x00", "")
		if len(argv0) >= argv0Max {
			argv0 = argv0[:argv0Max-1] // a longer one reads as none: TestArgv0
		}
		cgpath = "/" + strings.NewReplacer("\n", "", "\x00", "").Replace(cgpath)
		ppid = max(ppid, -ppid) % (1 << 22)
		if ppid < 0 {
			ppid = 0
		}
		flags &^= pfKthread
		fp := fakeProc{pid: 42, ppid: ppid, comm: comm, start: start, flags: flags,
			argv: []string{argv0, "--secret=not-needed"}, cgroup: "0::" + cgpath + "\n"}
		root := writeTree(t, "", 42, fp.files())
		p, err := newScanner(t, root).Process(42)
		if err != nil {
			t.Fatalf("Process of a kernel-shaped stat %q: %v", statLine(fp), err)
		}
		if p.Comm != comm || p.PPID != ppid || p.StartTime != start || p.State != "S" || p.Cgroup != "0::"+cgpath {
			t.Fatalf("read %+v\nfrom comm %q ppid %d start %d cgroup %q", p, comm, ppid, start, cgpath)
		}
		if p.Exiting != (flags&pfExiting != 0) {
			t.Fatalf("Exiting() = %v for flags %#x", p.Exiting, flags)
		}
		if p.Argv0 != argv0 || strings.Contains(fmt.Sprintf("%+v", p), "not-needed") {
			t.Fatalf("Argv0 %q, want %q, and nothing of the other arguments: %+v", p.Argv0, argv0, p)
		}
		want := comm
		if argv0 != "" {
			want = path.Base(argv0)
		}
		if p.Name() != want {
			t.Fatalf("Name() = %q, want %q", p.Name(), want)
		}
		if !p.Matches([]string{comm}) && comm != "" {
			t.Fatalf("%+v does not match its own comm %q", p, comm)
		}
	})
}

// FuzzContainerName derives a name from arbitrary cgroup content: never a
// panic, never empty, never a path, never longer than the input.
func FuzzContainerName(f *testing.F) {
	id := strings.Repeat("ab", 32)
	for _, s := range []string{"0::/", "0::/../app", "0::/kubepods/pod1/" + id,
		"0::/kubepods.slice/cri-containerd-" + id + ".scope", "12:pids:/a\n0::/", "", "::", "0::", "0::/..",
		"0:::/x:y", "\n\n0::/a/\n", "0::/" + id + "/", "1:name=systemd:/docker-" + id + ".scope"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cgroup string) {
		name := containerName(cgroup)
		if name == "" {
			t.Fatalf("containerName(%q) is empty", cgroup)
		}
		if name != "/" && strings.Contains(name, "/") {
			t.Fatalf("containerName(%q) = %q: a path", cgroup, name)
		}
		if name != "/" && len(name) > len(cgroup) {
			t.Fatalf("containerName(%q) = %q: longer than its input", cgroup, name)
		}
		if utf8.ValidString(cgroup) && !utf8.ValidString(name) {
			t.Fatalf("containerName(%q) = %q: cut a valid string invalid", cgroup, name)
		}
	})
}

// FuzzClassify classifies an arbitrary set of processes (decoded from the
// bytes: 8 per process) and checks every rule the supervisor relies on
// (checkPod): containers partition the processes by cgroup content, and
// count them; a container's main process is its oldest PPID-0 process; a
// sidecar is a container whose main process is named as one, and nothing
// else is, however its other processes are named; the pause and self
// containers are where PID 1 and selfPID are; the order of the processes
// does not matter.
func FuzzClassify(f *testing.F) {
	f.Add([]byte{}, uint8(0))
	f.Add([]byte{1, 0, 1, 0, 0, 0, 0, 0, 6, 0, 2, 1, 1, 0, 0, 0, 7, 6, 3, 1, 1, 0, 0, 0, 5, 0, 4, 2, 2, 0, 0, 0}, uint8(3))
	// A pilot-agent child (ppid set) in the app container, and an exec'd
	// one (PPID 0, started later).
	f.Add([]byte{13, 0, 9, 2, 2, 0, 0, 0, 81, 13, 10, 2, 1, 0, 0, 0, 90, 0, 200, 2, 1, 0, 0, 0, 25, 0, 20, 3, 3, 0, 0, 0}, uint8(3))
	// An exiting child whose v1 lines read "/" (a zombie on a hybrid host).
	f.Add([]byte{13, 0, 9, 4, 2, 0, 0, 0, 14, 13, 10, 5, 2, 1, 0, 0, 25, 0, 20, 3, 3, 0, 0, 0}, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, selfIdx uint8) {
		procs := decodeProcs(data)
		self := 0
		if len(procs) > 0 {
			self = procs[int(selfIdx)%len(procs)].PID
		}
		rules := Rules{Sidecar: []string{"pilot-agent", "cloud-sql-proxy-v2"}, Ignore: []string{"fluent-bit"}}
		pod := Classify(procs, self, rules)
		checkPod(t, procs, self, rules, pod)
		// The scan feeds processes in /proc's order, a fixture's in any:
		// the order must not matter.
		rev := slices.Clone(procs)
		slices.Reverse(rev)
		if diff := cmp.Diff(pod, Classify(rev, self, rules)); diff != "" {
			t.Fatalf("processes in reverse order (-forward +reverse):\n%s", diff)
		}
	})
}

// fuzzNames and fuzzCgroups are what decodeProcs picks from: names that
// match a rule or almost do, and cgroup contents of a hybrid host, with one
// as an exiting process shows it (v1 lines "/").
var (
	fuzzNames   = []string{"pilot-agent", "app", "envoy", "fluent-bit", "", "cloud-sql-proxy", "pilot-agent\n", "sidecar-supervi", "runc:[2:INIT]"}
	fuzzCgroups = []string{
		"0::/../pause",
		"0::/../proxy",
		"0::/../app",
		"0::/",
		"1:cpu:/kubepods/app\n0::/../app",
		"1:cpu:/\n0::/../app",
		"1:cpu:/\n0::/",
		"1:cpu:/kubepods/other\n0::/",
		"0::/../../..", // not yet moved into its container's cgroup
		"1:cpu:/kubepods/pause\n0::/../pause",
		"1:cpu:/system.slice/containerd.service\n0::/../app",
	}
)

// decodeProcs turns bytes into processes, 8 bytes each: pid, ppid, start
// time, cgroup, name, state/flags, argv[0] choice and a spare. PIDs repeat
// only if the bytes say so; duplicates are dropped as /proc never has them.
