// Package record defines the event log that the stand-in envoy (e2e/cmd/envoy)
// writes and the tests read: one JSON object per line, appended as things
// happen, so a test can assert "drain was requested" or "no drain" after the
// fact, and a failing test can print the whole story.
//
// Every line is written with a single write(2) on a file opened with O_APPEND,
// so lines from concurrent handlers never interleave, and a reader that races
// with the writer sees whole lines plus at most one partial last line (which
// Read drops). Standard library only: the stand-in must not pull in anything
// else.
package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// EnvVar names the environment variable that tells the stand-in where to
// append its record. pilot-agent passes its whole environment to envoy, so
// setting it on pilot-agent is enough. A relative path is resolved against
// the stand-in's working directory (pilot-agent's, which it inherits).
const EnvVar = "ENVOY_STANDIN_RECORD"

// Kind says what an Event is about.
type Kind string

// The kinds of events the stand-in records.
const (
	// Start: the process began; Args holds its command line, PID and UID who it runs as.
	Start Kind = "start"
	// Listen: a listener is open (Name "admin" or a bootstrap listener's name), Addr its address.
	Listen Kind = "listen"
	// Ready: the stats now say LIVE, workers started and xDS config received.
	Ready Kind = "ready"
	// Admin: a request to the admin API (Method, Path, Query, Status).
	Admin Kind = "admin"
	// Proxy: a request on a bootstrap listener, forwarded to a static cluster
	// (Name is the listener, Cluster the route's cluster, Status the answer).
	Proxy Kind = "proxy"
	// Signal: a catchable signal arrived (Signal, e.g. "SIGTERM"). SIGKILL can
	// never be recorded: a record that ends without an Exit line means the
	// process was killed (pilot-agent always stops envoy with SIGKILL).
	Signal Kind = "signal"
	// Drain: a drain began (Graceful, InboundOnly, SkipExit copy the query).
	Drain Kind = "drain"
	// Exit: the process is about to exit by itself (Code, Reason).
	Exit Kind = "exit"
	// Error: something went wrong that the stand-in survived (Reason).
	Error Kind = "error"
)

// Event is one line of the record. Fields that do not apply to a Kind are omitted.
type Event struct {
	Time        time.Time `json:"time"`
	Kind        Kind      `json:"kind"`
	PID         int       `json:"pid,omitempty"`
	UID         *int      `json:"uid,omitempty"` // set on Start only (0 is root, so a pointer)
	Args        []string  `json:"args,omitempty"`
	Name        string    `json:"name,omitempty"`
	Addr        string    `json:"addr,omitempty"`
	Method      string    `json:"method,omitempty"`
	Path        string    `json:"path,omitempty"`
	Query       string    `json:"query,omitempty"`
	Remote      string    `json:"remote,omitempty"`
	Cluster     string    `json:"cluster,omitempty"`
	Status      int       `json:"status,omitempty"`
	Signal      string    `json:"signal,omitempty"`
	Graceful    bool      `json:"graceful,omitempty"`
	InboundOnly bool      `json:"inboundonly,omitempty"`
	SkipExit    bool      `json:"skip_exit,omitempty"`
	Code        int       `json:"code,omitempty"`
	Reason      string    `json:"reason,omitempty"`
}

// String renders an event compactly for test failure messages.
func (e Event) String() string {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Sprintf("%s %s", e.Kind, err)
	}
	return string(b)
}

// Writer appends events to a record file. Safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	f  *os.File
}

// Create opens path for appending (creating it with mode 0644). A nil
// *Writer is valid and discards events, so the stand-in runs unrecorded when
// no path is configured.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open record %s: %w", path, err)
	}
	return &Writer{f: f}, nil
}

// Write stamps e with the current time (if unset) and appends it as one line.
func (w *Writer) Write(e Event) error {
	if w == nil {
		return nil
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode record event: %w", err)
	}
	b = append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	// One write per line: O_APPEND makes each write land whole at the end.
	_, err = w.f.Write(b)
	return err
}

// Close closes the file.
func (w *Writer) Close() error {
	if w == nil {
		return nil
	}
	return w.f.Close()
}

// Read returns the events in the record at path, oldest first. A missing
// file reads as no events (the stand-in may not have started yet). A last
// line without its newline is still being written and is left out.
func Read(path string) ([]Event, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	return Parse(bytes.NewReader(b))
}

// Parse decodes a record from r, one JSON object per line.
func Parse(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return out, fmt.Errorf("record line %d: %w", n, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Filter returns the events for which keep is true.
func Filter(events []Event, keep func(Event) bool) []Event {
	var out []Event
	for _, e := range events {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// OfKind returns the events of kind k.
func OfKind(events []Event, k Kind) []Event {
	return Filter(events, func(e Event) bool { return e.Kind == k })
}

// AdminRequests returns the admin API requests whose path is p (all when p is "").
func AdminRequests(events []Event, p string) []Event {
	return Filter(events, func(e Event) bool { return e.Kind == Admin && (p == "" || e.Path == p) })
}

// Format renders events one per line, for test failure messages.
func Format(events []Event) string {
	var sb strings.Builder
	for _, e := range events {
		sb.WriteString(e.String())
		sb.WriteByte('\n')
	}
	return sb.String()
}
