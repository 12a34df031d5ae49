package procscan

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// pfKthread is PF_KTHREAD from include/linux/sched.h: the flags word of
// /proc/PID/stat has it for kernel threads. kthreadd has PPID 0 like a
// container's main process, so the flag is what keeps it out of the pod.
const pfKthread = 0x00200000

// pfExiting is PF_EXITING: the process has begun to exit (zombies too).
// On cgroup v1 hierarchies the kernel then shows its cgroup as "/"
// (proc_cgroup_show), no longer its container's.
const pfExiting = 0x00000004

// Process is one process as read from /proc, as plain values.
type Process struct {
	PID  int
	PPID int
	// StartTime is field 22 of /proc/PID/stat, in clock ticks since boot.
	// With PID it names a process uniquely: a recycled PID has a later one.
	StartTime uint64
	// Comm is the kernel's name for the process (at most 15 bytes; any bytes).
	Comm string
	// Argv0 is argv[0], from the first argv0Max bytes of /proc/PID/cmdline;
	// empty for zombies and kernel threads, and when argv[0] is longer
	// (no path is). The other arguments are never kept: they are not
	// needed, and can carry secrets (--password=...), as can the
	// environment that follows them.
	Argv0 string
	// InitArg is true when argv[0] is followed by one argument alone, the
	// word "init": how container runtimes run their init ("runc init",
	// "kata-agent init"). The one thing ever looked at past argv[0].
	InitArg bool
	// Cgroup is the whole content of /proc/PID/cgroup, byte for byte, but
	// for its final newline: one line per hierarchy. Equal Cgroup strings
	// mean the same container.
	Cgroup string
	// State is the one-letter state from /proc/PID/stat ("Z" for a zombie).
	State string
	// Exiting is true once the process has begun to exit (PF_EXITING), a
	// zombie included. Its v1 cgroup lines then read "/": see Classify.
	Exiting bool
	// UID is the owner of /proc/PID (the process's effective uid).
	UID int
}

// Name is the process's name as users write it: the base name of argv[0]
// when there is one, else the comm.
func (p Process) Name() string {
	if p.Argv0 != "" {
		return path.Base(p.Argv0)
	}
	return p.Comm
}

// Matches reports whether the comm or the base name of argv[0] is one of names.
func (p Process) Matches(names []string) bool {
	for _, n := range names {
		if n == "" {
			continue
		}
		if p.Comm == n || p.Name() == n {
			return true
		}
		// comm is truncated to 15 bytes (TASK_COMM_LEN-1): a long name
		// matches its truncation when argv[0] was rewritten or is empty.
		if len(n) > 15 && len(p.Comm) == 15 && n[:15] == p.Comm {
			return true
		}
	}
	return false
}

// IsZombie reports whether the process has exited and awaits its reaper.
func (p Process) IsZombie() bool { return p.State == "Z" }

// Scanner reads processes from a proc filesystem.
type Scanner struct {
	fs   procfs.FS
	root string
	// loadavg is /proc/loadavg, kept open for LastPID.
	loadavg struct {
		sync.Mutex
		f   *os.File
		buf [128]byte
	}
}

// NewScanner returns a Scanner over the proc filesystem mounted at root
// (normally /proc, or a fixture tree in tests).
func NewScanner(root string) (*Scanner, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return nil, fmt.Errorf("open proc filesystem %s: %w", root, err)
	}
	return &Scanner{fs: fs, root: root}, nil
}

// ErrGone is returned for a process that exited (and was reaped) while it
// was being read. It is an expected event, not a failure.
var ErrGone = errors.New("process is gone")

// Self returns the PID of the calling process as the proc filesystem sees it
// (its /proc/self link), which is its PID in the pod's namespace.
func (s *Scanner) Self() (int, error) {
	p, err := s.fs.Self()
	if err != nil {
		return 0, fmt.Errorf("read %s/self: %w", s.root, err)
	}
	return p.PID, nil
}

