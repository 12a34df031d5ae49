//go:build linux

package exitwatch

// The accounting method reads an app's exit status from the kernel's
// process accounting (acct(2), BSD records of version 3): once it is on,
// the kernel appends a 64-byte record to a file for every process of the
// pod's PID namespace (and the namespaces below it) that ends, with its
// PID in that namespace and its wait status, before its parent can reap
// it. So the record outlives the process:
//
//   - an app seen at its very end and reaped before it could be watched
//     (pidfd_open too late, ptrace refused a zombie) left its status;
//   - so did an app that ended while the supervisor was alive but had not
//     read it (stopped, off the CPU) when it was killed: the next one
//     reads the record;
//   - it needs CAP_SYS_PACCT (root: capabilities of non-root containers
//     are not effective), which RuntimeDefault seccomp then allows, and
//     a directory the pod keeps (SUPERVISOR_STATE_DIR), and nothing of
//     the apps: no tracing, no signal stops, strace and gdb still work.
//
// The kernel ties accounting to the mount the file was opened through
// (acct_on pins it), and ends it when that mount goes; a container's
// mounts go with its mount namespace, at its death
// (TestAccountingEndsWithItsMount pins this; seen first in the soak, seed
// 20261213). So the file is opened, where it can be, through a sidecar's
// mount of the state directory, which outlives the supervisor's own
// (anchor_linux.go). The kernel also suspends accounting while the file's
// filesystem has less than 2% free (kernel.acct). A missing record leaves
// the status unknown, as without accounting: never a wrong one.
//
// The record's status is the main thread's exit code, which acct_collect
// takes as that thread ends (0 until then), while the record is written
// by the last thread of the process to end, which need not be the main
// one. So in a process of several threads (every Go or Java program) the
// record can be written while the main thread is ending but has not yet
// taken its code: it then says 0, whatever the code was. Seen in a loaded
// qemu guest on Debian sid's 7.2.13: 5 of 3,000 Go processes that exited
// 4 were recorded as exit 0, and 0 of 1,500 single-threaded shells; the
// kernel's code (do_exit: the count of live threads, then acct_collect,
// then acct_process by the last) is the same on every release we
// support. A main thread that exits alone (pthread_exit in main) leaves 0
// too, where the parent reaps another thread's later code. So a record
// of exit 0 says the process ended, not how: its status is unknown,
// never success (acctZero). Any other code is the main thread's own, and
// the group's when a thread calls exit_group (as every program that ends
// normally does, and a fatal signal's kill): exact, but for a main thread
// that leaves alone with a code of its own (the raw exit system call,
// which no libc's exit makes) before another thread's exit_group. Auto
// prefers ptrace, exact there, where both are permitted; accounting is
// the method where only CAP_SYS_PACCT is given, and fills in failures
// the others lose.
//
// A record names its process by PID and start (whole seconds of wall
// time); an instance is (PID, start time in clock ticks since boot). The
// first record with the PID whose start agrees within acctStartSlack is
// the instance's: another process with that PID, started within seconds
// of it, needs the PID counter to wrap around in between (as pidfd_open's
// check accepts).
//
// The files are kept small, for they share the state directory (an
// emptyDir in memory, 1Mi) with the journal: every acctRotateEvery, past
// acctRotateSize, the kernel is pointed at a new file and the one before
// the last is removed. A restarted supervisor reads the records its
// predecessor's file holds with its first scan, before its second
// rotation could remove them.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// capSysPacct is CAP_SYS_PACCT's bit in CapEff.
const capSysPacct = 20

