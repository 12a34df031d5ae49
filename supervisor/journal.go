package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/sidecar-supervisor/sidecar-supervisor/supervisor/exitwatch"
)

// The journal: what a run has seen, kept in SUPERVISOR_STATE_DIR (an
// emptyDir) so that the next instance of the supervisor, when the kubelet
// restarts a killed one, carries on where it stopped instead of starting
// over (a new look for apps long gone, a status lost, a sidecar stop
// waited for in vain).
//
// It holds facts only, one JSON line each, appended as they happen: the
// app instances seen (a main process's PID and start time, its container)
// and how each ended, the sidecars seen and their ends. What follows from
// them (which restarts are awaited, the outcome, the action) is derived
// again by replaying the facts into a fresh ledger: a decision is never
// read from the file.
//
// Read back, it is trusted only as far as it agrees with what the kernel
// shows now: a file not ours (not a regular file, another owner, writable
// by others, oversized), a head naming another pod or other settings, a
// line that does not parse as one of ours, or a fact /proc contradicts (an
// instance said to have ended whose main process still runs) makes the
// whole journal ignored, with a warning, and the run starts over as a
// first one would: never worse than no journal. A last line cut short (the
// supervisor killed mid-write) is dropped.
const (
	journalFile = "journal"
	// journalMax bounds the journal: a run that reaches it stops keeping
	// one (a restarted instance then starts over).
	journalMax = 1 << 20
)

// journalVersion is the format's; a journal of another is ignored.
const journalVersion = 1

// entry is one line of the journal. Kind says which fields it uses:
//
//	head     Version, Pod, Policy, Apps: the run it belongs to (first line)
//	app      ID, Container, Name: an app instance started (ledger.started)
//	seen     PID, Container, Name, Status: one first seen ended (startedExited)
//	moved    ID, Container: an instance moved by the runtime (ledger.rename)
//	end      ID, Status, At: an app instance's end (ledger.exited)
//	sidecar  ID, Container: a sidecar's main process seen
//	gone     ID: that sidecar's main process exited
type entry struct {
	Kind      string         `json:"k"`
	Version   int            `json:"v,omitempty"`
	Pod       string         `json:"pod,omitempty"`
	Policy    RestartPolicy  `json:"policy,omitempty"`
	Apps      []string       `json:"apps,omitempty"`
	ID        *entryInstance `json:"id,omitempty"`
	PID       int            `json:"pid,omitempty"`
	Container string         `json:"c,omitempty"`
	Name      string         `json:"n,omitempty"`
	Status    *entryStatus   `json:"s,omitempty"`
	At        int64          `json:"at,omitempty"` // Unix nanoseconds
}

type entryInstance struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

type entryStatus struct {
	Known  bool   `json:"known"`
	Code   int    `json:"code"`
	Signal int    `json:"signal"`
	Reason string `json:"reason,omitempty"`
}

func toEntryInstance(i instance) *entryInstance { return &entryInstance{PID: i.pid, Start: i.start} }
func (e *entryInstance) instance() instance     { return instance{pid: e.PID, start: e.Start} }

func toEntryStatus(s exitwatch.Status) *entryStatus {
	return &entryStatus{Known: s.Known, Code: s.Code, Signal: int(s.Signal), Reason: s.Reason}
}

func (e *entryStatus) status() exitwatch.Status {
	return exitwatch.Status{Known: e.Known, Code: e.Code, Signal: exitwatch.Signal(e.Signal), Reason: e.Reason}
}

// journal appends facts to the file; nil (no state directory) keeps none.
type journal struct {
	f    *os.File
	size int64
	err  error // the first failure to write: the journal is off from then on
}

// journalHead is the first line of a run's journal.
func journalHead(pod string, cfg Config) entry {
	return entry{Kind: "head", Version: journalVersion, Pod: pod, Policy: cfg.RestartPolicy, Apps: cfg.Apps}
}

