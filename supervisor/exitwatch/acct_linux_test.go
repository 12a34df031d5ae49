//go:build linux

package exitwatch

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inOwnPIDNamespace runs the calling test (or benchmark) again in a PID
// namespace of its own, where it is PID 1, as a pod's processes are in
// theirs: accounting belongs to a PID namespace, and the test must not
// turn it on for the whole machine. It returns true in that run (the test
// goes on), false in the outer one, which checks that the inner run passed
// and relays a benchmark's figures. It needs root (CLONE_NEWPID), and
// skips, saying so, without it.
func inOwnPIDNamespace(tb testing.TB) bool {
	tb.Helper()
	if os.Getenv("ACCT_TEST_NS") == tb.Name() {
		if os.Getpid() != 1 {
			tb.Fatalf("in the test's own PID namespace, PID %d, want 1", os.Getpid())
		}
		// Its own /proc, as a pod's (its own mount namespace: the
		// machine's /proc is left as it is).
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			tb.Fatal(err)
		}
		if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
			tb.Fatal(err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		tb.Skip("needs root: a PID namespace of its own (CLONE_NEWPID) and CAP_SYS_PACCT")
	}
	if _, err := os.Stat("/proc/sys/kernel/acct"); err != nil {
		tb.Skip("the kernel has no process accounting (CONFIG_BSD_PROCESS_ACCT): ", err)
	}
	args := []string{"-test.run=^" + tb.Name() + "$", "-test.v"}
	passed := "--- PASS: " + tb.Name()
	if _, ok := tb.(*testing.B); ok {
		args, passed = []string{"-test.run=^$", "-test.bench=^" + tb.Name() + "$", "-test.benchmem"}, "\nPASS"
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ACCT_TEST_NS="+tb.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), passed) {
		tb.Fatalf("in its own PID namespace: %v\n%s", err, out)
	}
	if b, ok := tb.(*testing.B); ok {
		// Its figures, as the inner run printed them; the outer run has
		// none of its own to print.
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, tb.Name()) {
				fmt.Println(l)
			}
		}
		b.Skip("measured in a PID namespace of its own: its figures are the line above")
	}
	return false
}

