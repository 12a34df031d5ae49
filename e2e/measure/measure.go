// Package measure is what the measuring programs bench, k8sbench and soak
// share: statistics, markdown tables, the machine's description, /proc and
// cgroup counters, the apps' adjtimex stamps and the supervisor's JSON log.
// It imports nothing of Kubernetes: bench runs without a cluster.
package measure

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Quantile is the q-quantile (0..1) of v by linear interpolation between
// the closest ranks, NaN for none; v keeps its order.
func Quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(v))
	pos := q * float64(len(s)-1)
	lo, hi := int(math.Floor(pos)), int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Rank is the p-th percentile (0..100) of a non-empty v by nearest rank: a
// value of v itself; v keeps its order.
func Rank[T cmp.Ordered](v []T, p int) T {
	s := slices.Sorted(slices.Values(v))
	return s[max(1, min((p*len(s)+99)/100, len(s)))-1]
}

// Table writes a markdown table. align has an 'r' for each column aligned
// right; the others, and those past its end, are aligned left.
func Table(w io.Writer, align string, head []string, rows ...[]string) {
	rule := make([]string, len(head))
	for i := range rule {
		rule[i] = "---"
		if i < len(align) && align[i] == 'r' {
			rule[i] = "---:"
		}
	}
	for _, r := range append([][]string{head, nil}, rows...) {
		if r == nil {
			fmt.Fprintf(w, "|%s|\n", strings.Join(rule, "|"))
			continue
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}

// LoadAvg is /proc/loadavg's three averages, which every report gives: a
// busy machine explains slow figures.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// Kernel is uname's release and machine.
func Kernel() (release, machine string) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?", "?"
	}
	return unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:])
}

// Commit describes the checkout dir is in, what a report measured.
func Commit(dir string) string {
	out, err := exec.Command("git", "-C", dir, "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

// Counters reads the numbers of a file of "key: N" or "key N" lines
// (/proc/PID/status, /proc/meminfo, a cgroup's cpu.stat); a unit after the
// number ("kB") is dropped, lines without a number are skipped.
func Counters(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.Replace(l, ":", " ", 1))
		if len(f) < 2 {
			continue
		}
		if n, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			out[f[0]] = n
		}
	}
	return out, nil
}

// ReadUint reads a file holding one number (/proc/sys, cgroup files).
func ReadUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// adjtimex's output as busybox prints it, on lines of their own or run
// together on one line by the shell ($(adjtimex) unquoted).
var (
	adjStatus = regexp.MustCompile(`status:\s*(\d+)`)
	adjSec    = regexp.MustCompile(`time\.tv_sec:\s*(\d+)`)
	adjFrac   = regexp.MustCompile(`time\.tv_usec:\s*(\d+)`)
)

// staNano is adjtimex's STA_NANO status bit: tv_usec holds nanoseconds.
const staNano = 0x2000

// ParseAdjtimex reads the last time busybox's adjtimex printed in text.
// The apps stamp their ends with it: busybox's date has no %N, and
// adjtimex(2) needs no privilege to read the clock to the nanosecond.
func ParseAdjtimex(text string) (time.Time, error) {
	var v [3]int64
	for i, re := range []*regexp.Regexp{adjStatus, adjSec, adjFrac} {
		all := re.FindAllStringSubmatch(text, -1)
		if len(all) == 0 {
			return time.Time{}, fmt.Errorf("no %q in %q", re.String(), text)
		}
		n, err := strconv.ParseInt(all[len(all)-1][1], 10, 64)
		if err != nil {
			return time.Time{}, err
		}
		v[i] = n
	}
	ns := v[2]
	if v[0]&staNano == 0 {
		ns *= 1000
	}
	if ns < 0 || ns >= int64(time.Second) {
		return time.Time{}, errors.New("adjtimex's fraction is out of range")
	}
	return time.Unix(v[1], ns), nil
}

// LogLine is a line of the supervisor's JSON log: the fields the programs
// read, its time parsed, and the line itself for the fields of one
// message only (the same key means other things in other messages).
type LogLine struct {
	Time      string   `json:"time"`
	Message   string   `json:"message"`
	Container string   `json:"container"`
	Signal    string   `json:"signal"`
	Reason    string   `json:"reason"`
	Error     string   `json:"error"`
	Missing   []string `json:"missing"`
	// Wait is a wait for a restart, in seconds (cmd/sidecar-supervisor
	// sets zerolog's duration unit).
	Wait float64 `json:"wait"`
	// Elapsed is how long a wait took, in seconds (the line "sidecar
	// handles the signal now", among others).
	Elapsed float64   `json:"elapsed"`
	At      time.Time `json:"-"`
	Raw     string    `json:"-"`
}

// Waited is l's Wait as a duration.
func (l LogLine) Waited() time.Duration { return time.Duration(l.Wait * float64(time.Second)) }

// Took is l's Elapsed as a duration.
func (l LogLine) Took() time.Duration { return time.Duration(l.Elapsed * float64(time.Second)) }

// ParseLog reads the supervisor's JSON lines out of its container's output.
// Lines not starting with "{" are someone else's; one that does but cannot
// be read, its time included, is left out and makes the error.
func ParseLog(text string) ([]LogLine, error) {
	var lines []LogLine
	var errs []error
	for _, raw := range strings.Split(text, "\n") {
		if !strings.HasPrefix(raw, "{") {
			continue
		}
		l := LogLine{Raw: raw}
		err := json.Unmarshal([]byte(raw), &l)
		if err == nil {
			l.At, err = time.Parse(time.RFC3339Nano, l.Time)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("supervisor log line %q: %w", raw, err))
			continue
		}
		lines = append(lines, l)
	}
	return lines, errors.Join(errs...)
}
