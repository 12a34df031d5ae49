package procscan

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// LastPID is the PID the kernel allocated last in the reader's PID
// namespace: the last field of /proc/loadavg, which every kernel shows
// for the namespace of the process reading it (unlike
// /proc/sys/kernel/ns_last_pid, which needs CONFIG_CHECKPOINT_RESTORE).
// A new process or thread anywhere in the pod moves it: one read tells
// whether a scan could find anything new. It names no one (threads, probes
// and exec'd commands take PIDs too), and it says nothing of processes
// that came and went: only a scan does.
//
// The file stays open: each call is one pread, which the kernel answers
// afresh from offset 0. It is called every few milliseconds while the apps
// are looked for, by a supervisor whose CPU limit is tens of millicores.
func (s *Scanner) LastPID() (int, error) {
	l := &s.loadavg
	l.Lock()
	defer l.Unlock()
	if l.f == nil {
		f, err := os.Open(s.root + "/loadavg")
		if err != nil {
			return 0, err
		}
		l.f = f
	}
	n, err := l.f.ReadAt(l.buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return parseLastPID(string(l.buf[:n]))
}

// parseLastPID reads "0.20 0.18 0.12 1/80 11206".
func parseLastPID(s string) (int, error) {
	f := strings.Fields(s)
	if len(f) != 5 || !strings.Contains(f[3], "/") {
		return 0, fmt.Errorf("loadavg: unexpected %q", s)
	}
	n, err := strconv.Atoi(f[4])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("loadavg: last PID %q", f[4])
	}
	return n, nil
}
