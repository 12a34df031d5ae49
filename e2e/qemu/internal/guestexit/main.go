//go:build arm64

// Command guestexit ends an arm64 qemu guest with an exit status for the
// host: `guestexit V` makes qemu-system-aarch64 exit with (V<<1)|1, as a
// write of V to x86's isa-debug-exit port does, so the host decodes both
// architectures alike.
//
// arm64 has no isa-debug-exit. A PSCI poweroff ends qemu with status 0,
// which cannot tell a test's verdict from a kernel panic (panic=-1 and
// -no-reboot end qemu the same way). qemu's semihosting can: with
// `-semihosting-config enable=on,target=native,userspace=on`, a HLT #0xF000
// executed at any exception level, user space included, is a call to the
// host, and SYS_EXIT with ADP_Stopped_ApplicationExit and a subcode makes
// qemu exit with that subcode. Without semihosting enabled the instruction
// traps like any undefined one and this program dies of SIGILL or SIGTRAP,
// so a guest cannot report a status by accident.
//
// The guest's /init runs it (e2e/qemu/guestinit.go); it is built for arm64
// only.
package main

import (
	"fmt"
	"os"
	"strconv"
)

// Semihosting call numbers and reasons (Arm's "Semihosting for AArch32 and
// AArch64", SYS_EXIT).
const (
	sysExit                   = 0x18
	adpStoppedApplicationExit = 0x20026
)

// semihost makes the semihosting call op with x1 = arg. Implemented in
// assembly: HLT #0xF000 has no Go spelling.
func semihost(op uint64, arg *[2]uint64) uint64

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: guestexit VALUE (0-127): qemu exits with (VALUE<<1)|1")
		os.Exit(2)
	}
	v, err := strconv.Atoi(os.Args[1])
	if err != nil || v < 0 || v > 127 {
		fmt.Fprintf(os.Stderr, "guestexit: %q is not a value from 0 to 127\n", os.Args[1])
		os.Exit(2)
	}
	// AArch64 SYS_EXIT takes a pointer to a two-word block: the reason
	// and, for ApplicationExit, the exit status.
	block := [2]uint64{adpStoppedApplicationExit, uint64(v<<1 | 1)}
	semihost(sysExit, &block)
	// Only reached if qemu ignored the call.
	fmt.Fprintln(os.Stderr, "guestexit: the semihosting exit returned: is qemu running with -semihosting-config enable=on,userspace=on?")
	os.Exit(1)
}
