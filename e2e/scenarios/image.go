package scenarios

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
)

// ImageScript builds the supervisor image from the Dockerfile, relative to
// the e2e module.
const ImageScript = "scripts/build-image.sh"

// Image is one platform's supervisor image as e2e/scripts/build-image.sh
// builds it: a manifest in an OCI archive (an OCI image layout in a tar file).
type Image struct {
	Ref     string
	Archive string
	// Platform is "os/architecture" from the index, or from the image
	// configuration for a single-image archive.
	Platform string
	// Digest is the image manifest's digest.
	Digest string
	// Config is the image's runtime configuration (USER, ENTRYPOINT, ...).
	Config ImageConfig

	layers []layer
}

// ImageConfig is the "config" object of an OCI image configuration.
type ImageConfig struct {
	User       string   `json:"User"`
	Env        []string `json:"Env"`
	Entrypoint []string `json:"Entrypoint"`
	Cmd        []string `json:"Cmd"`
	WorkingDir string   `json:"WorkingDir"`
}

type layer struct {
	mediaType string
	blob      []byte
}

// supervisorImage builds (or finds in the cache) the image once per process.
var supervisorImage = sync.OnceValues(func() (*Image, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	return BuildImage(ctx)
})

// BuildImage runs e2e/scripts/build-image.sh (cached, quick when nothing
// changed), reads the multi-platform index it prints and returns this
// machine's platform's image from it: the tests run exactly what the index
// would publish.
func BuildImage(ctx context.Context) (*Image, error) {
	images, err := BuildImageIndex(ctx)
	if err != nil {
		return nil, err
	}
	host := "linux/" + runtime.GOARCH
	im, ok := images[host]
	if !ok {
		return nil, fmt.Errorf("the image index has no %s image (it has %s)", host, strings.Join(slices.Sorted(maps.Keys(images)), ", "))
	}
	return im, nil
}

// BuildImageIndex runs e2e/scripts/build-image.sh and reads every platform's
// image of the index it prints (SUPERVISOR_IMAGE_INDEX), by "os/arch".
func BuildImageIndex(ctx context.Context) (map[string]*Image, error) {
	var ref, index string
	err := scripts.Run(ctx, filepath.Base(ImageScript), map[string]*string{
		"SUPERVISOR_IMAGE":       &ref,
		"SUPERVISOR_IMAGE_INDEX": &index,
	})
	if err != nil {
		return nil, err
	}
	return ReadImageIndex(ref, index)
}

// OCI media types this reader follows.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
)

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

// layout is an OCI archive's files, by path.
type layout struct {
	archive string
	files   map[string][]byte
}

func readLayout(archive string) (layout, error) {
	l := layout{archive: archive, files: map[string][]byte{}}
	f, err := os.Open(archive)
	if err != nil {
		return l, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return l, fmt.Errorf("read %s: %w", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return l, fmt.Errorf("read %s: %s: %w", archive, h.Name, err)
		}
		l.files[path.Clean(h.Name)] = b
	}
	return l, nil
}

func (l layout) blob(digest string) ([]byte, error) {
	algo, hex, ok := strings.Cut(digest, ":")
	if !ok {
		return nil, fmt.Errorf("bad digest %q", digest)
	}
	b, ok := l.files[path.Join("blobs", algo, hex)]
	if !ok {
		return nil, fmt.Errorf("%s: no blob %s", l.archive, digest)
	}
	return b, nil
}

