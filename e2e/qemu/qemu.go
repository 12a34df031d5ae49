package qemu

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config describes one guest run.
type Config struct {
	// Kernel to boot. The zero value means DefaultKernel: Debian's 6.1
	// kernel from e2e/scripts/qemu-kernel.sh, installed on first use.
	Kernel Kernel

	// Files are copied into the initramfs, e.g. static binaries and a test
	// binary. Executables must be statically linked.
	Files []File
	// Trees are host directories copied recursively into the guest:
	// directories, regular files and symlinks (other kinds are skipped).
	Trees []Tree

	// Command is the argv run as the test, e.g. {"/bin/probe", "-v"}. It is
	// looked up in PATH (/bin:/sbin:/usr/bin:/usr/sbin; busybox provides the
	// usual tools). Exactly one of Command and Script is set.
	Command []string
	// Script is a busybox sh script run as the test instead of Command.
	Script string
	// Env holds extra KEY=VALUE pairs for the command. It otherwise gets only
	// PATH, HOME=/root, USER=root and TMPDIR=/tmp.
	Env []string
	// Dir is the command's working directory in the guest; default "/".
	Dir string
	// Hostname of the guest; default "qemu-guest".
	Hostname string

	// CPUs is the guest's number of vCPUs; default 1. qemu's TCG runs
	// each vCPU on a host thread of its own.
	CPUs int
	// MemoryMiB is the guest's RAM; default 512. The initramfs lives in it,
	// unpacked, so large test binaries need more.
	MemoryMiB int

	// Timeout bounds the guest's run from qemu's start, boot and command:
	// qemu is killed when it expires (or when ctx ends). What comes before
	// (installing the default kernel, building the exit helper, writing the
	// initramfs) is bounded by ctx alone: a cold build is work of unknown
	// length, and the guest's clock must not race it. Default 5 minutes.
	Timeout time.Duration
	// CommandTimeout bounds the command inside the guest. When it expires
	// the guest kills the command and reports Result.TimedOut, with its
	// console intact. Default: three quarters of Timeout, leaving the rest
	// for booting under software emulation.
	CommandTimeout time.Duration
}

// Result is what a guest run produced.
type Result struct {
	// Console is the guest's whole serial console: kernel messages, /init's
	// marker lines and the command's output, without CRs and terminal
	// escape sequences.
	Console string
	// Output is the part of Console the command printed (stdout and stderr
	// interleaved, plus any kernel message logged meanwhile).
	Output string
	// KernelRelease is the guest's `uname -r`, e.g. "6.1.0-57-amd64".
	KernelRelease string
	// ExitStatus is the command's status as the guest shell reports it:
	// 0-255, 128+N when killed by signal N, 124 when CommandTimeout expired.
	ExitStatus int
	// TimedOut reports that CommandTimeout expired and the guest killed the
	// command.
	TimedOut bool

	// InitramfsBuild is the time taken to write the initramfs, and
	// InitramfsBytes its size.
	InitramfsBuild time.Duration
	InitramfsBytes int64
	// Boot is the time from starting qemu until the guest's /init was ready
	// to run the command; Elapsed until qemu exited.
	Boot, Elapsed time.Duration
	// QEMULog is what qemu itself wrote on stderr.
	QEMULog string
}

// Defaults for Config.
const (
	defaultMemoryMiB = 512
	defaultTimeout   = 5 * time.Minute
	defaultHostname  = "qemu-guest"
	// waitDelay bounds how long Run waits for qemu's output pipes after
	// qemu has exited or been killed.
	waitDelay = 5 * time.Second
	// consoleTail is how many console lines an error message quotes.
	consoleTail = 40
)

