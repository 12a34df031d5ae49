package scenarios

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// Record reads a record file (the stand-in's or an app's): one event per
// line, with any leading timestamp cut off.
func Record(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// Stamps reads the times of event from a podsim stamps file ("EVENT
// UNIX_NS" lines; CLOCK_REALTIME nanoseconds), in order. An event of one
// word matches its lines with more ("signal" matches "signal SIGTERM N").
// A matching line whose time cannot be read is an error.
func Stamps(path, event string) ([]time.Time, error) {
	var out []time.Time
	for _, l := range Record(path) {
		i := strings.LastIndexByte(l, ' ')
		if i < 0 || l[:i] != event && !strings.HasPrefix(l, event+" ") {
			continue
		}
		ns, err := strconv.ParseInt(l[i+1:], 10, 64)
		if err != nil {
			return out, fmt.Errorf("%s: bad stamp %q: %w", path, l, err)
		}
		out = append(out, time.Unix(0, ns))
	}
	return out, nil
}

// LogLine is one line of the supervisor's JSON log.
type LogLine map[string]any

// Msg is the line's message.
func (l LogLine) Msg() string { s, _ := l["message"].(string); return s }

// Str is a field as text.
func (l LogLine) Str(k string) string {
	switch v := l[k].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// Fields is the keys l has, as key=value, separated by spaces.
func (l LogLine) Fields(keys ...string) string {
	var out []string
	for _, k := range keys {
		if v := l.Str(k); v != "" {
			out = append(out, k+"="+v)
		}
	}
	return strings.Join(out, " ")
}

// ParseLog reads the supervisor's JSON log lines out of its container's
// output (other lines are skipped).
func ParseLog(out string) []LogLine {
	var lines []LogLine
	for _, s := range strings.Split(out, "\n") {
		var l LogLine
		if json.Unmarshal([]byte(s), &l) == nil && l.Msg() != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// Messages lists the log's messages in order.
func Messages(lines []LogLine) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l.Msg())
	}
	return out
}

// LogWhere lists the supervisor's log lines that match.
func LogWhere(p *pod.Pod, match func(LogLine) bool) []LogLine { return LogOf(p, "supervisor", match) }

// LogOf lists the log lines of container (a supervisor's) that match.
func LogOf(p *pod.Pod, container string, match func(LogLine) bool) []LogLine {
	var out []LogLine
	for _, l := range ParseLog(p.Logs(container)) {
		if match(l) {
			out = append(out, l)
		}
	}
	return out
}

// AccountingOn is the supervisor's line when process accounting is on.
const AccountingOn = "process accounting on: the end of an app too quick to watch, or ended unread before a restart, is read from the kernel's record of its exit (a failure's status; exit 0 reads unknown)"

// AcctZero begins the reason of a status unknown because its accounting
// record says exit 0 (supervisor/exitwatch/acct_linux.go).
const AcctZero = "its accounting record says exit 0"

// Is matches the lines with message msg.
func Is(msg string) func(LogLine) bool { return func(l LogLine) bool { return l.Msg() == msg } }

// About matches the lines with message msg about container.
func About(msg, container string) func(LogLine) bool {
	return func(l LogLine) bool { return l.Msg() == msg && l.Str("container") == container }
}

// AwaitLog waits (bounded by EventBound) until n lines of the supervisor's
// log match: the pod wakes the wait at each line written (pod.Pod.Await).
func AwaitLog(p *pod.Pod, n int, match func(LogLine) bool) error {
	return AwaitLogOf(p, "supervisor", n, match)
}

// AwaitLogOf is AwaitLog for container's log.
func AwaitLogOf(p *pod.Pod, container string, n int, match func(LogLine) bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), EventBound)
	defer cancel()
	return p.Await(ctx, func() bool { return len(LogOf(p, container, match)) >= n })
}

// WaitLogFor waits (AwaitLog) for a line of the supervisor's log with
// message msg about container; the test fails if none comes.
func WaitLogFor(t testing.TB, p *pod.Pod, msg, container string) {
	t.Helper()
	if err := AwaitLog(p, 1, About(msg, container)); err != nil {
		t.Fatalf("no %q about %s in the supervisor's log: %v", msg, container, err)
	}
}
