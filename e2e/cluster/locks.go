package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The cluster's locks are flocks on two files next to its state directory
// (stateDir):
//
//	.start.lock  held exclusively by whoever starts the cluster
//	             (cluster-up.sh), tears it down (cluster-down.sh) or
//	             restarts one of its daemons (cluster-restart.sh);
//	.users.lock  held shared by every Cluster in use, and tried
//	             exclusively, without waiting, to learn whether another
//	             test uses the cluster.
//
// os.OpenFile opens them close-on-exec, so no script or daemon inherits
// one, and the kernel drops a flock when its holder dies: a lock that is
// held has a live holder.
const (
	startLock = ".start.lock"
	usersLock = ".users.lock"
)

// waitLock opens path and takes a flock of kind how (LOCK_SH or LOCK_EX),
// waiting as long as another process holds a conflicting one: bounded by
// ctx alone. That process lives (see above) and works, a cold start
// building Kubernetes for ten minutes or more, slower when two checkouts
// share the machine, and no fixed bound knows for how long. While it
// waits it logs the holder's note (noteHolder) with logf, at once and then
// every five minutes. Closing the file releases the lock.
func waitLock(ctx context.Context, path string, how int, logf func(format string, args ...any)) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	var next time.Time
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		if now := time.Now(); !now.Before(next) {
			logf("waiting (%s so far) for %s, held by %s", now.Sub(t0).Round(time.Second), path, holder(path))
			next = now.Add(5 * time.Minute)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for %s, held by %s: %w", path, holder(path), context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// tryLock takes a flock of kind how on path if no other process holds a
// conflicting one, without waiting; it returns nil, nil if one does.
func tryLock(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	switch err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); {
	case err == nil:
		return f, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		f.Close()
		return nil, nil
	default:
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
}

// noteHolder writes into f, a lock file this process has just locked
// exclusively, who holds it, for the log of a process waiting for it
// (holder). Best effort: only a log reads it.
func noteHolder(f *os.File) {
	note := fmt.Sprintf("pid %d (%s) since %s\n", os.Getpid(), strings.Join(os.Args, " "), time.Now().Format(time.RFC3339))
	if f.Truncate(0) == nil {
		_, _ = f.WriteAt([]byte(note), 0)
	}
}

// holder is what the holder of the lock file at path noted (noteHolder),
// unless the process noted is gone: then the holder is one that writes no
// note (an older checkout's code) and the note is an earlier holder's.
func holder(path string) string {
	b, err := os.ReadFile(path)
	note := strings.TrimSpace(string(b))
	var pid int
	if err != nil || note == "" {
		return "a process that left no note"
	}
	if _, err := fmt.Sscanf(note, "pid %d", &pid); err == nil {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return "a process that left no note (the note names pid " + strconv.Itoa(pid) + ", gone)"
		}
	}
	return note
}
