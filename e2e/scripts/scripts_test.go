package scripts

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	var a, b string
	err := Parse([]byte("log line\nA=1\n  B=/x/y  \nA=2\nC=3\n"), map[string]*string{"A": &a, "B": &b})
	if err != nil || a != "2" || b != "/x/y" {
		t.Errorf("Parse = %v, A=%q B=%q; want nil, A=2 (the later line) B=/x/y", err, a, b)
	}
	var c, d string
	err = Parse([]byte("A=1\n"), map[string]*string{"C": &c, "D": &d})
	if err == nil || !strings.Contains(err.Error(), "no C=, D= line") {
		t.Errorf("Parse of an output without C= and D= = %v; want an error naming both", err)
	}
}

func TestDirFindsThisDirectory(t *testing.T) {
	t.Setenv(DirEnv, "")
	d, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d, "build-tools.sh")); err != nil {
		t.Errorf("Dir() = %s, which holds no build-tools.sh: %v", d, err)
	}
}

// fakeScripts makes an e2e directory whose scripts/ holds the given scripts,
// and points DirEnv at it.
func fakeScripts(t *testing.T, scripts map[string]string) {
	e2e := t.TempDir()
	dir := filepath.Join(e2e, "scripts")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	scripts[marker] = "# marker\n"
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(DirEnv, e2e)
}

func TestRun(t *testing.T) {
	fakeScripts(t, map[string]string{
		"ok.sh":   "echo working >&2\necho \"GOT=$1\"\n",
		"fail.sh": "echo \"cannot fetch the kernel\" >&2\nexit 3\n",
		"mute.sh": "echo done >&2\n",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got string
	if err := Run(ctx, "ok.sh", map[string]*string{"GOT": &got}, "arg"); err != nil || got != "arg" {
		t.Errorf("Run(ok.sh arg) = %v, GOT=%q; want nil, GOT=arg", err, got)
	}
	err := Run(ctx, "fail.sh", map[string]*string{"GOT": &got})
	if err == nil || !strings.Contains(err.Error(), "fail.sh: exit status 3") || !strings.Contains(err.Error(), "cannot fetch the kernel") {
		t.Errorf("Run(fail.sh) = %v; want its exit status and its stderr", err)
	}
	err = Run(ctx, "mute.sh", map[string]*string{"GOT": &got})
	if err == nil || !strings.Contains(err.Error(), "e2e/scripts/mute.sh: no GOT= line") {
		t.Errorf("Run(mute.sh) = %v; want an error naming the script and the missing line", err)
	}
}

// TestOutputCancelled: a cancelled script is killed with what it started,
// so that a grandchild holding stdout open does not keep Output waiting.
func TestOutputCancelled(t *testing.T) {
	fakeScripts(t, map[string]string{"hang.sh": "sleep 300 &\nsleep 300\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Output(ctx, "hang.sh")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Output of a cancelled script returned no error")
		}
	case <-time.After(time.Minute):
		t.Fatal("Output still waiting a minute after its context ended")
	}
}
