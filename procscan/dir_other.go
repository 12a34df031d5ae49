//go:build !linux

package procscan

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// openName opens name, NUL-terminated, in the directory dir,
// close-on-exec, retrying on EINTR.
func openName(dir int, name string, flags int) (int, error) {
	name, ok := strings.CutSuffix(name, "\x00")
	if !ok {
		return -1, fmt.Errorf("open %q: the name must end with a NUL", name)
	}
	for {
		fd, err := unix.Openat(dir, name, flags|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// list calls fn with the name of every entry of the directory path,
// NUL-terminated, a chunk of entries at a time. (Only Linux has /proc;
// this serves fixture trees.)
func list(_ int, path string, _ []byte, fn func(name string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("list %s: %w", path, err)
	}
	defer f.Close()
	for {
		names, err := f.Readdirnames(256)
		for _, name := range names {
			if err := fn(name + "\x00"); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", path, err)
		}
	}
}
