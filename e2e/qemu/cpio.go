package qemu

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"path"
	"syscall"
)

// cpioWriter writes the "newc" cpio format that the kernel unpacks into its
// initial root file system (Documentation/driver-api/early-userspace/
// buffer-format.rst). Written here because the build machines have no cpio
// command, and because a Go writer can add device nodes without being root.
//
// The kernel creates each entry with a plain open/mkdir/mknod, no parents:
// every directory must come before what it contains, which dir ensures.
type cpioWriter struct {
	w    *bufio.Writer
	n    int64 // bytes written, for padding
	ino  uint32
	seen map[string]bool
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), seen: map[string]bool{"/": true}}
}

// The kernel knows these only as the numbers of <sys/stat.h>; fs.FileMode
// uses its own bits.
const (
	sIFDIR = syscall.S_IFDIR
	sIFREG = syscall.S_IFREG
	sIFLNK = syscall.S_IFLNK
	sIFCHR = syscall.S_IFCHR
)

func (c *cpioWriter) write(p []byte) error {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return err
}

// pad aligns the stream to four bytes, as newc wants after names and data.
func (c *cpioWriter) pad() error {
	if r := c.n % 4; r != 0 {
		return c.write(make([]byte, 4-r))
	}
	return nil
}

func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) error {
	if size > 0xffffffff {
		return fmt.Errorf("%s: %d bytes is too large for cpio newc", name, size)
	}
	c.ino++
	nlink := uint32(1)
	if mode&syscall.S_IFMT == sIFDIR {
		nlink = 2
	}
	// Names are stored without the leading slash, as `find . | cpio` would
	// (the kernel accepts both).
	rel := name
	if rel != "TRAILER!!!" {
		rel = "." + name
	}
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, uint32(size), 0, 0, rdevMajor, rdevMinor, len(rel)+1, 0)
	if err := c.write([]byte(h)); err != nil {
		return err
	}
	if err := c.write(append([]byte(rel), 0)); err != nil {
		return err
	}
	return c.pad()
}

// claim records name as written and refuses a second entry for it: the
// kernel would silently keep the last one, hiding a caller's mistake.
func (c *cpioWriter) claim(name string) error {
	if c.seen[name] {
		return fmt.Errorf("initramfs: %s added twice", name)
	}
	c.seen[name] = true
	return nil
}

// dir writes name and its missing parents as directories. An existing
// directory is fine.
func (c *cpioWriter) dir(name string, perm fs.FileMode) error {
	if c.seen[name] {
		return nil
	}
	if err := c.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	c.seen[name] = true
	return c.header(name, sIFDIR|uint32(perm.Perm()), 0, 0, 0)
}

// file writes a regular file of size bytes read from r.
func (c *cpioWriter) file(name string, perm fs.FileMode, size int64, r io.Reader) error {
	if err := c.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	if err := c.claim(name); err != nil {
		return err
	}
	// Keep setuid/setgid/sticky as given; fs.FileMode has them elsewhere.
	mode := sIFREG | uint32(perm.Perm())
	if perm&fs.ModeSetuid != 0 {
		mode |= syscall.S_ISUID
	}
	if perm&fs.ModeSetgid != 0 {
		mode |= syscall.S_ISGID
	}
	if perm&fs.ModeSticky != 0 {
		mode |= syscall.S_ISVTX
	}
	if err := c.header(name, mode, size, 0, 0); err != nil {
		return err
	}
	n, err := io.CopyN(c.w, r, size)
	c.n += n
	if err != nil {
		return fmt.Errorf("initramfs: %s: %w", name, err)
	}
	return c.pad()
}

// symlink writes name pointing at target.
func (c *cpioWriter) symlink(name, target string) error {
	if err := c.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	if err := c.claim(name); err != nil {
		return err
	}
	if err := c.header(name, sIFLNK|0o777, int64(len(target)), 0, 0); err != nil {
		return err
	}
	if err := c.write([]byte(target)); err != nil {
		return err
	}
	return c.pad()
}

// charDev writes a character device node.
func (c *cpioWriter) charDev(name string, perm fs.FileMode, major, minor uint32) error {
	if err := c.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	if err := c.claim(name); err != nil {
		return err
	}
	return c.header(name, sIFCHR|uint32(perm.Perm()), 0, major, minor)
}

// close writes the trailer and flushes.
func (c *cpioWriter) close() error {
	if err := c.header("TRAILER!!!", 0, 0, 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}
