package procscan

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// Signals is what /proc/PID/status says of a process's signal dispositions:
// the signals it catches (SigCgt) and ignores (SigIgn), bit n-1 for signal
// n. The file is world-readable: no privilege is needed to read another
// uid's.
type Signals struct {
	Caught, Ignored uint64
}

// Handles reports whether sig reaches a handler or is ignored, rather than
// taking its default action (for SIGTERM, death: exit 143).
//
// A handler is a fact about the process, not about the program's intent: a
// Go program's runtime installs its own handler for nearly every signal as
// it starts, and until the program calls signal.Notify that handler applies
// the default action itself. So for a Go program, Handles(SIGTERM) is true
// from its first milliseconds on, whether or not SIGTERM would stop it
// gracefully yet (see the supervisor's sidecar table for what else tells).
func (s Signals) Handles(sig int) bool {
	if sig < 1 || sig > 64 {
		return false
	}
	bit := uint64(1) << (sig - 1)
	return (s.Caught|s.Ignored)&bit != 0
}

// statusMax bounds the read of /proc/PID/status (about 1.5 KiB in practice).
const statusMax = 64 << 10

// Signals reads pid's signal dispositions. It returns ErrGone if the
// process no longer exists.
func (s *Scanner) Signals(pid int) (Signals, error) {
	f, err := os.Open(s.root + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Signals{}, gone(pid, err)
	}
	defer f.Close()
	return parseSignals(io.LimitReader(f, statusMax), pid)
}

func parseSignals(r io.Reader, pid int) (Signals, error) {
	var out Signals
	var cgt, ign bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch key {
		case "SigCgt":
			dst, cgt = &out.Caught, true
		case "SigIgn":
			dst, ign = &out.Ignored, true
		default:
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(val), 16, 64)
		if err != nil {
			return Signals{}, fmt.Errorf("pid %d status: bad %s %q", pid, key, strings.TrimSpace(val))
		}
		*dst = v
	}
	if err := sc.Err(); err != nil {
		return Signals{}, gone(pid, err)
	}
	if !cgt || !ign {
		return Signals{}, fmt.Errorf("pid %d status: no SigCgt or SigIgn line", pid)
	}
	return out, nil
}

// Children returns the processes whose parent is pid, read from
// /proc/PID/task/*/children (a child is listed under the thread that forked
// it). ErrNoChildrenFile means the kernel lacks CONFIG_PROC_CHILDREN: scan
// the whole of /proc instead.
func (s *Scanner) Children(pid int) ([]Process, error) {
	dir := s.root + "/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil, gone(pid, err)
	}
	var out []Process
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/children")
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(dir + "/" + t.Name()); serr == nil {
				return nil, ErrNoChildrenFile
			}
			continue // the thread ended meanwhile
		}
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			cpid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			p, err := s.Process(cpid)
			if err != nil {
				continue // gone already
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// ErrNoChildrenFile: the kernel was built without CONFIG_PROC_CHILDREN.
var ErrNoChildrenFile = errors.New("no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)")

// argsMax bounds the read of a whole command line (Args).
const argsMax = 64 << 10

// Args reads pid's whole command line: for a sidecar's main process only,
// to find the flags that set up its stop (its HTTP stop's port, whether it
// is on). A command line can carry secrets (--password=...): the caller
// keeps what it looks for and nothing else, and never logs it.
//
// A process in the middle of an exec has none (nil, no error): the kernel
// gives it its new memory and its new comm (begin_new_exec), and only then
// sets where its command line lies (create_elf_tables), so a scan can find
// it already named as its new program but with an empty command line.
// Seen here in 1 of 5 first sights of an exec'd /bin/sleep's new comm,
// and on the cluster: a sidecar caught so had its flags read empty. A
// zombie's and a kernel thread's are empty too. A program that has
// finished its exec has one (its argv[0]; from Linux 5.18 a lone NUL
// where it was exec'd with no argv at all, before that none), so an empty
// one does not last, but for a zombie.
func (s *Scanner) Args(pid int) ([]string, error) {
	f, err := os.Open(s.root + "/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, gone(pid, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, argsMax))
	if err != nil {
		return nil, gone(pid, err)
	}
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}
