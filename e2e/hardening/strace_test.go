package hardening

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// straceCall is one completed system call from an strace -f log.
type straceCall struct {
	tid  int
	name string
	args string // as strace printed them, parentheses excluded
	ret  string // "= 5<pid:13>", "= -1 ENOENT (...)"
}

// straceArgs wraps argv to run under strace, following every thread and
// child, tracing the calls the tests check and printing the PID behind each
// pidfd (decode-fds=pidfd: strace reads it from fdinfo, in the pod's PID
// namespace, like the supervisor's own view).
func straceArgs(strace, out string, argv ...string) []string {
	calls := []string{
		// Everything that opens a file.
		"open", "openat", "openat2", "creat", "name_to_handle_at", "open_by_handle_at",
		// Everything that sends a signal.
		"kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal",
		"pidfd_open", "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev",
		// Sockets.
		"socket", "bind", "listen", "connect", "accept", "accept4",
	}
	return append([]string{strace, "-f", "-qq", "-o", out,
		"-e", "trace=" + strings.Join(calls, ","), "-e", "signal=none", "-e", "decode-fds=pidfd",
		"-s", "256", "--"}, argv...)
}

var (
	straceLine    = regexp.MustCompile(`^(\d+) +(.*)$`)
	straceCallRE  = regexp.MustCompile(`^([a-z0-9_]+)\((.*)\) += (.*)$`)
	straceResumed = regexp.MustCompile(`^<\.\.\. ([a-z0-9_]+) resumed>(.*)$`)
	stracePidfd   = regexp.MustCompile(`<pid:(\d+)>`)
)

// parseStrace reads an strace -f log: lines "TID call(args) = ret", with a
// call that another thread interrupted split over an "<unfinished ...>"
// line and a "<... call resumed>" one, which are joined. Calls are in the
// order they returned.
func parseStrace(t *testing.T, path string) []straceCall {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("strace log: %v", err)
	}
	defer f.Close()
	pending := map[int]string{} // tid -> the unfinished line's start
	var out []straceCall
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := straceLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tid, _ := strconv.Atoi(m[1])
		rest := m[2]
		if head, ok := strings.CutSuffix(rest, " <unfinished ...>"); ok {
			pending[tid] = head
			continue
		}
		if r := straceResumed.FindStringSubmatch(rest); r != nil {
			rest = pending[tid] + r[2]
			delete(pending, tid)
		}
		c := straceCallRE.FindStringSubmatch(rest)
		if c == nil {
			continue // exits, signals, "+++ exited"
		}
		out = append(out, straceCall{tid: tid, name: c[1], args: c[2], ret: c[3]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("strace log %s has no calls", path)
	}
	return out
}

// openPaths resolves the paths of open calls in trace order. The scan opens
// /proc once and each process's directory and files relative to it
// (openat(9, "123") = 11, then openat(11, "stat")), so a call's path is its
// directory descriptor's path, which an earlier open in the trace returned,
// joined with the name it passes. Descriptors are kept for the whole trace
// (the supervisor's threads share one table; a number reused by another
// open is overwritten by that open).
type openPaths map[string]string

// path is the absolute path c opened, and records it under c's descriptor;
// "" when c names no path. The name c passed is its first quoted argument,
// as strace printed it: non-printable bytes as \xNN (and -s 256 keeps
// /proc paths whole).
func (o openPaths) path(c straceCall) string {
	_, quoted, ok := strings.Cut(c.args, `"`)
	name, _, closed := strings.Cut(quoted, `"`)
	if !ok || !closed {
		return ""
	}
	if !strings.HasPrefix(name, "/") {
		dirfd, _, _ := strings.Cut(c.args, ",")
		if dir, ok := o[strings.TrimSpace(dirfd)]; ok {
			name = dir + "/" + name
		} else if dirfd != "AT_FDCWD" {
			name = "<fd " + dirfd + ">/" + name
		}
	}
	if fd, _, _ := strings.Cut(c.ret, " "); fd != "" && fd[0] != '-' {
		o[fd] = name
	}
	return name
}

// pidfdTarget is the PID behind the first pidfd of a call's arguments,
// printed as "5<pid:123>"; -1 when there is none.
func pidfdTarget(args string) int {
	m := stracePidfd.FindStringSubmatch(args)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// argN is the n-th comma-separated argument. The arguments read here (a
// PID, a pidfd, a signal) and those before them hold no comma.
func argN(args string, n int) string {
	if f := strings.Split(args, ","); n < len(f) {
		return strings.TrimSpace(f[n])
	}
	return ""
}
