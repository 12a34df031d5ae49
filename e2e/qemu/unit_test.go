package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestInitramfsFormat writes an archive and unpacks it with busybox cpio,
// an independent reader of the format.
func TestInitramfsFormat(t *testing.T) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox not installed (e2e/scripts/qemu-kernel.sh installs busybox-static)")
	}
	dir := t.TempDir()
	host := filepath.Join(dir, "host-file")
	if err := os.WriteFile(host, []byte("from the host\n"), 0o751); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "a.cpio")
	spec := initramfs{
		busybox: bb,
		init:    []byte("#!/bin/sh\n"),
		files: []File{
			{Host: host, Guest: "/deep/er/file"},
			{Data: []byte("data"), Guest: "/etc/data"},
			{Data: []byte("x"), Guest: "/odd", Mode: 0o600},
		},
	}
	if _, err := spec.write(archive); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bb, "cpio", "-i", "-d", "-F", archive)
	cmd.Dir = out
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("busybox cpio -i: %v\n%s", err, b)
	}
	for _, c := range []struct {
		name, content string
		mode          os.FileMode
	}{
		{"deep/er/file", "from the host\n", 0o751},
		{"etc/data", "data", 0o644},
		{"odd", "x", 0o600},
		{"init", "#!/bin/sh\n", 0o755},
	} {
		p := filepath.Join(out, c.name)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != c.content {
			t.Errorf("%s: %q, %v; want %q", c.name, b, err, c.content)
			continue
		}
		if st, _ := os.Stat(p); st.Mode().Perm() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.name, st.Mode().Perm(), c.mode)
		}
	}

	// A second entry for one path is a caller's mistake, not "last wins".
	spec.files = append(spec.files, File{Data: []byte("y"), Guest: "/odd"})
	if _, err := spec.write(archive); err == nil || !strings.Contains(err.Error(), "added twice") {
		t.Errorf("duplicate path: %v, want an 'added twice' error", err)
	}
	// A dynamically linked program cannot run in the guest.
	if _, err := (initramfs{busybox: bb, files: []File{{Host: "/bin/ls", Guest: "/bin/ls"}}}).write(archive); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("dynamic /bin/ls: %v, want a 'dynamically linked' error", err)
	}
	// Nor can a program of another architecture (this machine's busybox in
	// an arm64 guest, when this machine is not arm64).
	if runtime.GOARCH != "arm64" {
		_, err := (initramfs{machine: archs["arm64"].machine, goarch: "arm64", busybox: bb}).write(archive)
		if err == nil || !strings.Contains(err.Error(), "build it with GOARCH=arm64") {
			t.Errorf("%s busybox in an arm64 guest: %v, want an error naming GOARCH=arm64", runtime.GOARCH, err)
		}
	}
}

func TestCleanConsole(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain\r\n", "plain\n"},
		{"\x1b[2J\x1b[01;01Hboot\r\n", "boot\n"},
		{"\x1bc\x1b[?7lSeaBIOS\n", "SeaBIOS\n"},
		{"tab\there\x00\x07\n", "tab\there\n"},
		{"broken \x1b[12\n", "broken \n"},
	} {
		if got := string(cleanConsole([]byte(c.in))); got != c.want {
			t.Errorf("cleanConsole(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestShellQuote(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	for _, s := range []string{"plain", "", "with space", "it's", `"$HOME" $(id) \n *`, "a\nb"} {
		out, err := exec.Command(sh, "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("shellQuote(%q) = %s: sh printed %q, %v", s, shellQuote(s), out, err)
		}
	}
}

func TestParseKernel(t *testing.T) {
	k, err := parseKernel([]byte("NAME=n\nARCH=amd64\nKERNEL=/k\nRELEASE=6.1.0-1-amd64\nQEMU=/q\nBUSYBOX=/b\n"))
	want := Kernel{Name: "n", Arch: "amd64", Image: "/k", Release: "6.1.0-1-amd64", QEMU: "/q", Busybox: "/b"}
	if err != nil || k != want {
		t.Errorf("parseKernel = %+v, %v; want %+v", k, err, want)
	}
	for _, bad := range []string{"KERNEL=/k\n", "NAME=n\nARCH=riscv64\nKERNEL=/k\nRELEASE=r\nQEMU=/q\nBUSYBOX=/b\n"} {
		if _, err := parseKernel([]byte(bad)); err == nil {
			t.Errorf("parseKernel(%q): no error", bad)
		}
	}
}

func TestDecodeNoStatus(t *testing.T) {
	// qemu exited 0: the guest powered off or panicked without a report.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no true(1)")
	}
	_, err := decode(t.Context(), Config{}, Result{Console: "Kernel panic - not syncing\n"}, cmd.ProcessState, nil)
	if err == nil || !strings.Contains(err.Error(), "without reporting") || !strings.Contains(err.Error(), "Kernel panic") {
		t.Errorf("decode: %v, want 'without reporting' with the console tail", err)
	}
}
