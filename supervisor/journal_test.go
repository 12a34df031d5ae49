package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestJournalRoundTrip: what a run adds is what the next one reads back,
// head checked, a last line cut short (a kill mid-write) dropped.
func TestJournalRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, "SUPERVISOR_APPS=app", "SUPERVISOR_RESTART_POLICY=OnFailure")
	head := journalHead("uid-1", cfg)
	j, err := createJournal(dir, head, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{Kind: "app", ID: &entryInstance{PID: 10, Start: 7}, Container: "app", Name: "app"},
		{Kind: "end", ID: &entryInstance{PID: 10, Start: 7}, Status: &entryStatus{Known: true, Code: 3}, At: 5},
		{Kind: "sidecar", ID: &entryInstance{PID: 100, Start: 9}, Container: "istio-proxy"},
	}
	for _, e := range want {
		j.add(e)
	}
	j.close()
	f, err := os.OpenFile(filepath.Join(dir, journalFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"k":"gone","id":{"pid":100,"st`) // killed mid-write
	f.Close()
	got, ignored := readJournal(dir, head)
	if ignored != "" {
		t.Fatalf("journal ignored: %s", ignored)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	// A new run keeps them after a head of its own.
	j, err = createJournal(dir, head, got)
	if err != nil {
		t.Fatal(err)
	}
	j.close()
	if again, ignored := readJournal(dir, head); ignored != "" || !cmp.Equal(want, again) {
		t.Errorf("rewritten journal: %v, ignored %q", again, ignored)
	}
}

// TestJournalIgnored: a journal that is not this run's own, or not ours at
// all, is ignored whole, and why is said.
func TestJournalIgnored(t *testing.T) {
	cfg := testConfig(t, "SUPERVISOR_APPS=app")
	head := journalHead("uid-1", cfg)
	line := func(s string) string { return s + "\n" }
	good := line(`{"k":"head","v":1,"pod":"uid-1","policy":"Never","apps":["app"]}`)
	for _, tc := range []struct {
		name, content, why string
		mode               os.FileMode
		chown              bool
		symlink            bool
	}{
		{name: "another pod", content: line(`{"k":"head","v":1,"pod":"uid-2","policy":"Never","apps":["app"]}`), why: "another pod"},
		{name: "another policy", content: line(`{"k":"head","v":1,"pod":"uid-1","policy":"OnFailure","apps":["app"]}`), why: "restartPolicy OnFailure"},
		{name: "other apps", content: line(`{"k":"head","v":1,"pod":"uid-1","policy":"Never","apps":["job"]}`), why: "apps [job]"},
		{name: "another format", content: line(`{"k":"head","v":2,"pod":"uid-1","policy":"Never","apps":["app"]}`), why: "format 2"},
		{name: "no head", content: line(`{"k":"gone","id":{"pid":1,"start":1}}`), why: "does not start with its head"},
		{name: "two heads", content: good + good, why: "a second head"},
		{name: "not JSON", content: good + line(`app exited 0`), why: "line 2 is not a journal entry"},
		{name: "a field not ours", content: good + line(`{"k":"gone","id":{"pid":1,"start":1},"outcome":"success"}`), why: "unknown field"},
		{name: "a kind not ours", content: good + line(`{"k":"decision"}`), why: `unknown kind "decision"`},
		{name: "an end without its status", content: good + line(`{"k":"end","id":{"pid":1,"start":1},"at":1}`), why: "end without its instance, status or time"},
		{name: "writable by others", content: good, mode: 0o666, why: "writable by others"},
		{name: "another owner", content: good, chown: true, why: "another uid"},
		{name: "a symbolic link", content: good, symlink: true, why: "cannot be opened"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, journalFile)
			target := p
			if tc.symlink {
				target = filepath.Join(dir, "elsewhere")
				if err := os.Symlink(target, p); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(target, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.mode != 0 {
				if err := os.Chmod(target, tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			if tc.chown {
				if os.Geteuid() != 0 {
					t.Skip("needs root: to give the file another owner")
				}
				if err := os.Chown(target, 12345, 12345); err != nil {
					t.Fatal(err)
				}
			}
			entries, ignored := readJournal(dir, head)
			if !strings.Contains(ignored, tc.why) || entries != nil {
				t.Errorf("readJournal = %v, %q; want it ignored: %q", entries, ignored, tc.why)
			}
		})
	}
	// No journal at all is neither kept nor ignored.
	if entries, ignored := readJournal(t.TempDir(), head); entries != nil || ignored != "" {
		t.Errorf("no journal: %v, %q", entries, ignored)
	}
}
