package main

import (
	"fmt"
	"os"
	"time"
)

// stamper appends "EVENT UNIX_NS" lines (CLOCK_REALTIME, nanoseconds) to a
// file: the clock readings the benchmarks (e2e/bench) take, kept apart
// from the records the tests assert on. A nil stamper does nothing.
type stamper struct{ f *os.File }

func newStamper(path string) *stamper {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stamps: %v\n", err)
		return nil
	}
	return &stamper{f: f}
}

// stamp writes one line for an event that happened at t.
func (s *stamper) stamp(event string, t time.Time) {
	if s == nil {
		return
	}
	fmt.Fprintf(s.f, "%s %d\n", event, t.UnixNano())
}
