package scenarios

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestUnpackWhiteouts: later layers delete with ".wh.NAME" and empty a
// directory with ".wh..wh..opq"; modes and owners come from the tar.
func TestUnpackWhiteouts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: unpacking sets file owners")
	}
	layerTar := func(entries ...tar.Header) layer {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range entries {
			body := ""
			if h.Typeflag == tar.TypeReg {
				body = h.Name
				h.Size = int64(len(body))
			}
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			tw.Write([]byte(body))
		}
		tw.Close()
		return layer{mediaType: "application/vnd.oci.image.layer.v1.tar", blob: b.Bytes()}
	}
	dir := func(n string) tar.Header { return tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: 0o755} }
	file := func(n string, mode int64, uid int) tar.Header {
		return tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: mode, Uid: uid, Gid: uid}
	}
	im := &Image{layers: []layer{
		layerTar(dir("a/"), file("a/x", 0o644, 0), file("b", 0o600, 1337), dir("c/"), file("c/z", 0o644, 0),
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "b"}),
		layerTar(file("a/.wh..wh..opq", 0o644, 0), file("a/y", 0o755, 0), file(".wh.b", 0o644, 0), file("../escape", 0o644, 0)),
	}}
	root := t.TempDir()
	if err := im.Unpack(root); err != nil {
		t.Fatal(err)
	}
	var got []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		got = append(got, fmt.Sprintf("%s %v", rel, fi.Mode()))
		return nil
	})
	want := []string{"a drwxr-xr-x", "a/y -rwxr-xr-x", "c drwxr-xr-x", "c/z -rw-r--r--", "escape -rw-r--r--", "l Lrwxrwxrwx"}
	if !slices.Equal(got, want) {
		t.Errorf("unpacked %q, want %q", got, want)
	}
}

// TestSupervisorImage: on the runc backend the supervisor is the image the
// Dockerfile describes, run as the image says: its binary (the version
// stamped by the build), its USER, read-only, without capabilities.
func TestSupervisorImage(t *testing.T) {
	i := slices.IndexFunc(Builders(t), func(b Builder) bool { return b.Name == "runc" })
	if i < 0 {
		t.Fatal("no runc builder")
	}
	b := Builders(t)[i]
	im, err := supervisorImage()
	if err != nil {
		t.Fatal(err)
	}
	p, built := run(t, b, Desc{Name: "image", Apps: []App{{Name: "app", Args: []string{"--sleep", "1h"}}}})
	waitLog(t, p, "app found")
	sup := p.Status().Container("supervisor")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sup.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Uid:\t1337\t1337\t1337\t1337", "Gid:\t1337\t1337\t1337\t1337",
		"CapBnd:\t0000000000000000", "CapEff:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want+"\n") {
			t.Errorf("supervisor's /proc/PID/status lacks %q:\n%s", want, status)
		}
	}
	tag := im.Ref[strings.LastIndex(im.Ref, ":")+1:]
	var starting LogLine
	for _, l := range ParseLog(p.Logs("supervisor")) {
		if l.Msg() == "starting" {
			starting = l
		}
	}
	if v := starting.Str("version"); v != tag {
		t.Errorf("supervisor version %q, want the image's %q (from %s)", v, tag, im.Archive)
	}
	// The running binary is the file unpacked from the image's layer.
	exe, err1 := os.Stat(fmt.Sprintf("/proc/%d/exe", sup.PID))
	unpacked, err2 := os.Stat(filepath.Join(built.Dir, "rootfs", "supervisor", "sidecar-supervisor"))
	if err1 != nil || err2 != nil || !os.SameFile(exe, unpacked) {
		t.Errorf("the supervisor does not run the binary unpacked from the image (%v, %v)", err1, err2)
	}
	if !slices.Equal(im.Argv(), []string{"/sidecar-supervisor"}) {
		t.Errorf("image ENTRYPOINT+CMD %q, want [/sidecar-supervisor] as the Dockerfile says", im.Argv())
	}
}
