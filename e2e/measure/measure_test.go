package measure

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	s := []float64{5, 1, 4, 2, 3}
	for _, tt := range []struct{ q, want float64 }{{0, 1}, {0.5, 3}, {1, 5}, {0.25, 2}, {0.9, 4.6}} {
		if got := Quantile(s, tt.q); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := Quantile([]float64{4, 1, 3, 2}, 0.5); got != 2.5 {
		t.Errorf("median of an even count = %v, want the mean of the middle two, 2.5", got)
	}
	if got := Quantile(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("empty sample's median = %v, want NaN", got)
	}
	if s[0] != 5 {
		t.Errorf("Quantile sorted the sample in place: %v", s)
	}
}

func TestRank(t *testing.T) {
	d := []time.Duration{5, -1, 4, 2, 3}
	for _, tt := range []struct {
		p    int
		want time.Duration
	}{{0, -1}, {50, 3}, {95, 5}, {100, 5}} {
		if got := Rank(d, tt.p); got != tt.want {
			t.Errorf("Rank(%d) = %v, want %v", tt.p, got, tt.want)
		}
	}
}

func TestTable(t *testing.T) {
	var b strings.Builder
	Table(&b, "lr", []string{"a", "n", "c"}, []string{"x", "1", "y"})
	if want := "| a | n | c |\n|---|---:|---|\n| x | 1 | y |\n"; b.String() != want {
		t.Errorf("Table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestCounters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "status")
	os.WriteFile(path, []byte("Name:\tx y\nVmHWM:\t  1234 kB\nusage_usec 42\nempty:\n"), 0o644)
	got, err := Counters(path)
	if err != nil || len(got) != 2 || got["VmHWM"] != 1234 || got["usage_usec"] != 42 {
		t.Errorf("Counters = %v, %v", got, err)
	}
}

// adjtimex output as Debian's busybox prints it, with STA_NANO set (status
// 0x2040: NANO and UNSYNC), and as it would with microseconds.
const (
	nanoLog = `working
    mode:         0
-o  offset:       0 us
    status:       8256 (UNSYNC)
    time.tv_sec:  1796297563
    time.tv_usec: 984469057
    return value: 5 (clock not synchronized)
`
	microLog = `    status:       64 (UNSYNC)
    time.tv_sec:  1796297563
    time.tv_usec: 984469
`
)

func TestParseAdjtimex(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      time.Time
		bad       bool
	}{
		{name: "nanoseconds", log: nanoLog, want: time.Unix(1796297563, 984469057)},
		{name: "microseconds", log: microLog, want: time.Unix(1796297563, 984469000)},
		{name: "one line", log: strings.Join(strings.Fields(nanoLog), " "), want: time.Unix(1796297563, 984469057)},
		{name: "no stamp", log: "working\n", bad: true},
		{name: "fraction out of range", log: "status: 64\ntime.tv_sec: 1\ntime.tv_usec: 1000000\n", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAdjtimex(tc.log)
			if tc.bad {
				if err == nil {
					t.Fatalf("ParseAdjtimex = %v, want an error", got)
				}
				return
			}
			if err != nil || !got.Equal(tc.want) {
				t.Fatalf("ParseAdjtimex = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestParseLog(t *testing.T) {
	lines, err := ParseLog(`{"level":"info","time":"2026-12-02T11:54:10.302Z","message":"starting"}
not json
{"time":"2026-12-02T11:54:10.310Z","message":"app found","apps":["a"]}
{"broken`)
	if len(lines) != 2 || lines[1].Message != "app found" || lines[1].At.Sub(lines[0].At) != 8*time.Millisecond {
		t.Errorf("ParseLog = %+v", lines)
	}
	if err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("ParseLog's error = %v, want the broken line", err)
	}
}