const (
	acctRecordSize = 64
	acctVersion    = 3
	acctPrefix     = "pacct."
	// Two files of at most acctRotateSize, plus a second's growth: well
	// within the template's state volume (1Mi, in memory), whatever the
	// pod's churn short of thousands of processes a second.
	acctRotateSize  = 128 << 10 // 2,048 records
	acctRotateEvery = time.Second
	// acctStartSlack bounds the gap between a record's start and an
	// instance's: both are whole seconds or rounded down to them (the
	// record's, and the boot time /proc/stat gives), and the wall clock
	// may be slewed by NTP meanwhile.
	acctStartSlack = 3
	// acctProbes bounds the probes startAcct makes: one whose record says
	// 0 (acctZero: the probe has several threads) proves nothing either way.
	acctProbes = 3
	// clockTicks is USER_HZ, the unit of /proc/PID/stat's start time: 100
	// on every Linux architecture Kubernetes runs on.
	clockTicks = 100
	// acctHZ is AHZ, the unit of a record's elapsed time (kernel/acct.c).
	acctHZ = 100
)

// acctZero is why a record of exit 0 gives no status (above).
const acctZero = "its accounting record says exit 0, which the kernel also writes for a program of several threads whose main thread had not yet taken its exit code: not taken for success (exact statuses: Linux 6.15+, or ptrace with CAP_SYS_PTRACE)"

// errAcctZero: a probe's record says 0 (acctZero).
var errAcctZero = errors.New("the accounting record of a probe that exited 7 says 0")

// acctRecord is what the supervisor reads of a version-3 record (struct
// acct_v3 in <linux/acct.h>): ac_flag, ac_version, ac_tty, then
// ac_exitcode, ac_uid, ac_gid, ac_pid, ac_ppid, ac_btime (32 bits each,
// native byte order), ac_etime (an IEEE float), then times and counts,
// and ac_comm[16].
type acctRecord struct {
	version  byte
	exitCode uint32 // a wait status
	pid      int
	btime    int64   // Unix seconds
	etime    float32 // from its start to its exit, in AHZ (100) ticks
}

func parseAcct(b []byte) acctRecord {
	return acctRecord{
		version:  b[1],
		exitCode: binary.NativeEndian.Uint32(b[4:]),
		pid:      int(binary.NativeEndian.Uint32(b[16:])),
		btime:    int64(binary.NativeEndian.Uint32(b[24:])),
		etime:    math.Float32frombits(binary.NativeEndian.Uint32(b[28:])),
	}
}

// ended is when the process of r, which started start clock ticks after
// boot (/proc/PID/stat), exited: its start plus the record's elapsed time,
// both on the clock since boot (the kernel's AHZ and USER_HZ are both
// 100), set against that clock now. Exact to a tick (10 ms); the btime
// beside it has whole seconds only.
func (r acctRecord) ended(start uint64) (time.Time, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	end := time.Duration(start)*time.Second/clockTicks + time.Duration(float64(r.etime)*float64(time.Second)/acctHZ)
	return now.Add(end - time.Duration(ts.Nano())), nil
}

// acctLog is the pod's accounting, turned on by this supervisor or an
// earlier one, in dir.
type acctLog struct {
	dir string
	// boot is the boot time in Unix seconds (/proc/stat's btime), to set
	// an instance's start against a record's.
	boot int64

	mu  sync.Mutex
	gen int // the file the kernel writes to: pacct.<gen>
	// host is the process whose mount of dir the kernel's file was opened
	// through (anchor); zero: the supervisor's own mount.
	host Process
	stop chan struct{}
	done chan struct{}
}

// startAcct turns accounting on (or takes it over) in dir, checks with a
// probe (argv, which exits with code 7 once its stdin closes) that the
// kernel writes the records the supervisor reads, and keeps the file
// small until close.
func startAcct(dir string, argv []string) (*acctLog, support) {
	if !hasCap(capSysPacct) {
		return nil, support{reason: "no CAP_SYS_PACCT: add SYS_PACCT to the container's capabilities, and run it as root (capabilities of non-root containers are not effective)"}
	}
	boot, err := bootTime()
	if err != nil {
		return nil, support{reason: err.Error(), failed: true}
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, support{reason: err.Error(), failed: true}
	}
	a := &acctLog{dir: dir, boot: boot}
	gens, err := a.gens()
	if err != nil {
		return nil, support{reason: err.Error(), failed: true}
	}
	if len(gens) > 0 {
		a.gen = gens[len(gens)-1] // a supervisor before us turned it on
	}
	if err := a.point(a.gen); err != nil {
		return nil, support{reason: err.Error(), failed: true}
	}
	err = a.probe(argv)
	for try := 1; errors.Is(err, errAcctZero) && try < acctProbes; try++ {
		err = a.probe(argv)
	}
	if errors.Is(err, errAcctZero) {
		err = fmt.Errorf("%w, in each of %d probes: the kernel records 0 before the main thread of a threaded program takes its code, but not every time", err, acctProbes)
	}
	if err != nil {
		// Off again (acct(NULL)): nothing would read what it wrote.
		unix.Syscall(unix.SYS_ACCT, 0, 0, 0)
		return nil, support{reason: err.Error(), failed: true}
	}
	a.stop, a.done = make(chan struct{}), make(chan struct{})
	go a.rotate()
	return a, support{ok: true}
}

