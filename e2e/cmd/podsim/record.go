package main

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// recorder appends lines to a file, a record the tests assert on or the
// stamps the benchmarks (e2e/bench) read; with no file it appends nothing.
type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func newRecorder(path string) *recorder {
	r := &recorder{}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
		if err != nil {
			fmt.Fprintf(os.Stderr, "record: %v\n", err)
		}
		r.f = f
	}
	return r
}

// log records an event, and writes it with the time to stderr.
func (r *recorder) log(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), line)
	r.write(line)
}

// stamp records "EVENT UNIX_NS" (CLOCK_REALTIME, nanoseconds) for an event
// that happened at t: the clock readings, kept apart from the records.
func (r *recorder) stamp(event string, t time.Time) {
	r.write(fmt.Sprintf("%s %d", event, t.UnixNano()))
}

func (r *recorder) write(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		r.f.WriteString(line + "\n")
	}
}
