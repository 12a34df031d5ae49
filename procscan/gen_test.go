package procscan

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Generated fixture trees: the same layout as testdata/make-fixtures.sh
// writes (one directory per PID with stat, cmdline and cgroup, and a self
// link), built at test time for what cannot be committed (FIFOs, 10,000
// processes, fuzzed bytes).

// procFiles is one process of a generated tree. A nil file is left out,
// as when a process vanished between readdir and the read.
type procFiles struct {
	pid                   int
	stat, cmdline, cgroup []byte
}

// fakeProc is a process as the kernel would show it, for statLine.
type fakeProc struct {
	pid, ppid int
	comm      string
	state     string
	start     uint64
	flags     uint64
	argv      []string
	cgroup    string
}

// statLine is /proc/PID/stat as the kernel writes it (fs/proc/array.c):
// "pid (comm) state ppid ..." with 52 fields; those procscan does not use
// are zero. The comm goes in as is, whatever bytes it holds.
func statLine(p fakeProc) []byte {
	state := p.state
	if state == "" {
		state = "S"
	}
	return fmt.Appendf(nil, "%d (%s) %s %d %d %d 0 -1 %d 0 0 0 0 1 1 0 0 20 0 1 0 %d 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		p.pid, p.comm, state, p.ppid, p.pid, p.pid, p.flags, p.start)
}

// cmdline is /proc/PID/cmdline: each argument NUL-terminated.
func cmdline(argv []string) []byte {
	b := []byte{} // present, if empty (a zombie's)
	for _, a := range argv {
		b = append(append(b, a...), 0)
	}
	return b
}

func (p fakeProc) files() procFiles {
	return procFiles{pid: p.pid, stat: statLine(p), cmdline: cmdline(p.argv), cgroup: []byte(p.cgroup)}
}

// writeTree writes a fake /proc under dir (t.TempDir when empty) with self
// pointing at self, and returns its root.
func writeTree(t testing.TB, dir string, self int, procs ...procFiles) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	for _, p := range procs {
		d := filepath.Join(dir, strconv.Itoa(p.pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"stat": p.stat, "cmdline": p.cmdline, "cgroup": p.cgroup} {
			if b == nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(d, name), b, 0o444); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink(strconv.Itoa(self), filepath.Join(dir, "self")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	return dir
}

func newScanner(t testing.TB, root string) *Scanner {
	t.Helper()
	s, err := NewScanner(root)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
