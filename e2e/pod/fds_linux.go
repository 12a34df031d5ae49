package pod

import (
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// closeInheritedOnExec marks every descriptor from 3 up close-on-exec. The
// test process may inherit some from whatever started it (a shell, a CI
// runner: one left a pipe at fd 251), and Go passes a descriptor not so
// marked to every process it starts: through the namespaces backend it
// reached the supervisor of a simulated pod, whose descriptors the
// hardening tests count (TestPrivileges counted 17, the pipe among them).
// A runtime starts each container with 0, 1 and 2 only; so does the
// harness now. Go opens its own descriptors close-on-exec already.
func closeInheritedOnExec() {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	// Before Linux 5.11: one by one.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
}
