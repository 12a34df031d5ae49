package qemu

import (
	"bytes"
	"cmp"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// File is one file to put into the guest's initramfs.
type File struct {
	// Host is the file to copy. Leave it empty to use Data.
	Host string
	// Data is the content when Host is empty.
	Data []byte
	// Guest is the absolute path in the guest, e.g. "/bin/supervisor".
	// Missing parent directories are created.
	Guest string
	// Mode is the guest file's permission bits. Zero means the host file's
	// mode, or 0644 for Data.
	Mode fs.FileMode
}

// Tree is a host directory to copy, with everything below it, into the
// guest's initramfs at Guest.
type Tree struct {
	Host  string
	Guest string
}

// Paths the initramfs reserves for itself; a File may not replace them.
const (
	guestInit    = "/init"
	guestBusybox = "/bin/busybox"
	guestCommand = "/.qemu/command.sh"
)

// reserved reports whether the initramfs keeps guest path p for itself.
func reserved(p string) bool {
	switch p {
	case guestInit, guestBusybox, guestCommand, guestExit, "/dev/console":
		return true
	}
	return false
}

// initramfs is everything that goes into one guest's root file system.
type initramfs struct {
	machine elf.Machine // the guest's: every executable must be built for it
	goarch  string      // its Go name, for error messages
	helpers []File      // the package's own files (the exit helper)
	busybox string      // host path
	init    []byte
	script  []byte // Config.Script, if any
	files   []File
	trees   []Tree
}

// write writes the archive to name, uncompressed: the kernel unpacks a plain
// cpio without a decompression pass, which under TCG is the faster choice,
// and the file is deleted after the run anyway.
func (s initramfs) write(name string) (size int64, err error) {
	f, err := os.Create(name)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	c := newCPIOWriter(f)

	for _, d := range []struct {
		name string
		perm fs.FileMode
	}{
		{"/bin", 0o755}, {"/sbin", 0o755}, {"/usr/bin", 0o755}, {"/usr/sbin", 0o755},
		{"/dev", 0o755}, {"/proc", 0o555}, {"/sys", 0o555}, {"/run", 0o755},
		{"/tmp", 0o1777}, {"/root", 0o700}, {"/etc", 0o755}, {"/.qemu", 0o755},
		{"/mnt", 0o755}, {"/var", 0o755},
	} {
		if err := c.dir(d.name, d.perm); err != nil {
			return 0, err
		}
	}
	// Without /dev/console in the archive the kernel starts /init with no
	// stdin, stdout or stderr ("unable to open an initial console").
	if err := c.charDev("/dev/console", 0o600, 5, 1); err != nil {
		return 0, err
	}
	if err := c.file(guestInit, 0o755, int64(len(s.init)), bytes.NewReader(s.init)); err != nil {
		return 0, err
	}
	if s.script != nil {
		if err := c.file(guestCommand, 0o755, int64(len(s.script)), bytes.NewReader(s.script)); err != nil {
			return 0, err
		}
	}
	// Programs that look users up (ps, id, Go's os/user) need these two; uid
	// 65534 is what a test uses for "not root".
	etc := map[string]string{
		"/etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"/etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for _, name := range []string{"/etc/passwd", "/etc/group"} {
		if err := c.file(name, 0o644, int64(len(etc[name])), strings.NewReader(etc[name])); err != nil {
			return 0, err
		}
	}
	if err := s.copyHost(c, s.busybox, guestBusybox, 0o755); err != nil {
		return 0, err
	}
	for _, f := range s.helpers {
		if err := s.copyHost(c, f.Host, f.Guest, f.Mode); err != nil {
			return 0, err
		}
	}
	for _, f := range s.files {
		if err := s.addFile(c, f); err != nil {
			return 0, err
		}
	}
	for _, t := range s.trees {
		if err := s.addTree(c, t); err != nil {
			return 0, err
		}
	}
	if err := c.close(); err != nil {
		return 0, err
	}
	return c.n, nil
}

func (s initramfs) addFile(c *cpioWriter, f File) error {
	if !path.IsAbs(f.Guest) || path.Clean(f.Guest) != f.Guest || f.Guest == "/" {
		return fmt.Errorf("initramfs: guest path %q must be absolute and clean", f.Guest)
	}
	if reserved(f.Guest) {
		return fmt.Errorf("initramfs: %s is reserved by the qemu package", f.Guest)
	}
	if f.Host == "" {
		mode := cmp.Or(f.Mode, 0o644)
		return c.file(f.Guest, mode, int64(len(f.Data)), bytes.NewReader(f.Data))
	}
	return s.copyHost(c, f.Host, f.Guest, f.Mode)
}

// addTree copies a host directory tree. Symlinks are copied as links (a
// fixture tree of /proc has plenty), not followed.
func (s initramfs) addTree(c *cpioWriter, t Tree) error {
	if !path.IsAbs(t.Guest) || path.Clean(t.Guest) != t.Guest {
		return fmt.Errorf("initramfs: guest path %q must be absolute and clean", t.Guest)
	}
	return filepath.WalkDir(t.Host, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		rel, err := filepath.Rel(t.Host, p)
		if err != nil {
			return err
		}
		guest := path.Join(t.Guest, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return c.dir(guest, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
			return c.symlink(guest, target)
		case d.Type().IsRegular():
			return s.addFile(c, File{Host: p, Guest: guest})
		}
		return nil // sockets, fifos, devices: not test data
	})
}

// copyHost copies one host file; perm 0 keeps the host file's mode.
func (s initramfs) copyHost(c *cpioWriter, host, guest string, perm fs.FileMode) error {
	fh, err := os.Open(host)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("initramfs: %s is not a regular file", host)
	}
	if err := checkExecutable(fh, host, s.machine, s.goarch); err != nil {
		return err
	}
	perm = cmp.Or(perm, st.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
	return c.file(guest, perm, st.Size(), fh)
}

// checkExecutable refuses dynamically linked executables and ELF files of
// another architecture than the guest's: the guest has no libc or loader,
// and the kernel's "No such file or directory" for a missing loader, or
// "Exec format error" for an amd64 binary in an arm64 guest, is a puzzling
// failure to meet halfway through a test run.
func checkExecutable(fh *os.File, host string, machine elf.Machine, goarch string) error {
	ef, err := elf.NewFile(fh)
	if err != nil {
		return nil // not ELF: data, a script
	}
	if machine != elf.EM_NONE && ef.Machine != machine {
		return fmt.Errorf("initramfs: %s is built for %s, the guest is %s (build it with GOARCH=%s)", host, ef.Machine, machine, goarch)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("initramfs: %s is dynamically linked; the guest has no libc (build Go programs with CGO_ENABLED=0)", host)
		}
	}
	return nil
}
