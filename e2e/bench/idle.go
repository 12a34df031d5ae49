package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
)

// idleAMD64 is the whole of the idle program, x86-64 machine code
// (assembled with GNU as, checked with objdump):
//
//	_start: mov (%rsp), %rbx    # argc
//	loop:   dec %rbx
//	        jz done             # argc-1 children forked
//	        mov $57, %eax       # fork
//	        syscall
//	        test %eax, %eax
//	        jz pause            # the child
//	        jns loop            # the parent; a failed fork falls through
//	        mov $1, %edi
//	        jmp exit
//	done:   xor %edi, %edi
//	exit:   mov $60, %eax       # exit
//	        syscall
//	pause:  mov $34, %eax       # pause, until killed
//	        syscall
//	        jmp pause
var idleAMD64 = []byte{
	0x48, 0x8b, 0x1c, 0x24,
	0x48, 0xff, 0xcb,
	0x74, 0x14,
	0xb8, 0x39, 0x00, 0x00, 0x00,
	0x0f, 0x05,
	0x85, 0xc0,
	0x74, 0x12,
	0x79, 0xee,
	0xbf, 0x01, 0x00, 0x00, 0x00,
	0xeb, 0x02,
	0x31, 0xff,
	0xb8, 0x3c, 0x00, 0x00, 0x00,
	0x0f, 0x05,
	0xb8, 0x22, 0x00, 0x00, 0x00,
	0x0f, 0x05,
	0xeb, 0xf7,
}

// writeIdle writes the idle program to path: run with K arguments, it
// forks K children that sleep in pause(2) until killed, and exits 0 once
// they all exist (1 if a fork failed). Each child is about the smallest
// process Linux has: no libc, one page of code, a stack page, so its cost
// is mostly the kernel's (page tables, kernel stack, task structures):
// the memory benchmark's 100,000 processes fit in a few GiB, where
// sleep(1)'s or forks of sh would take 20 to 30 GiB. x86-64 only.
func writeIdle(path string) error {
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("the idle program is x86-64 machine code; this is %s", runtime.GOARCH)
	}
	const (
		base    = 0x400000
		ehsize  = 64 // sizeof(Elf64_Ehdr)
		phsize  = 56 // sizeof(Elf64_Phdr)
		codeOff = ehsize + phsize
	)
	size := uint64(codeOff + len(idleAMD64))
	h := elf.Header64{
		Ident:     [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:      uint16(elf.ET_EXEC),
		Machine:   uint16(elf.EM_X86_64),
		Version:   uint32(elf.EV_CURRENT),
		Entry:     base + codeOff,
		Phoff:     ehsize,
		Ehsize:    ehsize,
		Phentsize: phsize,
		Phnum:     1,
	}
	p := elf.Prog64{
		Type:   uint32(elf.PT_LOAD),
		Flags:  uint32(elf.PF_R | elf.PF_X),
		Vaddr:  base,
		Paddr:  base,
		Filesz: size,
		Memsz:  size,
		Align:  0x1000,
	}
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, h)
	binary.Write(&b, binary.LittleEndian, p)
	b.Write(idleAMD64)
	return os.WriteFile(path, b.Bytes(), 0o755)
}