// probe starts argv as our child, lets it exit with code 7, reaps it, and
// looks its record up: the kernel writes version-3 records, for this PID
// namespace, before the reap.
func (a *acctLog) probe(argv []string) error {
	var pid int
	var st uint64
	var serr error
	if err := runProbe(argv, "accounting probe", func(p int) { pid = p; st, serr = startTime(p) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("accounting probe: %w", serr)
	}
	r, found, err := a.record(Process{PID: pid, StartTime: st})
	switch {
	case err != nil:
		return err
	case !found:
		return errors.New("the kernel wrote no accounting record of a probe (accounting suspended: its filesystem is short of space, see kernel.acct)")
	case r.exitCode == 0:
		return errAcctZero // the probe is a program of several threads
	case r.exitCode != 7<<8:
		return fmt.Errorf("the accounting record of a probe that exited 7 says %v", decodeWaitStatus(r.exitCode))
	}
	return nil
}

// lookup reads p's status from the record of its exit, if the kernel
// wrote one: unknown where the record says 0 (acctZero).
func (a *acctLog) lookup(p Process) (Status, bool, error) {
	r, found, err := a.record(p)
	if err != nil || !found {
		return Status{}, found, err
	}
	return r.status(), true, nil
}

func (r acctRecord) status() Status {
	if r.exitCode == 0 {
		return Status{Reason: acctZero}
	}
	return decodeWaitStatus(r.exitCode)
}

// record finds the record of p's exit, if the kernel wrote one.
func (a *acctLog) record(p Process) (acctRecord, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	gens, err := a.gens()
	if err != nil {
		return acctRecord{}, false, err
	}
	start := a.boot + int64(p.StartTime/clockTicks)
	for _, g := range gens {
		if r, found, err := a.find(g, p.PID, start); err != nil || found {
			return r, found, err
		}
	}
	return acctRecord{}, false, nil
}

// find reads pacct.<gen> for the first record of pid started at start.
func (a *acctLog) find(gen, pid int, start int64) (acctRecord, bool, error) {
	f, err := os.Open(a.path(gen))
	if errors.Is(err, os.ErrNotExist) {
		return acctRecord{}, false, nil
	}
	if err != nil {
		return acctRecord{}, false, fmt.Errorf("read the accounting file: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 256*acctRecordSize)
	for {
		// Whole records only: one being appended is not read half.
		n, err := io.ReadFull(f, buf)
		for i := 0; i+acctRecordSize <= n; i += acctRecordSize {
			r := parseAcct(buf[i : i+acctRecordSize])
			if r.version&0x7f != acctVersion {
				return acctRecord{}, false, fmt.Errorf("the accounting file %s holds a record of version %d, not %d (a kernel without CONFIG_BSD_PROCESS_ACCT_V3, or not the kernel's file)", a.path(gen), r.version&0x7f, acctVersion)
			}
			if r.pid == pid && math.Abs(float64(r.btime-start)) <= acctStartSlack {
				return r, true, nil
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return acctRecord{}, false, nil
		}
		if err != nil {
			return acctRecord{}, false, fmt.Errorf("read the accounting file: %w", err)
		}
	}
}

// bootTime reads the boot time, in Unix seconds, from /proc/stat.
func bootTime() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("/proc/stat has no btime")
}
