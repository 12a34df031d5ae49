// Package qemu runs static Linux programs and Go test binaries inside other
// real kernels booted under qemu, and reports their console output and exit
// status.
//
// The supervisor reads an app's exit status with pidfd + PIDFD_INFO_EXIT on
// Linux 6.15 and later and falls back to ptrace before that, on amd64 and
// arm64 nodes. The build machines run one kernel on amd64, so the other
// paths are exercised for real by booting Debian's kernels, named in
// e2e/versions.env and prepared by e2e/scripts/qemu-kernel.sh (KernelNamed:
// bookworm's 6.1 and sid's 7.2 for amd64 and arm64, trixie's 6.12 for
// amd64), with a generated initramfs: busybox, the caller's files, and an
// /init that sets up what a pod simulation needs (proc, sysfs, devtmpfs,
// tmpfs on /tmp and /run, cgroup2 on /sys/fs/cgroup, lo, a hostname), runs
// one command with a time bound and hands its exit status back to the host.
//
// The status goes back through a device of qemu's that makes qemu itself
// exit with it: on amd64 the isa-debug-exit port; on arm64, which has none,
// a semihosting SYS_EXIT made from user space by a small static helper
// (internal/guestexit). Both make qemu exit with (status+1)<<1|1, and /init
// prints the status on the console as well: the host requires the two to
// agree, and a guest that ends any other way (a kernel panic, a poweroff,
// a hang) is an error, never a status.
//
// The guest has no disk, network or libc: everything it runs must be in the
// initramfs, statically linked and built for the kernel's architecture
// (Kernel.Arch; [BuildStatic] and [BuildTest] do that with CGO_ENABLED=0
// and GOARCH). qemu runs with software emulation (TCG), one vCPU unless
// Config.CPUs says more: the guest is several times slower than the host,
// an arm64 guest more so; budget timeouts for it.
//
// Run needs qemu and the kernel; when Config.Kernel is empty it runs the
// script for the default kernel (bookworm-amd64), which installs and
// downloads what it needs on a cold machine (as root, with access to
// Debian's archive).
//
// The package's own tests boot guests several times (a few seconds each):
//
//	cd e2e && go test -v ./qemu/
//
// They need root and skip otherwise. testdata/kernelprobe is the probe they
// run in the guest; testdata/guesttest is a test package compiled with
// RunGoTest. Both sit under testdata so that `go test ./...` leaves them out.
package qemu
