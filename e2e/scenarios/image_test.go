package scenarios

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
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
	bs := Builders(t)
	i := slices.IndexFunc(bs, func(b Builder) bool { return b.Name == "runc" })
	if i < 0 {
		t.Fatal("no runc builder")
	}
	b := bs[i]
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
	if l := LogWhere(p, Is("starting")); len(l) == 0 || l[len(l)-1].Str("version") != tag {
		t.Errorf("supervisor starting %v, want version %q, the image's (from %s)", l, tag, im.Archive)
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

// TestImageIndex: build-image.sh's image index, what `docker buildx build
// --platform linux/amd64,linux/arm64` makes of the Dockerfile, lists both
// platforms; each platform's /sidecar-supervisor is a static executable of
// that architecture; and the image the tests on this machine run is the
// index's own manifest for this platform, digest for digest (so is the
// single-platform archive the cluster tests import).
func TestImageIndex(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: buildah builds the image (e2e/scripts/build-image.sh), and unpacking sets file owners")
	}
	images, err := BuildImageIndex(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	machines := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	if got := slices.Sorted(maps.Keys(images)); !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("index platforms %q, want linux/amd64 and linux/arm64", got)
	}
	for _, platform := range []string{"linux/amd64", "linux/arm64"} {
		im := images[platform]
		dir := t.TempDir()
		if err := im.Unpack(dir); err != nil {
			t.Fatalf("%s: %v", platform, err)
		}
		ef, err := elf.Open(filepath.Join(dir, "sidecar-supervisor"))
		if err != nil {
			t.Fatalf("%s: /sidecar-supervisor: %v", platform, err)
		}
		static := !slices.ContainsFunc(ef.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		ef.Close()
		t.Logf("%s: manifest %s, /sidecar-supervisor ELF %s, static %v, entrypoint %q, user %s",
			platform, im.Digest, ef.Machine, static, im.Argv(), im.Config.User)
		if ef.Machine != machines[platform] {
			t.Errorf("%s: /sidecar-supervisor is for %s, want %s", platform, ef.Machine, machines[platform])
		}
		if !static {
			t.Errorf("%s: /sidecar-supervisor is dynamically linked", platform)
		}
		if !slices.Equal(im.Argv(), []string{"/sidecar-supervisor"}) || im.Config.User != "1337:1337" {
			t.Errorf("%s: entrypoint %q user %q, want [/sidecar-supervisor] and 1337:1337 as the Dockerfile says", platform, im.Argv(), im.Config.User)
		}
	}
	host := "linux/" + runtime.GOARCH
	run, err := supervisorImage()
	if err != nil {
		t.Fatal(err)
	}
	if run.Digest != images[host].Digest {
		t.Errorf("the tests run manifest %s, the index's %s image is %s", run.Digest, host, images[host].Digest)
	}
	single, err := hostArchive(t)
	if err != nil {
		t.Fatal(err)
	}
	if single.Digest != images[host].Digest || single.Platform != host {
		t.Errorf("SUPERVISOR_IMAGE_ARCHIVE holds %s manifest %s, the index's %s image is %s", single.Platform, single.Digest, host, images[host].Digest)
	}
}

// hostArchive reads build-image.sh's single-platform archive.
func hostArchive(t *testing.T) (*Image, error) {
	var ref, archive string
	err := scripts.Run(t.Context(), filepath.Base(ImageScript), map[string]*string{"SUPERVISOR_IMAGE": &ref, "SUPERVISOR_IMAGE_ARCHIVE": &archive})
	if err != nil {
		return nil, err
	}
	return ReadImage(ref, archive)
}