// Processes returns every user-space process (thread-group leader) visible
// now, ordered by PID. Kernel threads and processes that vanish while being
// read are left out. It holds them all: Scan, which keeps what Pod holds
// alone, is what the supervisor uses.
func (s *Scanner) Processes() ([]Process, error) {
	var out []Process
	err := s.Each(func(p Process) { out = append(out, p) })
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// Scan reads every process as Processes does and classifies them as
// Classify does, process by process as they are read: it keeps of each
// container what Container holds (see Count), so that its memory grows
// with the pod's containers, not with its processes, and on Linux it
// allocates nothing for a process it does not keep.
func (s *Scanner) Scan(self int, rules Rules) (Pod, error) {
	b := newBuilder(self, rules)
	if err := s.each(b.add); err != nil {
		return Pod{}, err
	}
	return b.pod(), nil
}

// Each calls fn with every user-space process (thread-group leader)
// visible now, in the order /proc lists them (by PID there, in no
// particular order in a fixture tree). Kernel threads and processes that
// vanish while being read are left out. It lists /proc a chunk of entries
// at a time and reads each process with buffers it reuses: what it holds
// does not grow with the number of processes. Processes that share a
// cgroup content share its string.
func (s *Scanner) Each(fn func(Process)) error {
	return s.each(func(p Process) { fn(p.owned()) })
}

// each is Each, but p's Comm and Argv0 are views of the reader's buffers,
// which the next process overwrites: fn must keep p only as p.owned().
// That is what spares a scan two allocations per process.
func (s *Scanner) each(fn func(Process)) error {
	root, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("list %s: %w", s.root, err)
	}
	defer unix.Close(root)
	r := newReader(s.root)
	return list(root, s.root, r.dirents[:], func(name string) error {
		// name is NUL-terminated.
		pid := 0
		for i := 0; i < len(name)-1; i++ {
			c := name[i]
			if c < '0' || c > '9' || pid > 1<<30 {
				return nil // self, thread-self, sys...
			}
			pid = pid*10 + int(c-'0')
		}
		if pid == 0 {
			return nil
		}
		p, err := r.readIn(root, name, pid)
		switch {
		case err == nil:
			fn(p)
		case errors.Is(err, ErrGone), errors.Is(err, errKernelThread):
			// Gone between readdir and read, or not a user process.
		default:
			return err
		}
		return nil
	})
}

// owned is p with strings of its own: see each.
func (p Process) owned() Process {
	p.Comm, p.Argv0 = strings.Clone(p.Comm), strings.Clone(p.Argv0)
	return p
}

// readIn reads the process of directory name (NUL-terminated) under the
// directory root.
func (r *reader) readIn(root int, name string, pid int) (Process, error) {
	dir, err := openName(root, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return Process{}, r.fail(pid, "", &fs.PathError{Op: "open", Path: r.root + "/" + strconv.Itoa(pid), Err: err})
	}
	defer unix.Close(dir)
	return r.read(pid, dir)
}

// Process reads one process. It returns ErrGone if it no longer exists.
func (s *Scanner) Process(pid int) (Process, error) {
	r := newReader(s.root)
	root, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Process{}, fmt.Errorf("open %s: %w", s.root, err)
	}
	defer unix.Close(root)
	p, err := r.readIn(root, strconv.Itoa(pid)+"\x00", pid)
	if errors.Is(err, errKernelThread) {
		return Process{}, fmt.Errorf("pid %d is a kernel thread: %w", pid, ErrGone)
	}
	return p.owned(), err
}

// StartTime reads only the start time of pid, for the PID-reuse check
// after a pidfd was opened.
func (s *Scanner) StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(s.root + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, gone(pid, err)
	}
	st, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("read pid %d: %w", pid, err)
	}
	return st.start, nil
}

var errKernelThread = errors.New("kernel thread")

// gone maps the errors of a process that disappeared mid-read to ErrGone:
// ENOENT once its /proc directory is removed, ESRCH for files of a task
// being torn down.
func gone(pid int, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	return fmt.Errorf("read pid %d: %w", pid, err)
}

// argv0Max bounds the read of /proc/PID/cmdline: argv[0] is a path or a
// name, and PATH_MAX is 4096 with its NUL. Reading no further keeps the
// other arguments (and, for a process that overwrote its argv, its
// environment, which the kernel then shows too) out of this process, and
// keeps a scan's memory from growing with other processes' command lines.
const argv0Max = 4096

// cgroupMax bounds the read of /proc/PID/cgroup: a line per hierarchy, each
// path cut by the kernel at PATH_MAX. The content is the container's
// identity, so it is kept byte for byte: a parse and rebuild (procfs's,
// v0.23.0) dropped a '\r' ending a path, and so made two cgroups, "x" and
// "x\r", one container (found by FuzzProcessFields).
const cgroupMax = 1 << 20

// Tick is the unit of /proc/PID/stat's start time (Process.StartTime):
// 1/USER_HZ, USER_HZ being 100 on every architecture Kubernetes runs on.
const Tick = time.Second / 100

// Age is how long ago p started, to within a tick (10 ms; it may read up
// to a tick long): the kernel's boot clock now (CLOCK_BOOTTIME) less p's
// start time, which counts that clock (task->start_boottime since Linux
// 5.5, real_start_time before, boot-based since 3.17; both shifted alike
// in a time namespace).
func Age(p Process) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("read the boot clock: %w", err)
	}
	return time.Duration(ts.Nano()) - time.Duration(p.StartTime)*Tick, nil
}