// TestAccounting: statuses read from the kernel's records, for processes
// that are not the supervisor's children, on this kernel: watched with the
// accounting method, gone before they were watched, ended while no
// watcher ran (a supervisor restarted), and across a rotation.
func TestAccounting(t *testing.T) {
	if !inOwnPIDNamespace(t) {
		return
	}
	dir := t.TempDir()
	cfg := Config{Method: Accounting, Dir: dir, Probe: testProbe(t, "7"), Setting: "SUPERVISOR_EXIT_STATUS"}
	w, choice, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if choice.Method != Accounting || !choice.Accounting {
		t.Fatalf("choice %+v, want accounting, on", choice)
	}

	// Watched: each way of ending. A shell has one thread, so its record
	// is exact; a record of 0 reads unknown, whoever wrote it. The Go
	// programs have several threads: thread-exit (exit_group(5) from
	// another thread) may be recorded before the main thread took its
	// code, then as 0; leader-exit's main thread exits alone (code 0),
	// another thread then calls exit_group(6), which the parent reaps, and
	// the record holds the main thread's 0 (acct_linux.go).
	for _, c := range []struct {
		how   string
		want  Status
		maybe bool // or the unknown of a record of 0
	}{
		{"sh:exit 0", acctUnknown, false},
		{"sh:exit 3", exited(3), false},
		{"sh:kill -9 $$", killed(9), false},
		{"0", acctUnknown, false},
		{"thread-exit", exited(5), true},
		{"leader-exit", acctUnknown, false},
	} {
		p, end := grandchild(t, c.how)
		proc, err := w.Watch(p)
		if err != nil {
			t.Fatal(err)
		}
		end()
		if got := waitDone(t, proc); got != c.want && !(c.maybe && got == acctUnknown) {
			t.Errorf("%s: status %v, want %v", c.how, got, c.want)
		}
	}

	// A sidecar, tracked: its status from its record too.
	sp, send := grandchild(t, "sh:exit 2")
	sproc, err := w.Track(sp)
	if err != nil {
		t.Fatal(err)
	}
	if got := sproc.Status(); got.Known {
		t.Errorf("tracked sidecar still running: status %v, want none yet", got)
	}
	send()
	if got := waitDone(t, sproc); got != exited(2) {
		t.Errorf("tracked: status %v, want exit 2", got)
	}

	// Gone before it was watched: reaped already, its record read.
	g := startGrandchild(t, "sh:exit 4")
	endReaped(t, g)
	proc, err := w.Watch(g.proc)
	if err != nil {
		t.Fatalf("watch a process gone, its record there: %v", err)
	}
	if got := waitDone(t, proc); got != exited(4) {
		t.Errorf("gone before watched: status %v, want exit 4", got)
	}

	// The supervisor restarted: a process ends while no watcher runs,
	// and the next reads its record from the file accounting went on
	// writing to meanwhile.
	// Its record gives its end too: after the test let it end, before
	// its parent reaped it, within its rounding (the start and the elapsed
	// time each rounded down to a tick, 10 ms) and a tick of slack.
	started := time.Now()
	g = startGrandchild(t, "sh:exit 6")
	w.Close()
	time.Sleep(300 * time.Millisecond) // a lifetime to measure: 30 ticks at least
	before := time.Now()
	endReaped(t, g)
	after := time.Now()
	p := g.proc
	w2, _, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	got, ended, ok := w2.Recorded(p)
	if !ok || got != exited(6) {
		t.Errorf("ended while no watcher ran: %v %v, want exit 6", got, ok)
	}
	t.Logf("its record's end: %s after the test let it end, %s before it was reaped, %s after it was started",
		ended.Sub(before), after.Sub(ended), ended.Sub(started))
	if ended.Before(before.Add(-3*time.Second/clockTicks)) || ended.After(after.Add(time.Second/clockTicks)) {
		t.Errorf("its record says it ended at %s, want between %s and %s (when it was let end, and reaped)",
			ended.Format(time.StampMicro), before.Format(time.StampMicro), after.Format(time.StampMicro))
	}
	// Another start time is another process, whatever its PID.
	if got, _, ok := w2.Recorded(Process{PID: p.PID, StartTime: p.StartTime + 3600*clockTicks}); ok {
		t.Errorf("a record found for a process started an hour later: %v", got)
	}

	// Rotation: the kernel writes to the next file; the one before is
	// still read, the ones before it are removed.
	a := w2.acct
	for range 3 {
		if err := a.rotateOnce(0); err != nil {
			t.Fatal(err)
		}
	}
	gens, err := a.gens()
	if err != nil || len(gens) != 2 || gens[1] != a.gen {
		t.Fatalf("files %v (%v), want the last two, ending with %d", gens, err, a.gen)
	}
	g = startGrandchild(t, "sh:kill -15 $$")
	endReaped(t, g)
	p = g.proc
	if got, _, ok := w2.Recorded(p); !ok || got != killed(15) {
		t.Errorf("after rotation: %v %v, want killed by SIGTERM", got, ok)
	}
	if err := a.rotateOnce(0); err != nil {
		t.Fatal(err)
	}
	if got, _, ok := w2.Recorded(p); !ok || got != killed(15) {
		t.Errorf("in the file before the kernel's: %v %v, want killed by SIGTERM", got, ok)
	}
}

// acctUnknown is the status of a record of exit 0.
var acctUnknown = Status{Reason: acctZero}

// TestAccountingNeverWrong: programs of several threads (the test binary,
// as a Go app) that exit 4, one after another: the kernel may record one
// before its main thread took its code, as 0 (acct_linux.go; 5 in 3,000
// on a loaded 7.2 guest), which must read unknown, never success.
func TestAccountingNeverWrong(t *testing.T) {
	if !inOwnPIDNamespace(t) {
		return
	}
	a, sup := startAcct(t.TempDir(), testProbe(t, "7"))
	if !sup.ok {
		t.Fatal(sup.reason)
	}
	defer a.close()
	const n = 200
	unknown := 0
	for range n {
		cmd := helper("exit", "4") // stdin /dev/null: it exits at once
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		st, err := startTime(cmd.Process.Pid) // ours until reaped
		if err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		s, found, err := a.lookup(Process{PID: cmd.Process.Pid, StartTime: st})
		switch {
		case err != nil || !found:
			t.Fatalf("pid %d: no record (%v)", cmd.Process.Pid, err)
		case s == acctUnknown:
			unknown++
		case s != exited(4):
			t.Fatalf("pid %d: status %v, want exit 4 or unknown", cmd.Process.Pid, s)
		}
	}
	t.Logf("%d of %d read unknown (recorded as 0), the others exit 4", unknown, n)
}