// Run boots the kernel with an initramfs holding cfg.Files, runs the
// command and returns its exit status and the console.
//
// A command that fails is not an error: check Result.ExitStatus. Run returns
// an error when the guest produced no status: qemu could not start, the
// kernel panicked, /init's set-up failed, or Timeout or ctx expired (qemu is
// then killed). The Result is filled as far as the run got, so the caller
// can print its Console. Timeout starts with qemu; ctx bounds the set-up
// before it too.
//
// Run starts one qemu with one vCPU and waits for it; no process outlives
// the call.
func Run(ctx context.Context, cfg Config) (Result, error) {
	var res Result
	if (len(cfg.Command) == 0) == (cfg.Script == "") {
		return res, errors.New("qemu: set exactly one of Config.Command and Config.Script")
	}
	cfg.MemoryMiB = cmp.Or(cfg.MemoryMiB, defaultMemoryMiB)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.CommandTimeout = cmp.Or(cfg.CommandTimeout, cfg.Timeout*3/4)
	cfg.Hostname = cmp.Or(cfg.Hostname, defaultHostname)
	cfg.Dir = cmp.Or(cfg.Dir, "/")
	cfg.CPUs = cmp.Or(cfg.CPUs, 1)
	if cfg.Kernel == (Kernel{}) {
		k, err := DefaultKernel(ctx)
		if err != nil {
			return res, err
		}
		cfg.Kernel = k
	}
	if err := cfg.Kernel.check(); err != nil {
		return res, err
	}
	a := archs[cfg.Kernel.Arch]

	tmp, err := os.MkdirTemp("", "qemu-guest-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	helpers, err := buildExitHelper(ctx, cfg.Kernel.Arch, a, tmp)
	if err != nil {
		return res, err
	}
	initrd := filepath.Join(tmp, "initramfs.cpio")
	res.InitramfsBytes, err = buildInitramfs(cfg, a, helpers, initrd)
	if err != nil {
		return res, err
	}
	res.InitramfsBuild = time.Since(start)

	args := []string{
		// /dev/kvm exists on the build machines but a guest hangs with it:
		// software emulation only (and an arm64 guest needs it anyway).
		"-accel", tcgAccel(cfg.Kernel.Arch, cfg.CPUs),
		"-smp", strconv.Itoa(cfg.CPUs),
		"-m", strconv.Itoa(cfg.MemoryMiB),
		"-nodefaults", "-no-user-config",
		"-display", "none", "-monitor", "none",
		"-serial", "stdio",
		"-nic", "none",
		// A kernel panic (panic=-1) reboots, and -no-reboot turns that into
		// qemu exiting 0: "no status" rather than a guest looping forever.
		"-no-reboot",
	}
	args = append(args, a.qemuArgs...)
	kargs := append(append([]string{}, a.kernelArgs...), "panic=-1", "quiet")
	args = append(args,
		"-kernel", cfg.Kernel.Image,
		"-initrd", initrd,
		"-append", strings.Join(kargs, " "),
	)
	// The guest's clock starts here, with qemu (Config.Timeout).
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cfg.Kernel.QEMU, args...)
	con := &consoleWriter{}
	var qlog bytes.Buffer
	cmd.Stdin = nil // /dev/null: the serial console is output only
	cmd.Stdout = con
	cmd.Stderr = &qlog
	cmd.WaitDelay = waitDelay
	// Pdeathsig kills qemu if the test process dies without cancelling ctx
	// (e.g. go test's own -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}

	// Pdeathsig fires when the OS thread that started qemu exits, not the
	// process, and Go ends a thread whenever a goroutine exits while locked
	// to it: the pod simulation does exactly that after setns. Holding our
	// own thread locked while qemu runs keeps it out of such hands
	// (golang/go#27505).
	done := make(chan error, 1) // buffered: the goroutine never blocks on send
	con.start = time.Now()
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- cmd.Run()
	}()
	runErr := <-done
	res.Elapsed = time.Since(con.start)
	con.flush()
	res.Console = con.text()
	res.QEMULog = qlog.String()
	res.Boot = con.bootAt()
	return decode(ctx, cfg, res, cmd.ProcessState, runErr)
}

