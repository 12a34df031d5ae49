package main

import (
	"debug/elf"
	"fmt"
	"os"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
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

// readImage reads the OCI archive of one image (scenarios.ReadImage).
func readImage(path string) (imageInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return imageInfo{}, err
	}
	im, err := scenarios.ReadImage("", path)
	if err != nil {
		return imageInfo{}, err
	}
	info := imageInfo{archive: fi.Size()}
	info.layers, info.compressed, info.unpacked, err = im.Sizes()
	return info, err
}
