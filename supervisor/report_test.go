package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestWriteTerminationMessage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "termination-log")
	if err := os.WriteFile(path, []byte(Progress+"a long progress that the summary replaces\napp a (pid 1): running\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if written, err := WriteTerminationMessage(path, "success: a exit 0"); !written || err != nil {
		t.Fatalf("written %v, err %v", written, err)
	}
	if got, _ := os.ReadFile(path); string(got) != "success: a exit 0\n" {
		t.Errorf("file holds %q, want only the summary", got)
	}

	long := strings.Repeat("x", 2*maxTerminationMessage)
	if _, err := WriteTerminationMessage(path, long); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); len(got) != maxTerminationMessage || !strings.HasSuffix(string(got), "...\n") {
		t.Errorf("a long summary: %d bytes ending %q, want %d ending in \"...\\n\"", len(got), got[len(got)-5:], maxTerminationMessage)
	}

	missing := filepath.Join(dir, "none")
	if written, err := WriteTerminationMessage(missing, "success"); written || err != nil {
		t.Errorf("no file: written %v, err %v; want neither", written, err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("%s was created", missing)
	}
}

// TestTerminationMessageNeverEmpty rewrites the file as the run does its
// progress while another reader reads it: the reader must never find it
// empty, which is what the kubelet would read of a supervisor killed at
// that moment (and show the log's tail instead).
func TestTerminationMessageNeverEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "termination-log")
	if err := os.WriteFile(path, []byte("running: start\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const rewrites = 20000
	done := make(chan struct{})
	var wg sync.WaitGroup
	var empty, reads int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Error(err)
				return
			}
			reads++
			if len(b) == 0 {
				empty++
			}
		}
	}()
	for i := range rewrites {
		msg := Progress + "waiting for a (pid 1)"
		if i%2 == 1 {
			msg = Progress + "waiting for a (pid 1), b (pid 2): a longer line"
		}
		if _, err := WriteTerminationMessage(path, msg); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if empty > 0 {
		t.Errorf("the file was empty in %d of %d reads during %d rewrites", empty, reads, rewrites)
	}
	if reads == 0 {
		t.Error("no read ran")
	}
}
