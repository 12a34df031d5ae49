package supervisor

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// uptimeHelper, set in the environment, makes the test binary print Uptime
// and exit (TestUptime's probe).
const uptimeHelper = "SIDECAR_SUPERVISOR_TEST_UPTIME"

func TestMain(m *testing.M) {
	if os.Getenv(uptimeHelper) != "" {
		d, err := Uptime()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(d.Nanoseconds())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestUptime: in a PID namespace of its own, as in a pod, a probe set into
// the namespace from outside (as the kubelet's exec is: its parent outside,
// PPID 0 within) finds its container's main process, the oldest, and says
// how long it has run: at least as long as the test has seen it, at most
// as long as since the test started it.
func TestUptime(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a PID namespace (unshare, nsenter)")
	}
	begun := time.Now()
	main := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "sleep", "60")
	if err := main.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { main.Process.Kill(); main.Wait() })
	// The namespace's PID 1 is unshare's child.
	var pid string
	for deadline := time.Now().Add(10 * time.Second); pid == ""; time.Sleep(time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", main.Process.Pid, main.Process.Pid))
		pid, _, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
		if pid == "" && time.Now().After(deadline) {
			t.Fatal("unshare made no child within 10s")
		}
	}
	seen := time.Now()
	time.Sleep(1100 * time.Millisecond) // its age grows, whatever the load
	probe := exec.Command("nsenter", "--target", pid, "--pid", "--mount", os.Args[0])
	probe.Env = append(os.Environ(), uptimeHelper+"=1")
	lower := time.Since(seen) // before the probe reads the clock
	out, err := probe.CombinedOutput()
	upper := time.Since(begun) // after
	if err != nil {
		t.Fatalf("the probe in the namespace: %v: %s", err, out)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("the probe printed %q", out)
	}
	// The kernel counts start times in ticks (10 ms): a tick's leeway.
	if up := time.Duration(n); up < lower-10*time.Millisecond || up > upper+10*time.Millisecond {
		t.Errorf("Uptime %v in the namespace, want between %v (since the test saw its main process) and %v (since it started it)", up, lower, upper)
	}
}