// TestAccountingRefused: without CAP_SYS_PACCT accounting is off, with a
// reason that names the fix; forced, the method is an error.
func TestAccountingRefused(t *testing.T) {
	if !inOwnPIDNamespace(t) {
		return
	}
	// The thread keeps its lowered capabilities, and dies with the test.
	runtime.LockOSThread()
	// Drop CAP_SYS_PACCT from this thread's effective set; New runs on
	// it (hasCap reads the calling thread's capabilities).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	data[0].Effective &^= 1 << capSysPacct
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Method: Auto, Dir: t.TempDir(), Probe: testProbe(t, "7"), Setting: "SUPERVISOR_EXIT_STATUS"}
	w, choice, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if choice.Accounting || choice.Method == Accounting || !strings.Contains(choice.AccountingOff, "add SYS_PACCT") {
		t.Errorf("without CAP_SYS_PACCT: %+v, want accounting off, saying to add SYS_PACCT", choice)
	}
	cfg.Method = Accounting
	w, choice, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if choice.Method == Accounting || !strings.Contains(choice.Refused, "accounting cannot work here: no CAP_SYS_PACCT") {
		t.Errorf("forced without CAP_SYS_PACCT: %+v, want it refused, saying why, and auto's choice", choice)
	}
}

// TestAccountingEndsWithItsMount pins what bounds accounting in a pod: the
// kernel ties it to the mount its file was opened through (acct_on's
// pin_insert), and turns it off when that mount goes. A container's
// mounts go with its mount namespace, at its death: accounting a
// supervisor turned on ends with it, and an app that ends while no
// supervisor runs has no record. A helper turns it on through a bind
// mount in a mount namespace of its own, runs a child that exits 3, and
// exits: the child's record is there, a process ending after it has none.
func TestAccountingEndsWithItsMount(t *testing.T) {
	if !inOwnPIDNamespace(t) {
		return
	}
	dir, mnt := t.TempDir(), t.TempDir()
	cmd := helper("accton", dir, mnt)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.Output()
	before, aerr := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || aerr != nil {
		t.Fatalf("accounting helper: %v %q", err, out)
	}
	g := startGrandchild(t, "4")
	endReaped(t, g)
	pids := map[int]uint32{}
	for _, r := range readRecords(t, dir+"/pacct") {
		pids[r.pid] = r.exitCode
	}
	if code, ok := pids[before]; !ok || code != 3<<8 {
		t.Errorf("the child that ended while the mount was there: record %v (%#x), want exit 3; records %v", ok, code, pids)
	}
	if _, ok := pids[g.proc.PID]; ok {
		t.Errorf("a process that ended after the mount went has a record: the kernel no longer ties accounting to its mount (acct_linux.go says it does); records %v", pids)
	}
}