// tcgAccel is qemu's -accel for the guest. An amd64 guest with more than
// one vCPU gets them all on one host thread (thread=single): with a thread
// per vCPU (qemu's default) Debian's 7.2 kernel died at boot in 1 of 15
// tries here, of an int3 oops in code the kernel was patching (text_poke)
// while another vCPU ran it. arm64 guests keep a thread per vCPU: 0 of 15.
func tcgAccel(goarch string, cpus int) string {
	if goarch == "amd64" && cpus > 1 {
		return "tcg,thread=single"
	}
	return "tcg"
}

func buildInitramfs(cfg Config, a arch, helpers []File, name string) (int64, error) {
	argv := cfg.Command
	var script []byte
	if cfg.Script != "" {
		script = []byte(cfg.Script)
		argv = []string{"/bin/sh", guestCommand}
	}
	spec := initramfs{
		machine: a.machine,
		goarch:  cfg.Kernel.Arch,
		helpers: helpers,
		busybox: cfg.Kernel.Busybox,
		script:  script,
		files:   cfg.Files,
		trees:   cfg.Trees,
		init: initScript(initParams{
			exit:     a.exit,
			hostname: cfg.Hostname,
			argv:     argv,
			env:      cfg.Env,
			dir:      cfg.Dir,
			timeout:  cfg.CommandTimeout,
		}),
	}
	return spec.write(name)
}

// decode turns qemu's exit and the console's marker lines into a Result
// or an error.
func decode(ctx context.Context, cfg Config, res Result, ps *os.ProcessState, runErr error) (Result, error) {
	res.KernelRelease = lastAfter(res.Console, markRelease)
	start := strings.Index(res.Console, markStart+"\n")
	if start >= 0 {
		out := res.Console[start+len(markStart)+1:]
		if end := strings.Index(out, markEnd); end >= 0 {
			out = out[:end]
			// /init printed one newline of its own before the end marker.
			out = strings.TrimSuffix(out, "\n")
		}
		res.Output = out
	}
	fail := func(format string, args ...any) (Result, error) {
		msg := fmt.Sprintf(format, args...)
		if q := strings.TrimSpace(res.QEMULog); q != "" {
			msg += "\nqemu stderr: " + q
		}
		return res, fmt.Errorf("qemu: %s\nlast console lines:\n%s", msg, tail(res.Console, consoleTail))
	}

	if ctx.Err() != nil {
		return fail("guest killed after %s (%v)", res.Elapsed.Round(time.Millisecond), context.Cause(ctx))
	}
	if setup := lastAfter(res.Console, markSetupErr); setup != "" {
		return fail("guest /init set-up failed: %s", setup)
	}
	if ps == nil {
		return fail("cannot run %s: %v", cfg.Kernel.QEMU, runErr)
	}
	code := ps.ExitCode()
	switch {
	case code == 0:
		return fail("guest powered off without reporting a status (kernel panic, or /init died?)")
	case code < 0 || code&1 == 0 || code == 1:
		return fail("qemu failed (%v)", ps)
	}
	debug := code>>1 - 1 // see debugExitSaturated

	exit := lastAfter(res.Console, markExit)
	if exit == "" {
		if debug+1 == debugExitSaturated {
			return fail("guest status is 126 or more but its exit= line is missing")
		}
		res.ExitStatus = debug
		return res, nil
	}
	var status, timedOut int
	if _, err := fmt.Sscanf(exit, "%d timeout=%d", &status, &timedOut); err != nil {
		return fail("cannot parse %q: %v", markExit+exit, err)
	}
	if status != debug && !(debug+1 == debugExitSaturated && status >= debugExitSaturated-1) {
		return fail("guest status disagrees: console says %d, debug-exit says %d", status, debug)
	}
	res.ExitStatus = status
	res.TimedOut = timedOut == 1
	return res, nil
}

// lastAfter returns the rest of the last line that starts with prefix.
func lastAfter(console, prefix string) string {
	i := strings.LastIndex(console, prefix)
	if i < 0 || (i > 0 && console[i-1] != '\n') {
		return ""
	}
	rest := console[i+len(prefix):]
	if j := strings.IndexByte(rest, '\n'); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
