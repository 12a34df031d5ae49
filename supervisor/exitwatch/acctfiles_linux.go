//go:build linux

package exitwatch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The accounting files, in the state directory: pacct.<gen>, the kernel
// pointed at a new one (point) every acctRotateEvery past acctRotateSize
// (rotate), all but the last two removed (see acct_linux.go).

// point makes the kernel write to pacct.<gen>, created if need be:
// through the anchor's mount while it runs, else through our own.
func (a *acctLog) point(gen int) error {
	path := a.path(gen)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create the accounting file: %w", err)
	}
	f.Close()
	if a.host.PID != 0 {
		if a.pointThrough(a.host, gen) == nil {
			a.gen = gen
			return nil
		}
		a.host = Process{} // gone: back to our own mount
	}
	if err := acctOn(path); err != nil {
		return err
	}
	a.gen = gen
	return nil
}

// acctOn points the kernel's accounting at path.
func acctOn(path string) error {
	switch err := unix.Acct(path); {
	case errors.Is(err, unix.ENOSYS):
		return errors.New("the kernel has no process accounting (CONFIG_BSD_PROCESS_ACCT), or seccomp denies acct(2)")
	case errors.Is(err, unix.EPERM):
		return errors.New("acct(2) refused: seccomp allows it only with CAP_SYS_PACCT in the container's capabilities (RuntimeDefault does then)")
	case err != nil:
		return fmt.Errorf("acct(2) on %s: %w (the state directory must be a writable local filesystem, such as an emptyDir)", path, err)
	}
	return nil
}

func (a *acctLog) path(gen int) string {
	return filepath.Join(a.dir, acctPrefix+strconv.Itoa(gen))
}

// gens lists the accounting files in dir, oldest first.
func (a *acctLog) gens() ([]int, error) {
	ents, err := os.ReadDir(a.dir)
	if err != nil {
		return nil, fmt.Errorf("read the state directory: %w (it must be the supervisor's to read and write, as an emptyDir is)", err)
	}
	var gens []int
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), acctPrefix); ok {
			if g, err := strconv.Atoi(n); err == nil && g >= 0 && e.Type().IsRegular() {
				gens = append(gens, g)
			}
		}
	}
	slices.Sort(gens)
	return gens, nil
}

// rotate keeps the files small until close, and accounting on should the
// anchor go.
func (a *acctLog) rotate() {
	defer close(a.done)
	t := time.NewTicker(acctRotateEvery)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			a.rotateOnce(acctRotateSize)
		}
	}
}

// rotateOnce moves the kernel to a new file once the current one has
// grown past size, and removes all but the last two.
func (a *acctLog) rotateOnce(size int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.host.PID != 0 && !a.runs(a.host) {
		// The anchor's container is ending: our own mount, at once.
		a.host = Process{}
		if err := a.point(a.gen); err != nil {
			return err
		}
	}
	fi, err := os.Stat(a.path(a.gen))
	if err != nil || fi.Size() < size {
		return err
	}
	if err := a.point(a.gen + 1); err != nil {
		return err
	}
	gens, err := a.gens()
	for _, g := range gens {
		if g < a.gen-1 {
			os.Remove(a.path(g))
		}
	}
	return err
}

// close stops the rotation. Accounting stays on until the container it
// goes through goes (its mount with it).
func (a *acctLog) close() {
	if a == nil {
		return
	}
	close(a.stop)
	<-a.done
}
