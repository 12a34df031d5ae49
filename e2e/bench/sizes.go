package main

import (
	"archive/tar"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// binaryInfo is a binary's size and how it is linked.
type binaryInfo struct {
	size     int64
	static   bool // no program interpreter, no shared libraries
	stripped bool // no symbol table
}

func readBinary(path string) (binaryInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return binaryInfo{}, err
	}
	f, err := elf.Open(path)
	if err != nil {
		return binaryInfo{}, err
	}
	defer f.Close()
	info := binaryInfo{size: fi.Size(), static: true, stripped: f.Section(".symtab") == nil}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			info.static = false
		}
	}
	return info, nil
}

func (b binaryInfo) String() string {
	link := "static"
	if !b.static {
		link = "DYNAMIC"
	}
	strip := "stripped"
	if !b.stripped {
		strip = "NOT stripped"
	}
	return fmt.Sprintf("%s, %s, %s", bytesMB(b.size), link, strip)
}

// imageInfo is an OCI archive's size and its layers'.
type imageInfo struct {
	archive    int64 // the tar file
	compressed int64 // the layers as stored (gzip)
	unpacked   int64 // the bytes of the files in the layers
	layers     int
}

// readImage reads an OCI image archive (oci-archive: a tar of an OCI
// layout): index.json, its first manifest, that manifest's layers.
func readImage(path string) (imageInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return imageInfo{}, err
	}
	blobs := map[string][]byte{}
	f, err := os.Open(path)
	if err != nil {
		return imageInfo{}, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return imageInfo{}, fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return imageInfo{}, err
		}
		blobs[strings.TrimPrefix(h.Name, "./")] = b
	}
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) == 0 {
		return imageInfo{}, fmt.Errorf("%s: no manifest in index.json (%v)", path, err)
	}
	blob := func(d descriptor) ([]byte, error) {
		b, ok := blobs["blobs/"+strings.Replace(d.Digest, ":", "/", 1)]
		if !ok {
			return nil, fmt.Errorf("%s: blob %s missing", path, d.Digest)
		}
		return b, nil
	}
	mb, err := blob(index.Manifests[0])
	if err != nil {
		return imageInfo{}, err
	}
	var manifest struct{ Layers []descriptor }
	if err := json.Unmarshal(mb, &manifest); err != nil {
		return imageInfo{}, fmt.Errorf("%s: manifest: %w", path, err)
	}
	info := imageInfo{archive: fi.Size(), layers: len(manifest.Layers)}
	for _, l := range manifest.Layers {
		b, err := blob(l)
		if err != nil {
			return imageInfo{}, err
		}
		info.compressed += int64(len(b))
		var r io.Reader = strings.NewReader(string(b))
		if strings.HasSuffix(l.MediaType, "+gzip") {
			zr, err := gzip.NewReader(r)
			if err != nil {
				return imageInfo{}, err
			}
			r = zr
		}
		lt := tar.NewReader(r)
		for {
			h, err := lt.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return imageInfo{}, fmt.Errorf("layer %s: %w", l.Digest, err)
			}
			info.unpacked += h.Size
		}
	}
	return info, nil
}
