// Package guesttest is a test package meant to run inside the qemu guest
// (e2e/qemu's TestRunGoTest compiles it with go test -c and runs it there).
// It lives under testdata so that `go test ./...` on the host skips it.
package guesttest

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGuestKernel checks that it runs on the kernel, with the environment
// and the extra binary, that the host asked for.
func TestGuestKernel(t *testing.T) {
	want := os.Getenv("GUESTTEST_RELEASE_PREFIX")
	if want == "" {
		t.Skip("GUESTTEST_RELEASE_PREFIX not set: not run by e2e/qemu")
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	if got := unix.ByteSliceToString(uts.Release[:]); !strings.HasPrefix(got, want) {
		t.Errorf("kernel release %q, want prefix %q", got, want)
	}
	if wd, _ := os.Getwd(); wd != "/gotest" {
		t.Errorf("working directory %q, want /gotest", wd)
	}

	t.Run("ExtraBinary", func(t *testing.T) {
		// The probe refuses to run without its guard variable: exit 2 and
		// a message prove that the extra file arrived and executes.
		out, err := exec.Command("/bin/kernelprobe").CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("/bin/kernelprobe: %v, want exit status 2; output:\n%s", err, out)
		}
		if !strings.Contains(string(out), "KERNELPROBE_IN_GUEST") {
			t.Errorf("/bin/kernelprobe said %q", out)
		}
	})
	t.Run("PidfdGetInfo", func(t *testing.T) {
		fd, err := unix.PidfdOpen(os.Getpid(), 0)
		if err != nil {
			t.Fatalf("pidfd_open(self): %v", err)
		}
		defer unix.Close(fd)
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
		if err := unix.IoctlPidfdInfo(fd, &info); !errors.Is(err, unix.ENOTTY) {
			t.Errorf("PIDFD_GET_INFO: %v, want ENOTTY before Linux 6.13", err)
		}
	})
}

// TestGuestFailsOnPurpose lets the host check that a failing test reads as
// a failure.
func TestGuestFailsOnPurpose(t *testing.T) {
	if os.Getenv("GUESTTEST_FAIL") != "1" {
		t.Skip("GUESTTEST_FAIL not set")
	}
	t.Error("failing on purpose (GUESTTEST_FAIL=1)")
}

// TestGuestTestdata reads the package's testdata, which RunGoTest copies
// into the guest when GoTest.Testdata is set (symlinks stay symlinks).
func TestGuestTestdata(t *testing.T) {
	b, err := os.ReadFile("testdata/hello.txt")
	if err != nil || string(b) != "hello from the host\n" {
		t.Errorf("testdata/hello.txt: %q, %v", b, err)
	}
	if target, err := os.Readlink("testdata/link"); err != nil || target != "hello.txt" {
		t.Errorf("testdata/link: %q, %v; want a symlink to hello.txt", target, err)
	}
}
