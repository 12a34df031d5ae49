// Package qemu runs static Linux programs and Go test binaries inside a real,
// older kernel booted under qemu, and reports their console output and exit
// status.
//
// The supervisor reads an app's exit status with pidfd + PIDFD_INFO_EXIT on
// Linux 6.15 and later and falls back to ptrace before that. The build
// machines run a newer kernel, so the fallback is only exercised for real by
// booting Debian's 6.1 kernel (prepared by e2e/scripts/qemu-kernel.sh) with a
// generated initramfs: busybox, the caller's files, and an /init that sets up
// what a pod simulation needs (proc, sysfs, devtmpfs, tmpfs on /tmp and /run,
// cgroup2 on /sys/fs/cgroup, lo, a hostname), runs one command with a time
// bound and hands its exit status back through qemu's isa-debug-exit device.
//
// The guest has no disk, network or libc: everything it runs must be in the
// initramfs and statically linked (CGO_ENABLED=0; [BuildStatic] and
// [BuildTest] do that). qemu runs with software emulation (TCG) and one vCPU,
// so the guest is several times slower than the host; budget timeouts for it.
//
// Run needs qemu and the kernel; when Config.Kernel is empty it runs the
// script, which installs and downloads them on a cold machine (as root, with
// access to Debian's archive).
//
// The package's own tests boot the guest several times (a few seconds each):
//
//	cd e2e && go test -v ./qemu/
//
// They need root and skip otherwise. testdata/kernelprobe is the probe they
// run in the guest; testdata/guesttest is a test package compiled with
// RunGoTest. Both sit under testdata so that `go test ./...` leaves them out.
package qemu