// TestAccountingOutlivesItsContainer: anchored through another
// container's mount of the state directory, accounting outlives the
// supervisor's own container, and ends with the anchor's. Each stands as a
// process in a mount namespace of its own: the anchor (istio-proxy), and a
// helper that turns accounting on, anchors it, and exits (a supervisor
// killed). A process that ends after the helper has its record; one that
// ends after the anchor, none. Refused: a container that has another
// directory at the path; and once the anchor is gone, the rotation's tick
// points the kernel back at the supervisor's own mount.
func TestAccountingOutlivesItsContainer(t *testing.T) {
	if !inOwnPIDNamespace(t) {
		return
	}
	dir := t.TempDir()
	boot, err := bootTime()
	if err != nil {
		t.Fatal(err)
	}
	files := &acctLog{dir: dir, boot: boot}
	recorded := func(p Process) (Status, bool) {
		t.Helper()
		s, ok, err := files.lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		return s, ok
	}

	host, endHost := container(t, "exit", "0")
	sup := helper("anchored", dir, strconv.Itoa(host.PID), strconv.FormatUint(host.StartTime, 10))
	sup.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := sup.Output()
	child, aerr := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || aerr != nil {
		t.Fatalf("anchored helper: %v %q", err, out)
	}
	if s, ok := files.lookupPID(t, child); !ok || s != exited(3) {
		t.Errorf("the helper's child: %v %v, want exit 3", s, ok)
	}
	g := startGrandchild(t, "sh:exit 4")
	endReaped(t, g)
	if s, ok := recorded(g.proc); !ok || s != exited(4) {
		t.Errorf("ended after the supervisor's container, its anchor running: %v %v, want exit 4 recorded", s, ok)
	}
	endHost()
	g = startGrandchild(t, "sh:exit 5")
	endReaped(t, g)
	if s, ok := recorded(g.proc); ok {
		t.Errorf("ended after the anchor's container: recorded %v, want no record (accounting went with its mount)", s)
	}

	// Refused: another directory at the path.
	a, support := startAcct(dir, testProbe(t, "7"))
	if !support.ok {
		t.Fatal(support.reason)
	}
	defer a.close()
	hider, endHider := container(t, "hide", dir)
	if ok, err := a.anchor(hider); ok || err == nil || !strings.Contains(err.Error(), "another directory") {
		t.Errorf("anchored through a container with a tmpfs at the path: %v %v, want refused", ok, err)
	}
	endHider()

	// The anchor gone: back to our own mount at the next tick.
	host, endHost = container(t, "exit", "0")
	if ok, err := a.anchor(host); !ok || err != nil {
		t.Fatalf("anchor: %v %v", ok, err)
	}
	if ok, err := a.anchor(host); ok || err != nil {
		t.Errorf("anchored again while the anchor runs: %v %v, want nothing done", ok, err)
	}
	endHost()
	if err := a.rotateOnce(1 << 40); err != nil {
		t.Fatal(err)
	}
	if a.host.PID != 0 {
		t.Errorf("anchor %v kept after its end", a.host)
	}
	g = startGrandchild(t, "sh:exit 6")
	endReaped(t, g)
	if s, ok := recorded(g.proc); !ok || s != exited(6) {
		t.Errorf("ended after the anchor went and the tick: %v %v, want exit 6 recorded", s, ok)
	}
}

// container starts a helper in a mount namespace of its own (a container
// of the pod, as far as mounts go), and returns it and a function that
// ends it and waits for it: its mount namespace is gone then.
func container(t *testing.T, mode string, args ...string) (Process, func()) {
	t.Helper()
	cmd := helper(mode, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	stdin, out := startPiped(t, cmd)
	end := func() { stdin.Close(); cmd.Wait() }
	t.Cleanup(end)
	if mode == "hide" {
		if line, err := readLine(out, 10*time.Second); err != nil || line != "ready" {
			t.Fatalf("hide helper: %q %v", line, err)
		}
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return Process{PID: cmd.Process.Pid, StartTime: st}, end
}

// lookupPID finds the first record of pid, whatever its start.
func (a *acctLog) lookupPID(t *testing.T, pid int) (Status, bool) {
	t.Helper()
	gens, err := a.gens()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gens {
		for _, r := range readRecords(t, a.path(g)) {
			if r.pid == pid {
				return decodeWaitStatus(r.exitCode), true
			}
		}
	}
	return Status{}, false
}

// readRecords reads every record of an accounting file.
func readRecords(t *testing.T, path string) []acctRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rs []acctRecord
	for i := 0; i+acctRecordSize <= len(b); i += acctRecordSize {
		rs = append(rs, parseAcct(b[i:i+acctRecordSize]))
	}
	return rs
}

// endReaped ends g and waits, bounded, until its parent has reaped it:
// the parent exits then, and its output ends.
func endReaped(t *testing.T, g grand) {
	t.Helper()
	g.end()
	eof := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, g.out)
		eof <- err
	}()
	select {
	case err := <-eof:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("pid %d: not reaped within 10s of its end", g.proc.PID)
	}
}