// readJournal reads the journal in dir, if any, and checks that it is ours
// and this run's (head): the entries after the head, or why it is ignored
// (a missing file is neither: nil, ""). A head alone gives no entries, but
// not nil: a supervisor before kept it, and saw nothing.
func readJournal(dir string, head entry) (entries []entry, ignored string) {
	f, err := os.OpenFile(filepath.Join(dir, journalFile), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ""
	}
	if err != nil {
		return nil, "cannot be opened: " + err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "cannot be read: " + err.Error()
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, "not a regular file"
	case st == nil || int(st.Uid) != os.Geteuid():
		return nil, "not the supervisor's own file (its owner is another uid)"
	case fi.Mode().Perm()&0o022 != 0:
		return nil, fmt.Sprintf("writable by others (mode %v)", fi.Mode().Perm())
	case fi.Size() > journalMax:
		return nil, fmt.Sprintf("larger than %d bytes", journalMax)
	}
	data, err := io.ReadAll(io.LimitReader(f, journalMax+1))
	if err != nil {
		return nil, "cannot be read: " + err.Error()
	}
	if i := bytes.LastIndexByte(data, '\n'); i < len(data)-1 {
		data = data[:i+1] // a line cut short: the supervisor was killed mid-write
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), journalMax)
	for n := 1; sc.Scan(); n++ {
		var e entry
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Sprintf("line %d is not a journal entry: %v", n, err)
		}
		if why := e.check(); why != "" {
			return nil, fmt.Sprintf("line %d: %s", n, why)
		}
		if n == 1 {
			if e.Kind != "head" {
				return nil, "it does not start with its head"
			}
			if why := sameRun(e, head); why != "" {
				return nil, why
			}
			entries = []entry{}
			continue
		}
		if e.Kind == "head" {
			return nil, fmt.Sprintf("line %d: a second head", n)
		}
		entries = append(entries, e)
	}
	return entries, ""
}

// check says what is wrong with an entry's fields for its kind, or "".
func (e entry) check() string {
	switch e.Kind {
	case "head":
		if e.Version != journalVersion {
			return fmt.Sprintf("format %d, not %d", e.Version, journalVersion)
		}
	case "app", "moved", "sidecar":
		if e.ID == nil || e.ID.PID <= 0 || e.Container == "" {
			return e.Kind + " without its instance or container"
		}
	case "seen":
		if e.PID < 0 || e.Container == "" || e.Status == nil {
			return "seen without its container or status"
		}
	case "end":
		if e.ID == nil || e.ID.PID <= 0 || e.Status == nil || e.At <= 0 {
			return "end without its instance, status or time"
		}
	case "gone":
		if e.ID == nil || e.ID.PID <= 0 {
			return "gone without its instance"
		}
	default:
		return fmt.Sprintf("unknown kind %q", e.Kind)
	}
	return ""
}

// sameRun says why a journal's head is not this run's, or "".
func sameRun(got, want entry) string {
	switch {
	case got.Pod != want.Pod:
		return fmt.Sprintf("it belongs to another pod (%q, not %q)", got.Pod, want.Pod)
	case got.Policy != want.Policy:
		return fmt.Sprintf("it was kept under restartPolicy %s, not %s", got.Policy, want.Policy)
	case !slices.Equal(got.Apps, want.Apps):
		return fmt.Sprintf("it was kept for the apps %v, not %v", got.Apps, want.Apps)
	}
	return ""
}

// createJournal starts a new journal in dir with head, replacing any
// other: entries are the facts of a journal read back, written again after
// the head (so that a journal that was ignored is gone, and one that was
// kept goes on).
func createJournal(dir string, head entry, entries []entry) (*journal, error) {
	tmp, err := os.CreateTemp(dir, journalFile+".new-*")
	if err != nil {
		return nil, err
	}
	j := &journal{f: tmp}
	for _, e := range append([]entry{head}, entries...) {
		j.add(e)
	}
	if j.err == nil {
		j.err = os.Rename(tmp.Name(), filepath.Join(dir, journalFile))
	}
	if j.err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, j.err
	}
	return j, nil
}

// add appends one fact. The first failure turns the journal off (the run
// goes on without: its next instance would start over); the caller logs it
// once (failed).
func (j *journal) add(e entry) {
	if j == nil || j.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		j.err = err
		return
	}
	b = append(b, '\n')
	if j.size+int64(len(b)) > journalMax {
		j.err = fmt.Errorf("the journal reached %d bytes", journalMax)
		return
	}
	// One write per line: a kill mid-line leaves a line cut short, which
	// the reader drops.
	n, err := j.f.Write(b)
	j.size += int64(n)
	if err != nil {
		j.err = err
	}
}

// failed returns the error that turned the journal off, once.
func (j *journal) failed() error {
	if j == nil || j.err == nil || errors.Is(j.err, errJournalReported) {
		return nil
	}
	err := j.err
	j.err = fmt.Errorf("%w: %v", errJournalReported, err)
	return err
}

var errJournalReported = errors.New("journal off")

func (j *journal) close() {
	if j != nil && j.f != nil {
		j.f.Close()
	}
}