// openLayout reads an OCI archive and the one descriptor of its
// index.json, which must be of media type want.
func openLayout(archive, want string) (layout, descriptor, error) {
	l, err := readLayout(archive)
	if err != nil {
		return l, descriptor{}, err
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(l.files["index.json"], &index); err != nil {
		return l, descriptor{}, fmt.Errorf("%s: index.json: %w", archive, err)
	}
	if len(index.Manifests) != 1 {
		return l, descriptor{}, fmt.Errorf("%s: %d entries in index.json, want 1", archive, len(index.Manifests))
	}
	d := index.Manifests[0]
	if d.MediaType != want {
		return l, descriptor{}, fmt.Errorf("%s: holds a %s, want a %s", archive, d.MediaType, want)
	}
	return l, d, nil
}

// ReadImage reads an OCI archive holding one image: its manifest, the image
// configuration and the layers.
func ReadImage(ref, archive string) (*Image, error) {
	l, d, err := openLayout(archive, mediaTypeManifest)
	if err != nil {
		return nil, err
	}
	return l.image(ref, d)
}

// ReadImageIndex reads an OCI archive holding an image index (a
// multi-platform image) and returns its images by "os/arch".
func ReadImageIndex(ref, archive string) (map[string]*Image, error) {
	l, d, err := openLayout(archive, mediaTypeIndex)
	if err != nil {
		return nil, err
	}
	ib, err := l.blob(d.Digest)
	if err != nil {
		return nil, err
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(ib, &index); err != nil {
		return nil, fmt.Errorf("%s: image index: %w", archive, err)
	}
	images := map[string]*Image{}
	for _, m := range index.Manifests {
		if m.Platform == nil {
			return nil, fmt.Errorf("%s: index entry %s names no platform", archive, m.Digest)
		}
		platform := m.Platform.OS + "/" + m.Platform.Architecture
		if images[platform] != nil {
			return nil, fmt.Errorf("%s: two images for %s", archive, platform)
		}
		im, err := l.image(ref, m)
		if err != nil {
			return nil, err
		}
		if im.Platform != platform {
			return nil, fmt.Errorf("%s: the index lists %s as %s, its configuration says %s", archive, m.Digest, platform, im.Platform)
		}
		images[platform] = im
	}
	return images, nil
}

// image reads the image manifest d points at.
func (l layout) image(ref string, d descriptor) (*Image, error) {
	mb, err := l.blob(d.Digest)
	if err != nil {
		return nil, err
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(mb, &manifest); err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", l.archive, err)
	}
	cb, err := l.blob(manifest.Config.Digest)
	if err != nil {
		return nil, err
	}
	var config struct {
		OS           string      `json:"os"`
		Architecture string      `json:"architecture"`
		Config       ImageConfig `json:"config"`
	}
	if err := json.Unmarshal(cb, &config); err != nil {
		return nil, fmt.Errorf("%s: image config: %w", l.archive, err)
	}
	im := &Image{Ref: ref, Archive: l.archive, Platform: config.OS + "/" + config.Architecture, Digest: d.Digest, Config: config.Config}
	for _, ld := range manifest.Layers {
		b, err := l.blob(ld.Digest)
		if err != nil {
			return nil, err
		}
		im.layers = append(im.layers, layer{mediaType: ld.MediaType, blob: b})
	}
	return im, nil
}

// Argv is the command the image runs: ENTRYPOINT then CMD.
func (im *Image) Argv() []string {
	return append(append([]string{}, im.Config.Entrypoint...), im.Config.Cmd...)
}

// User is USER as numbers ("1337:1337", "1337"); names would need the
// image's /etc/passwd, which a scratch image lacks.
func (im *Image) User() (uid, gid int, err error) {
	if im.Config.User == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(im.Config.User, ":")
	if uid, err = strconv.Atoi(u); err != nil {
		return 0, 0, fmt.Errorf("image USER %q is not numeric", im.Config.User)
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil {
			return 0, 0, fmt.Errorf("image USER %q is not numeric", im.Config.User)
		}
	}
	return uid, gid, nil
}

// Unpack lays the image's layers out under dir, in order, as a container
// runtime's snapshotter would: files with their modes and owners, and the
// whiteouts of later layers applied.
func (im *Image) Unpack(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, l := range im.layers {
		tr, err := l.tar()
		if err == nil {
			err = applyLayer(dir, tr)
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

// Sizes are the layers' bytes as stored (compressed) and those of the
// files in them (unpacked).
func (im *Image) Sizes() (layers int, compressed, unpacked int64, err error) {
	for i, l := range im.layers {
		compressed += int64(len(l.blob))
		tr, err := l.tar()
		for err == nil {
			var h *tar.Header
			if h, err = tr.Next(); err == nil {
				unpacked += h.Size
			}
		}
		if err != io.EOF {
			return 0, 0, 0, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return len(im.layers), compressed, unpacked, nil
}

func (l layer) tar() (*tar.Reader, error) {
	var r io.Reader = bytes.NewReader(l.blob)
	switch {
	case strings.HasSuffix(l.mediaType, "+gzip"):
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		r = zr
	case strings.HasSuffix(l.mediaType, ".tar"):
	default:
		return nil, fmt.Errorf("media type %s not supported", l.mediaType)
	}
	return tar.NewReader(r), nil
}

func applyLayer(dir string, tr *tar.Reader) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name) // no way out of dir
		if name == "/" {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		base := path.Base(name)
		// Whiteouts: ".wh..wh..opq" empties its directory, ".wh.NAME" deletes NAME.
		if base == ".wh..wh..opq" {
			ents, _ := os.ReadDir(filepath.Dir(target))
			for _, e := range ents {
				os.RemoveAll(filepath.Join(filepath.Dir(target), e.Name()))
			}
			continue
		}
		if rest, ok := strings.CutPrefix(base, ".wh."); ok {
			os.RemoveAll(filepath.Join(filepath.Dir(target), rest))
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode).Perm() | os.FileMode(h.Mode)&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				os.RemoveAll(target)
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			os.RemoveAll(target)
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			os.RemoveAll(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			os.RemoveAll(target)
			src := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Linkname)))
			if err := os.Link(src, target); err != nil {
				return err
			}
			continue
		default:
			return fmt.Errorf("%s: tar entry type %q not supported", h.Name, h.Typeflag)
		}
		if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeSymlink {
			// After chown, which clears the set-id bits.
			if err := os.Chmod(target, mode); err != nil {
				return err
			}
		}
	}
}
