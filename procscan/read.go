package procscan

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/prometheus/procfs"
)

// reader reads processes one after the other through buffers it reuses,
// so that reading a process allocates nothing but a cgroup content not
// seen before in the pass (intern: the thousands of processes of a
// container share one string). The Process it returns has its Comm and
// Argv0 in its buffers, until the next read (see Scanner.each). A reader
// serves one pass over /proc; it is not safe for concurrent use.
type reader struct {
	root                  string
	stat, cmdline, cgroup []byte
	// dirents is the buffer of the listing (list).
	dirents [8 << 10]byte
	// intern holds each cgroup content read in this pass.
	intern map[string]string
	st     unix.Stat_t
}

func newReader(root string) *reader {
	return &reader{root: root, intern: map[string]string{},
		stat: make([]byte, 0, 512), cmdline: make([]byte, 0, 256), cgroup: make([]byte, 0, 512)}
}

// statMax bounds the read of /proc/PID/stat: about 300 bytes, a comm of
// at most 64 bytes (kernel threads) included. A longer file is malformed.
const statMax = 64 << 10

// read reads the process whose /proc directory is open as dir. The
// directory's descriptor holds its process: once the process is reaped,
// every file read through it fails (ESRCH, ENOENT), even if its PID is
// reused meanwhile, so the three files are always one process's.
func (r *reader) read(pid, dir int) (Process, error) {
	if err := unix.Fstat(dir, &r.st); err != nil {
		return Process{}, r.fail(pid, "", err)
	}
	// The cgroup before the stat: a process can begin to exit between the
	// two reads, and then shows "/" for its v1 lines. PF_EXITING, once set,
	// stays: read in this order, a cgroup in that form always comes with
	// Exiting (in the other order, a process read as alive could carry it,
	// and make a phantom container: found by TestRealChurn).
	var err error
	if r.cgroup, _, err = readAt(dir, "cgroup\x00", r.cgroup[:0], cgroupMax); err != nil {
		return Process{}, r.fail(pid, "cgroup", err)
	}
	if r.cmdline, _, err = readAt(dir, "cmdline\x00", r.cmdline[:0], argv0Max); err != nil {
		return Process{}, r.fail(pid, "cmdline", err)
	}
	var long bool
	if r.stat, long, err = readAt(dir, "stat\x00", r.stat[:0], statMax+1); err != nil {
		return Process{}, r.fail(pid, "stat", err)
	}
	if long {
		return Process{}, fmt.Errorf("read pid %d: %w: stat longer than %d bytes", pid, procfs.ErrFileParse, statMax)
	}
	s, err := parseStat(r.stat)
	if err != nil {
		return Process{}, fmt.Errorf("read pid %d: %w", pid, err)
	}
	if s.flags&pfKthread != 0 {
		return Process{}, errKernelThread
	}
	a0 := argv0(r.cmdline)
	return Process{
		PID:       pid,
		PPID:      s.ppid,
		StartTime: s.start,
		Comm:      view(s.comm),
		Argv0:     view(a0),
		InitArg:   initArg(r.cmdline, a0),
		Cgroup:    r.content(r.cgroup),
		State:     state(s.state),
		Exiting:   s.flags&pfExiting != 0,
		UID:       int(r.st.Uid),
	}, nil
}

