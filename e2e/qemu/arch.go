package qemu

import (
	"context"
	"debug/elf"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
)

// arch is what differs between guest architectures: the qemu machine, the
// console, and how /init hands the command's status back to the host.
type arch struct {
	machine elf.Machine
	// qemuArgs pick the machine and CPU and add the exit device.
	qemuArgs []string
	// kernelArgs go before Config.KernelArgs, the console first.
	kernelArgs []string
	// exit is the shell line in /init that ends the guest so that qemu
	// exits with ($v<<1)|1.
	exit string
	// exitHelper is a program /init needs for exit, built from this
	// package in the e2e module for the guest ("" for none).
	exitHelper string
}

// guestExit is where the exit helper sits in the guest.
const guestExit = "/.qemu/exit"

// ARM64CPU is the CPU qemu emulates for an arm64 guest: a Cortex-A57
// (ARMv8.0, like Graviton 1 and Ampere eMAG). Newer models (neoverse-n1,
// max) boot no differently but run slower under TCG: pointer
// authentication and the larger feature set cost emulation time, and the
// supervisor uses none of it.
const ARM64CPU = "cortex-a57"

var archs = map[string]arch{
	"amd64": {
		machine: elf.EM_X86_64,
		// qemu exits with (v<<1)|1 when the guest writes byte v to this
		// port.
		qemuArgs: []string{"-device", fmt.Sprintf("isa-debug-exit,iobase=%#x,iosize=0x04", debugExitPort)},
		// no_timer_check and clocksource=hpet: on a loaded host the
		// emulated CPU can be kept off it at boot. The kernel's check
		// that the timer interrupt fires then failed and panicked
		// ("IO-APIC + timer doesn't work!", in a .ci/run), and once the
		// guest's clock ran about nine times fast (its watchdog's `sleep
		// 900` ended some 100 s in), as a TSC calibrated against the
		// emulated PIT while starved would. The HPET counts qemu's own
		// clock: nothing to calibrate.
		kernelArgs: []string{"console=ttyS0", "no_timer_check", "clocksource=hpet"},
		// One byte to the isa-debug-exit port: a write to /dev/port at its
		// offset.
		exit: `printf "\\$(printf %o $v)" | dd of=/dev/port bs=1 seek=` + strconv.Itoa(debugExitPort) + ` count=1 2>/dev/null`,
	},
	"arm64": {
		machine: elf.EM_AARCH64,
		// virt is qemu's generic arm64 board (PL011 serial, PSCI, GICv2);
		// semihosting from user space is how guestexit reaches the host
		// (see internal/guestexit: arm64 has no isa-debug-exit).
		qemuArgs: []string{"-machine", "virt", "-cpu", ARM64CPU,
			"-semihosting-config", "enable=on,target=native,userspace=on"},
		// nokaslr: relocating the 48 MB kernel to a random address costs
		// about 3 s of every boot under TCG, and nothing tested depends
		// on the kernel's address.
		kernelArgs: []string{"console=ttyAMA0", "nokaslr"},
		exit:       guestExit + " $v",
		exitHelper: "./qemu/internal/guestexit",
	},
}

// buildExitHelper builds a's exit helper into dir for the guest, or returns
// nil when it needs none.
func buildExitHelper(ctx context.Context, goarch string, a arch, dir string) ([]File, error) {
	if a.exitHelper == "" {
		return nil, nil
	}
	scriptDir, err := scripts.Dir()
	if err != nil {
		return nil, err
	}
	e2e := filepath.Dir(scriptDir)
	out := filepath.Join(dir, "guestexit")
	if err := BuildStatic(ctx, goarch, e2e, a.exitHelper, out); err != nil {
		return nil, fmt.Errorf("build the guest's exit helper: %w", err)
	}
	return []File{{Host: out, Guest: guestExit, Mode: 0o755}}, nil
}
