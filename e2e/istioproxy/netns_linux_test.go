package istioproxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// netns is a fresh network namespace, held by one OS thread that a
// goroutine keeps locked for the namespace's lifetime. Work that must happen
// inside it (starting a process, opening a socket) is handed to that
// goroutine: a child forked from the thread inherits its namespace, and a
// socket belongs to the namespace of the thread that created it.
type netns struct {
	calls chan func()
}

func newNetns(t *testing.T) *netns {
	t.Helper()
	ns := &netns{calls: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		// Never unlocked on purpose: when this goroutine returns, the
		// runtime ends the thread instead of reusing it, so no other
		// goroutine ever runs inside the namespace by accident.
		runtime.LockOSThread()
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range ns.calls {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("new network namespace: %v", err)
	}
	t.Cleanup(func() { close(ns.calls) })
	return ns
}

// run calls f on the namespace's thread and waits for it.
func (ns *netns) run(f func()) {
	done := make(chan struct{})
	ns.calls <- func() { defer close(done); f() }
	<-done
}

// loopbackUp sets IFF_UP on "lo": a new network namespace starts with its
// loopback down, and 127.0.0.1 is unreachable until it is up.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer syscall.Close(fd)
	// struct ifreq: 16 bytes of name, then a union whose first member is short ifr_flags.
	var ifr [40]byte
	copy(ifr[:], "lo")
	*(*uint16)(unsafe.Pointer(&ifr[syscall.IFNAMSIZ])) = syscall.IFF_UP | syscall.IFF_RUNNING
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
		return fmt.Errorf("SIOCSIFFLAGS lo up: %w", errno)
	}
	return nil
}

// httpClient returns a client whose connections are opened inside the
// namespace. Dialing an IP literal happens in the calling goroutine (no
// happy-eyeballs race), so socket(2) runs on the namespace's thread.
func (ns *netns) httpClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
				ns.run(func() {
					var d net.Dialer
					c, err = d.DialContext(ctx, network, addr)
				})
				return c, err
			},
		},
	}
}
