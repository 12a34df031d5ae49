package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestLocks: tryLock never waits; waitLock waits for as long as the holder
// keeps the lock, naming it, and ends with its ctx only. A flock is per
// open file, so one process stands in for two. Needs no root.
func TestLocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "start.lock")
	held, err := tryLock(path, syscall.LOCK_EX)
	if err != nil || held == nil {
		t.Fatalf("tryLock on a free lock: %v, %v", held, err)
	}
	noteHolder(held)
	if busy, err := tryLock(path, syscall.LOCK_EX); err != nil || busy != nil {
		t.Fatalf("tryLock on a held lock: %v, %v; want nil, nil", busy, err)
	}
	if h, want := holder(path), fmt.Sprintf("pid %d (", os.Getpid()); !strings.HasPrefix(h, want) {
		t.Errorf("holder %q, want it to start with %q", h, want)
	}

	// Released while waited for: the waiter gets it.
	waiting := make(chan string, 1)
	logf := func(format string, args ...any) {
		select {
		case waiting <- fmt.Sprintf(format, args...):
		default:
		}
	}
	got := make(chan error, 1)
	go func() {
		f, err := waitLock(context.Background(), path, syscall.LOCK_SH, logf)
		if f != nil {
			f.Close()
		}
		got <- err
	}()
	if line := <-waiting; !strings.Contains(line, fmt.Sprintf("held by pid %d (", os.Getpid())) {
		t.Errorf("waiting log %q does not name the holder", line)
	}
	held.Close()
	if err := <-got; err != nil {
		t.Fatalf("waitLock after the release: %v", err)
	}

	// Never released: the wait ends with ctx, and says who held the lock.
	held, err = tryLock(path, syscall.LOCK_EX)
	if err != nil || held == nil {
		t.Fatalf("tryLock on a free lock: %v, %v", held, err)
	}
	defer held.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-waiting
		cancel()
	}()
	f, err := waitLock(ctx, path, syscall.LOCK_EX, logf)
	if f != nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "held by") {
		t.Errorf("waitLock cancelled: %v, %v; want nil and a context.Canceled naming the holder", f, err)
	}
}
