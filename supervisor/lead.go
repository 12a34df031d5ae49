package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// One supervisor leads a pod at a time. A second one in a container of its
// own with the same SUPERVISOR_STATE_DIR (a standby) waits on a flock in
// that directory while the first runs, and carries on from its journal the
// moment the first dies: the kernel drops a process's flock as it exits,
// whatever kills it, so the standby leads within milliseconds of the death,
// where a restart waits for the kubelet (seconds on a loaded node, and
// never under restartPolicy Never). Nothing is taken from the lock file but
// who held it, for the log: a lock outlives no process, so a file left by a
// dead one holds no one back.

// leaderFile is the lock's file in the state directory; it holds the PID of
// the supervisor that leads.
const leaderFile = "leader"

// lead takes the lock, or waits for it, then starts. Where the lock cannot
// be had at all (a directory the supervisor cannot write, flock refused),
// the run leads without it: a standby then runs beside it rather than
// after it, which the journal's checks of /proc bear, and a lone
// supervisor must never wait on a lock it cannot take.
func (r *run) lead(ctx context.Context) (state, error) {
	f, err := os.OpenFile(filepath.Join(r.cfg.StateDir, leaderFile), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return r.standBy(ctx, f)
		}
	}
	if err != nil {
		r.log.Warn().Err(err).Str("dir", r.cfg.StateDir).
			Msg("cannot take the leader's lock: leading without it (a standby supervisor would not wait for this one)")
		if f != nil {
			f.Close()
		}
		return r.start, nil
	}
	r.leading(f)
	return r.start, nil
}

// standBy waits for the lock f while another supervisor holds it, then
// leads; the pod's deletion (SIGTERM) ends the wait, and the run.
func (r *run) standBy(ctx context.Context, f *os.File) (state, error) {
	leader := holder(f)
	r.log.Info().Str("leader", leader).Str("dir", r.cfg.StateDir).
		Msg("standby: another supervisor of the pod leads; carrying on from its journal the moment it ends")
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("wait for the leader's lock in %s: %w", r.cfg.StateDir, err)
		}
	case <-ctx.Done():
		go func() {
			if <-got == nil {
				f.Close() // a lock taken too late: the next standby's
			}
		}()
		r.standby = leader
		return r.deleted, nil
	}
	r.log.Info().Str("leader_before", leader).Msg("standby: the leading supervisor has ended: leading from here")
	r.leading(f)
	return r.start, nil
}

// leading keeps f, whose lock the supervisor holds to its process's end
// (Guard runs after Run: the lead is not given up with the run), and
// writes its PID in it.
func (r *run) leading(f *os.File) {
	r.Supervisor.lock = f
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(fmt.Appendf(nil, "%d\n", os.Getpid()), 0)
		if err != nil {
			r.log.Debug().Err(err).Msg("cannot write the leader's PID")
		}
	}
}

// Release gives up the lead, if the supervisor has it: a standby then
// leads. A process's exit does so too, however it ends.
func (s *Supervisor) Release() {
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
}

// holder is who holds the lock of f, as it wrote it.
func holder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if s := string(bytes.TrimSpace(b[:n])); s != "" {
		return "pid " + s
	}
	return "a supervisor that has not written its PID yet"
}
