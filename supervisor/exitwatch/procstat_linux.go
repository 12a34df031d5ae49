//go:build linux

package exitwatch

// The fields of /proc/PID/stat the methods read: the state, the start time
// (for the PID-reuse checks of pidfd, ptrace, accounting and the anchor)
// and the CPU time (for the ptrace probe's child).

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// startTime reads field 22 of /proc/PID/stat, for the PID-reuse check. The
// fields are counted from the last ')': the comm before it may hold any
// byte, spaces and parentheses included.
func startTime(pid int) (uint64, error) {
	_, st, err := procStat(pid)
	return st, err
}

// procStat reads a process's state (field 3: 'Z' for a zombie) and start
// time from /proc/PID/stat.
func procStat(pid int) (byte, uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, 0, err
	}
	st, err := strconv.ParseUint(string(f[19]), 10, 64)
	return f[0][0], st, err
}

// procCPU reads a process's state and the CPU time it has had, user and
// system (fields 14 and 15, in clock ticks: USER_HZ, 100 on Linux).
func procCPU(pid int) (byte, time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, 0, err
	}
	var ticks uint64
	for _, b := range f[11:13] {
		n, err := strconv.ParseUint(string(b), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("pid %d: malformed stat: %w", pid, err)
		}
		ticks += n
	}
	return f[0][0], time.Duration(ticks) * (time.Second / 100), nil
}

// statFields are the fields of /proc/PID/stat after the comm, from the
// state (field 3) on.
func statFields(pid int) ([][]byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("read pid %d: %w", pid, err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("pid %d: malformed stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	// After the comm: state (3), ppid (4), ... starttime (22).
	if len(f) < 20 || len(f[0]) != 1 {
		return nil, fmt.Errorf("pid %d: malformed stat", pid)
	}
	return f, nil
}
