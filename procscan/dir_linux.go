package procscan

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openName opens name, NUL-terminated, in the directory dir,
// close-on-exec, retrying on EINTR. It is openat(2) called directly:
// unix.Openat copies its path to add the NUL, an allocation for every
// file of every process a scan reads.
func openName(dir int, name string, flags int) (int, error) {
	if len(name) == 0 || name[len(name)-1] != 0 {
		return -1, fmt.Errorf("open %q: the name must end with a NUL", name)
	}
	for {
		fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dir), uintptr(unsafe.Pointer(unsafe.StringData(name))),
			uintptr(flags|unix.O_CLOEXEC), 0, 0, 0)
		switch errno {
		case 0:
			return int(fd), nil
		case unix.EINTR:
			continue
		}
		return -1, errno
	}
}

// list calls fn with the name of every entry of the directory dir (path
// for messages), NUL-terminated, as getdents64(2) reads them into buf, a
// buffer's worth at a time; name is valid only during the call.
func list(dir int, path string, buf []byte, fn func(name string) error) error {
	for {
		n, err := unix.Getdents(dir, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", path, err)
		}
		if n == 0 {
			return nil
		}
		// struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen (2),
		// d_type (1), then d_name, NUL-terminated and padded.
		for off := 0; off+19 < n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen < 20 || off+reclen > n {
				return fmt.Errorf("list %s: a malformed directory entry", path)
			}
			name := buf[off+19 : off+reclen]
			off += reclen
			end := bytes.IndexByte(name, 0)
			if end < 0 {
				return fmt.Errorf("list %s: a directory entry without its NUL", path)
			}
			if err := fn(view(name[:end+1])); err != nil {
				return err
			}
		}
	}
}