// view is b as a string without a copy: valid only as long as b's bytes
// stay as they are, that is until the reader's next read.
func view(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// fail maps an error reading pid's file to ErrGone where it means the
// process is gone (see gone), naming the file otherwise.
func (r *reader) fail(pid int, file string, err error) error {
	if file != "" {
		err = &fs.PathError{Op: "read", Path: r.root + "/" + strconv.Itoa(pid) + "/" + file, Err: err}
	}
	return gone(pid, err)
}

// content returns a cgroup content as a string without its final newline,
// one string per distinct content.
func (r *reader) content(b []byte) string {
	b = bytes.TrimSuffix(b, []byte("\n"))
	if s, ok := r.intern[string(b)]; ok {
		return s
	}
	s := string(b)
	r.intern[s] = s
	return s
}

// argv0 returns argv[0] from the first argv0Max bytes of a cmdline file:
// up to the first NUL, or all of a shorter content without one (a process
// that rewrote its argv as one title); none if argv[0] does not end within
// argv0Max bytes.
func argv0(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	if len(b) >= argv0Max {
		return nil
	}
	return b
}

// initArg reports whether a cmdline file b, whose argv[0] is a0, holds
// argv[0] and the one argument "init" (Process.InitArg).
func initArg(b, a0 []byte) bool {
	return len(a0) > 0 && bytes.Equal(b[len(a0):], []byte("\x00init\x00"))
}

// readAt reads the file name (NUL-terminated) of the directory dir into
// buf, up to limit bytes, and reports whether there was more.
func readAt(dir int, name string, buf []byte, limit int) ([]byte, bool, error) {
	fd, err := openName(dir, name, unix.O_RDONLY)
	if err != nil {
		return buf, false, err
	}
	defer unix.Close(fd)
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(len(buf), 512))
		}
		n, err := unix.Read(fd, buf[len(buf):min(cap(buf), limit)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return buf, false, err
		}
		if n == 0 {
			return buf, false, nil
		}
		buf = buf[:len(buf)+n]
	}
	// Full: one byte more says whether the file goes on.
	var one [1]byte
	for {
		n, err := unix.Read(fd, one[:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return buf, n > 0, err
	}
}

// stat is what procscan reads of /proc/PID/stat.
type stat struct {
	comm, state []byte
	ppid        int
	flags       uint64
	start       uint64
}

// Fields of /proc/PID/stat after the comm, counted from the state (field
// 3 in proc(5)).
const (
	statPPID  = 4 - 3
	statFlags = 9 - 3
	statStart = 22 - 3
)

// parseStat parses /proc/PID/stat (fs/proc/array.c): "pid (comm) state
// ppid ...". The comm is any bytes but NUL, parentheses and spaces
// included, so it is what lies between the first '(' and the last ')';
// the fields after it are numbers separated by spaces. A file not in that
// form is an error wrapping procfs.ErrFileParse.
func parseStat(b []byte) (stat, error) {
	l, r := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if l < 0 || r < l {
		return stat{}, fmt.Errorf("%w: malformed stat: no (comm)", procfs.ErrFileParse)
	}
	s := stat{comm: b[l+1 : r]}
	rest := b[r+1:]
	for i := 0; i <= statStart; i++ {
		var f []byte
		f, rest = field(rest)
		if f == nil {
			return stat{}, fmt.Errorf("%w: malformed stat: %d fields after the comm, want %d at least", procfs.ErrFileParse, i, statStart+1)
		}
		var err error
		switch i {
		case 0:
			s.state = f
		case statPPID:
			s.ppid, err = strconv.Atoi(string(f))
		case statFlags:
			s.flags, err = strconv.ParseUint(string(f), 10, 64)
		case statStart:
			s.start, err = strconv.ParseUint(string(f), 10, 64)
		}
		if err != nil {
			return stat{}, fmt.Errorf("%w: malformed stat: field %d: %w", procfs.ErrFileParse, i+3, err)
		}
	}
	return s, nil
}

// field splits the first space-separated field off b; nil when none is left.
func field(b []byte) (f, rest []byte) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	if i == j {
		return nil, nil
	}
	return b[i:j], b[j:]
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
}

// states are the one-letter process states as strings, so that reading
// one allocates nothing.
var states = func() (s [128]string) {
	for c := range s {
		s[c] = string(rune(c))
	}
	return s
}()

func state(b []byte) string {
	if len(b) == 1 && b[0] < 128 {
		return states[b[0]]
	}
	return string(b)
}
