package pod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// fileWatch waits for a file that runc writes by renaming it into place
// (--pid-file), through inotify on its directory.
type fileWatch struct {
	path   string
	f      *os.File
	events chan struct{}
}

func watchFile(path string) (*fileWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch %s: %w", filepath.Dir(path), err)
	}
	// Non-blocking, so the runtime poller serves Read and Close ends it.
	w := &fileWatch{path: path, f: os.NewFile(uintptr(fd), "inotify"), events: make(chan struct{}, 1)}
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := w.f.Read(buf); err != nil {
				return
			}
			select {
			case w.events <- struct{}{}:
			default:
			}
		}
	}()
	return w, nil
}

// wait returns the pid in the file once it is there; it gives up when
// stopped is closed (runc ended) and the file is still missing.
func (w *fileWatch) wait(ctx context.Context, stopped <-chan struct{}) (int, error) {
	for ended := false; ; {
		b, err := os.ReadFile(w.path)
		switch {
		case err == nil:
			return strconv.Atoi(strings.TrimSpace(string(b)))
		case !errors.Is(err, os.ErrNotExist):
			return 0, err
		case ended:
			return 0, errors.New("runc ended before the container started (its error is in the container's log)")
		}
		select {
		case <-w.events:
		case <-stopped:
			ended = true
		case <-ctx.Done():
			return 0, fmt.Errorf("no pid file %s: %w", w.path, ctx.Err())
		}
	}
}

func (w *fileWatch) Close() error { return w.f.Close() }
