package supervisor

import (
	"net/url"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// sidecar is the main process of a sidecar container, kept by a pidfd
// from the moment it is found (by discovery while the apps run, or by the
// stop's scans) until the stop is done with it; with what the table of
// known sidecars (sidecars.go) says of it, and what the stop has learnt.
type sidecar struct {
	container string
	main      procscan.Process
	proc      exitwatch.Proc
	// known is what the table (sidecars.go) knows of it, or nil; args its
	// command line, read only for a known sidecar whose stop depends on
	// its flags (needsArgs), once it has one (argsRead): a sidecar found
	// in the middle of its exec has none yet (procscan.Scanner.Args), and
	// is read again before its stop is planned (run.awaitArgs).
	known    *knownSidecar
	args     []string
	argsRead bool
	// handlerSeen: the child that shows a known sidecar handles SIGTERM
	// (knownSidecar.handlerWith) has been seen.
	handlerSeen bool
	// blindDispositions: its /proc/PID/status has no signal dispositions
	// (gVisor's has no SigCgt line), said once.
	blindDispositions bool
	// sent is the last signal it was sent.
	sent exitwatch.Signal
	// refused: a signal to it was refused (EPERM). The refusal lasts (the
	// supervisor's uid and capabilities do not change), so its exit is no
	// longer awaited: neither STOP_TIMEOUT nor a SIGKILL could end it.
	refused bool
}

// newSidecar is c's main process, kept by proc, as a sidecar, with what
// the table (sidecars.go) needs of it read through scan.
func newSidecar(c procscan.Container, proc exitwatch.Proc, scan Scanner) *sidecar {
	s := &sidecar{container: c.Name, main: c.Main, proc: proc, known: knownAs(c.Name, c.Main)}
	s.readArgs(scan)
	// Read now, while the apps run, rather than on the stop's path (about
	// a millisecond under load: task/*/children of each thread); if the
	// child has not started yet, the stop reads again (unready).
	s.seeHandler(scan)
	return s
}

// needsArgs reports whether s's stop depends on flags of its command line.
func (s *sidecar) needsArgs() bool {
	k := s.known
	return k != nil && (k.zeroFlag != "" || k.quit != nil && (k.quit.portFlag != "" || k.quit.enableFlag != ""))
}

// readArgs reads s's command line if its stop needs it and it has not
// been read yet, and reports whether it is known now (or not needed). A
// read that finds none (in the middle of its exec), or finds the process
// gone, leaves it unread.
func (s *sidecar) readArgs(scan Scanner) bool {
	if s.argsRead || !s.needsArgs() {
		return true
	}
	if args, err := scan.Args(s.main.PID); err == nil && len(args) > 0 && !s.exited() {
		s.args, s.argsRead = args, true
	}
	return s.argsRead
}

// exited reports whether s's process has exited.
func (s *sidecar) exited() bool {
	select {
	case <-s.proc.Done():
		return true
	default:
		return false
	}
}

// seeHandler reads whether s's known sidecar has started the child that
// shows it handles its graceful signal (knownSidecar.handlerWith), and
// remembers it: once started, it stays so for this process. A child gone
// or unreadable is "not seen".
func (s *sidecar) seeHandler(scan Scanner) bool {
	k := s.known
	if s.handlerSeen || k == nil || k.handlerWith == "" {
		return s.handlerSeen
	}
	kids, err := scan.Children(s.main.PID)
	if err != nil {
		return false
	}
	for _, c := range kids {
		if c.PPID == s.main.PID && c.Matches([]string{k.handlerWith}) {
			s.handlerSeen = true
			break
		}
	}
	return s.handlerSeen
}

// beforeURL is what must be POSTed before the action u, or nil.
func (s *sidecar) beforeURL(u *url.URL) *url.URL {
	if s.known == nil || s.known.before == nil || u.Path != s.known.before.quit {
		return nil
	}
	b := *u
	b.Path, b.RawPath, b.RawQuery = s.known.before.path, "", ""
	return &b
}

// expectExit says, for a known sidecar sent sig, what it will exit with
// when not 0, and how to make it 0.
func (s *sidecar) expectExit(sig exitwatch.Signal) (code int, fix string) {
	k := s.known
	if k == nil || sig != exitwatch.SIGTERM || k.termExit == 0 {
		return 0, ""
	}
	if _, ok := flag(s.args, k.zeroFlag); ok {
		return 0, ""
	}
	return k.termExit, k.fix
}

// closeAll releases the sidecars' pidfds.
func closeAll(sidecars []*sidecar) {
	for _, s := range sidecars {
		s.proc.Close()
	}
}
