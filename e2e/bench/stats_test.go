package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFormats(t *testing.T) {
	tests := []struct{ got, want string }{
		{sig3(1234.5), "1234"},
		{sig3(12.345), "12.3"},
		{sig3(1.2345), "1.23"},
		{sig3(0.12345), "0.123"},
		{sig3(0.012345), "0.0123"},
		{ms(float64(1500 * time.Microsecond)), "1.50"},
		{thousands(1234567), "1,234,567"},
		{thousands(-1234), "-1,234"},
		{thousands(999), "999"},
		{count(11932.4), "11,932"},
		{count(2.5), "2.50"},
		{small(0.0001), "< 0.01"},
		{small(16.34), "16.3"},
		{shellJoin([]string{"/bin/podsim", "app", "it's"}), `'/bin/podsim' 'app' 'it'\''s'`},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestParseGoBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkScanFixture/procs=10-2         	    5710	    205316 ns/op	     20532 ns/proc
BenchmarkPidfdExit-2   	    1152	   1584398 ns/op	    510397 ns/kill-to-done	    180601 ns/reap-to-done
BenchmarkClassify/apps=50/procs=104   	   12112	     99120 ns/op	       953.1 ns/proc
PASS
`)
	got := parseGoBench(out)
	if len(got) != 3 {
		t.Fatalf("parsed %d benchmarks, want 3: %v", len(got), got)
	}
	b := got["BenchmarkScanFixture/procs=10"]
	if b.n != 5710 || b.metrics["ns/op"] != 205316 || b.metrics["ns/proc"] != 20532 {
		t.Errorf("BenchmarkScanFixture/procs=10 = %+v", b)
	}
	if v := got["BenchmarkPidfdExit"].metrics["ns/reap-to-done"]; v != 180601 {
		t.Errorf("ns/reap-to-done = %v, want 180601", v)
	}
	if v := got["BenchmarkClassify/apps=50/procs=104"].metrics["ns/proc"]; v != 953.1 {
		t.Errorf("no GOMAXPROCS suffix: ns/proc = %v, want 953.1", v)
	}
}

func TestStamp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stamps")
	content := "quitquitquit 100\nsignal SIGTERM 1796211228343370042\nsignal SIGTERM 5\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := stamp(path, "signal SIGTERM")
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(0, 1796211228343370042); !got.Equal(want) {
		t.Errorf("stamp = %v, want the first SIGTERM line's %v", got, want)
	}
	if _, err := stamp(path, "exit"); err == nil {
		t.Error("stamp of a missing event: no error")
	}
}

func TestWatchingTime(t *testing.T) {
	logs := `{"level":"info","time":"2026-12-02T11:54:10.302Z","message":"starting"}
not json
{"level":"info","time":"2026-12-02T11:54:10.306Z","message":"exit statuses read with pidfd (PIDFD_INFO_EXIT)"}
{"level":"info","pid":8,"time":"2026-12-02T11:54:10.310Z","message":"app found"}
{"level":"info","pid":9,"time":"2026-12-02T11:54:10.798Z","message":"app found"}
`
	got, err := watchingTime(logs)
	if err != nil {
		t.Fatal(err)
	}
	if want := 496 * time.Millisecond; got != want {
		t.Errorf("watchingTime = %v, want %v (to the last app found)", got, want)
	}
	if _, err := watchingTime(`{"time":"2026-12-02T11:54:10.302Z","message":"starting"}`); err == nil {
		t.Error("no app found: no error")
	}
}

func TestReadBinary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	b, err := readBinary(exe)
	if err != nil {
		t.Fatal(err)
	}
	if b.size != fi.Size() {
		t.Errorf("readBinary(%s) = %+v; want size %d", exe, b, fi.Size())
	}
}
