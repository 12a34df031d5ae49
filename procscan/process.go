package procscan

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"
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
	// (no path is). The other arguments are never read: they are not
	// needed, and can carry secrets (--password=...), as can the
	// environment that follows them.
	Argv0 string
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
// read are left out.
func (s *Scanner) Processes() ([]Process, error) {
	all, err := s.fs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.root, err)
	}
	out := make([]Process, 0, len(all))
	for _, p := range all {
		// p is usable as it is: fs.Proc would stat its directory again.
		proc, err := s.read(p)
		switch {
		case err == nil:
			out = append(out, proc)
		case errors.Is(err, ErrGone), errors.Is(err, errKernelThread):
			// Gone between readdir and read, or not a user process.
		default:
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// Process reads one process. It returns ErrGone if it no longer exists.
func (s *Scanner) Process(pid int) (Process, error) {
	fp, err := s.fs.Proc(pid)
	if err != nil {
		return Process{}, gone(pid, err)
	}
	p, err := s.read(fp)
	if errors.Is(err, errKernelThread) {
		return Process{}, fmt.Errorf("pid %d is a kernel thread: %w", pid, ErrGone)
	}
	return p, err
}

// StartTime reads only the start time of pid, for the PID-reuse check
// after a pidfd was opened.
func (s *Scanner) StartTime(pid int) (uint64, error) {
	p, err := s.fs.Proc(pid)
	if err != nil {
		return 0, gone(pid, err)
	}
	st, err := stat(p)
	if err != nil {
		return 0, gone(pid, err)
	}
	return st.Starttime, nil
}

// stat parses /proc/PID/stat. procfs (v0.23.0) slices the file at its
// parentheses without checking them, and panics on a stat that ends at the
// ')' or has it before the '(' (found by FuzzProcess). The kernel never
// writes either, whatever the comm, but a supervisor must not crash on its
// input: such a file is an error, procfs.ErrFileParse as for other bad ones.
func stat(p procfs.Proc) (st procfs.ProcStat, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: malformed stat: %v", procfs.ErrFileParse, r)
		}
	}()
	return p.Stat()
}

var errKernelThread = errors.New("kernel thread")

func (s *Scanner) read(p procfs.Proc) (Process, error) {
	pid := p.PID
	// The directory's owner is the process's uid.
	dir := s.root + "/" + strconv.Itoa(pid)
	fi, err := os.Stat(dir)
	if err != nil {
		return Process{}, gone(pid, err)
	}
	// The cgroup before the stat: a process can begin to exit between the
	// two reads, and then shows "/" for its v1 lines. PF_EXITING, once set,
	// stays: read in this order, a cgroup in that form always comes with
	// Exiting (in the other order, a process read as alive could carry it,
	// and make a phantom container: found by TestRealChurn).
	cg, err := readCgroup(dir + "/cgroup")
	if err != nil {
		return Process{}, gone(pid, err)
	}
	argv0, err := readArgv0(dir + "/cmdline")
	if err != nil {
		return Process{}, gone(pid, err)
	}
	st, err := stat(p)
	if err != nil {
		return Process{}, gone(pid, err)
	}
	if st.Flags&pfKthread != 0 {
		return Process{}, errKernelThread
	}
	proc := Process{
		PID:       pid,
		PPID:      st.PPID,
		StartTime: st.Starttime,
		Comm:      st.Comm,
		Argv0:     argv0,
		Cgroup:    cg,
		State:     st.State,
		Exiting:   st.Flags&pfExiting != 0,
		UID:       -1,
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		proc.UID = int(sys.Uid)
	}
	return proc, nil
}

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

// readArgv0 returns argv[0] from a cmdline file: up to the first NUL, or
// all of a shorter content without one (a process that rewrote its argv as
// one title); "" if argv[0] does not end within argv0Max bytes.
func readArgv0(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, argv0Max)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", err
	}
	buf = buf[:n]
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		return string(buf[:i]), nil
	}
	if n == argv0Max {
		return "", nil
	}
	return string(buf), nil
}

// cgroupMax bounds the read of /proc/PID/cgroup: a line per hierarchy, each
// path cut by the kernel at PATH_MAX.
const cgroupMax = 1 << 20

// readCgroup returns a cgroup file's content without its final newline.
// It is the container's identity, so it is kept byte for byte: a parse and
// rebuild (procfs's, v0.23.0) dropped a '\r' ending a path, and so made two
// cgroups, "x" and "x\r", one container (found by FuzzProcessFields).
func readCgroup(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, cgroupMax))
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}
