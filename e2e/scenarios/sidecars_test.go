package scenarios

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// cloudSQLProxyArgs start the real cloud-sql-proxy offline: a token instead
// of credentials, and the instance's connection details fetched only when a
// client connects (--lazy-refresh), which none does.
var cloudSQLProxyArgs = []string{"--token", "x", "--lazy-refresh", "--port", "5432"}

// cloudSQLInstance is an instance connection name; nothing is asked of it.
const cloudSQLInstance = "proj:region:inst"

// TestCloudSQLProxy runs Job pods with the real cloud-sql-proxy v2 next to
// Istio's real pilot-agent, on every backend, with today's supervisor
// configured for both by hand (SUPERVISOR_SIDECAR_PROCESSES, and
// SUPERVISOR_SIDECAR_ACTIONS for its /quitquitquit). cloud-sql-proxy's own
// exit code decides as much as the app's: under restartPolicy Never a
// sidecar exiting 143 fails the pod whatever the app did.
func TestCloudSQLProxy(t *testing.T) {
	const quit = "cloud-sql-proxy=http://127.0.0.1:9091/quitquitquit"
	tests := []struct {
		name  string
		app   []string // the app's arguments
		flags []string // cloud-sql-proxy's, besides cloudSQLProxyArgs
		// uid runs cloud-sql-proxy as the supervisor's user (1337): a
		// signal from the supervisor, which has no capabilities, reaches
		// only processes of its own uid. 0: the image's (65532).
		uid int
		env []string // the supervisor's, besides the sidecar list
		// want
		phase   pod.Phase
		codes   map[string]int
		summary string
		// log is what cloud-sql-proxy says of its stop.
		log string
	}{
		{
			name: "success, quitquitquit: every container 0", flags: []string{"--quitquitquit"},
			env:   []string{"SUPERVISOR_SIDECAR_ACTIONS=" + quit},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "cloud-sql-proxy": 0, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM; sidecar stopped",
			log:     "/quitquitquit received request",
		},
		{
			name: "failure, quitquitquit: Failed", app: []string{"--exit", "3"}, flags: []string{"--quitquitquit"},
			env: []string{"SUPERVISOR_SIDECAR_ACTIONS=" + quit},
			// The sidecar's own action applies whatever the outcome;
			// pilot-agent gets the failure's SIGKILL.
			phase: pod.Failed, codes: map[string]int{"app": 3, "cloud-sql-proxy": 0, "istio-proxy": 137, "supervisor": 0},
			summary: "failure: app exit 3; action SIGKILL; sidecar stopped",
			log:     "/quitquitquit received request",
		},
		{
			name: "success, SIGTERM: its 143 fails the pod", uid: ProxyUID,
			phase: pod.Failed, codes: map[string]int{"app": 0, "cloud-sql-proxy": 143, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM; sidecar stopped",
			log:     "SIGTERM signal received",
		},
		{
			name: "success, SIGTERM with --exit-zero-on-sigterm: every container 0", uid: ProxyUID,
			flags: []string{"--exit-zero-on-sigterm"},
			phase: pod.Succeeded, codes: map[string]int{"app": 0, "cloud-sql-proxy": 0, "istio-proxy": 0, "supervisor": 0},
			summary: "success: app exit 0; action SIGTERM; sidecar stopped",
			log:     "SIGTERM signal received",
		},
		{
			name: "failure, SIGKILL: Failed", uid: ProxyUID, app: []string{"--exit", "3"},
			phase: pod.Failed, codes: map[string]int{"app": 3, "cloud-sql-proxy": 137, "istio-proxy": 137, "supervisor": 0},
			summary: "failure: app exit 3; action SIGKILL; sidecar stopped",
		},
	}
	for _, b := range builders(t) {
		for _, tt := range tests {
			t.Run(b.name+"/"+tt.name, func(t *testing.T) {
				p, _ := runCloudSQLProxy(t, b, tt.app, tt.flags, tt.uid, tt.env)
				st := waitPhase(t, p, time.Minute)
				if st.Phase != tt.phase {
					t.Errorf("phase %s, want %s (%s)", st.Phase, tt.phase, st)
				}
				for name, code := range tt.codes {
					if got := st.Container(name).ExitCode; got != code {
						t.Errorf("%s exit %d, want %d", name, got, code)
					}
				}
				if c := st.Container("cloud-sql-proxy"); c.ExitCode == 143 && c.Signal != 0 {
					t.Errorf("cloud-sql-proxy was killed by %v: its handler was not in place", c.Signal)
				}
				if msg := p.TerminationMessage("supervisor"); !strings.Contains(msg, tt.summary) {
					t.Errorf("termination message %q, want it to contain %q", msg, tt.summary)
				}
				if logs := p.Logs("cloud-sql-proxy"); !strings.Contains(logs, tt.log) {
					t.Errorf("cloud-sql-proxy's log does not say %q:\n%s", tt.log, logs)
				}
			})
		}
	}
}

// TestCloudSQLProxyOtherUser: cloud-sql-proxy as its image runs it (uid
// 65532) cannot be signalled by the supervisor (uid 1337, no
// capabilities): with a signal for its action the supervisor gives up and
// the pod never completes. Only its HTTP stop reaches it.
func TestCloudSQLProxyOtherUser(t *testing.T) {
	for _, b := range builders(t) {
		t.Run(b.name, func(t *testing.T) {
			p, _ := runCloudSQLProxy(t, b, nil, nil, 0, []string{"SUPERVISOR_STOP_TIMEOUT=5s"})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := p.WaitFor(ctx, func(s pod.Status) bool { c := s.Container("supervisor"); return c.Started && !c.Running })
			if err != nil {
				t.Fatal(err)
			}
			if st.Phase != pod.Running || !st.Container("cloud-sql-proxy").Running || st.Container("istio-proxy").ExitCode != 0 {
				t.Errorf("status %s, want Running with cloud-sql-proxy up and istio-proxy exited 0", st)
			}
			want := "not permitted to signal cloud-sql-proxy"
			if msg := p.TerminationMessage("supervisor"); !strings.Contains(msg, want) {
				t.Errorf("termination message %q, want it to contain %q", msg, want)
			}
		})
	}
}

// runCloudSQLProxy starts a Job pod: a cued app with appArgs, the real
// cloud-sql-proxy with flags (as uid when not 0), Istio's real pilot-agent
// holding the app until ready, and the supervisor told of both sidecars
// (plus env). It returns once both sidecars are up and the app released.
func runCloudSQLProxy(t *testing.T, b builder, appArgs, flags []string, uid int, env []string) (*pod.Pod, Built) {
	t.Helper()
	csp := Sidecar{Program: CloudSQLProxy, UID: uid,
		Args: append(append(append([]string{}, cloudSQLProxyArgs...), flags...), cloudSQLInstance)}
	d := Desc{Name: "job", Proxy: RealPilot, HoldApp: true,
		Apps:     []App{{Name: "app", Cued: true, UID: 1000, Args: appArgs}},
		Sidecars: []Sidecar{csp}}
	d.SupervisorEnv = append(append(append([]string{}, fast...),
		"SUPERVISOR_STOP_TIMEOUT=15s", "SUPERVISOR_SIDECAR_PROCESSES=pilot-agent,cloud-sql-proxy"), env...)
	p, built := run(t, b, d)
	waitEnvoy(t, built)
	// cloud-sql-proxy listens once it handles SIGTERM (its signal.Notify
	// comes first): until then its Go runtime lets SIGTERM kill it,
	// whatever its flags.
	waitListening(t, p, "cloud-sql-proxy", 5432)
	releaseApps(t, p, built, d.Apps)
	return p, built
}

// waitListening waits (bounded) until the named container's main process
// has a TCP socket listening on port, as its network namespace's
// /proc/PID/net/tcp shows (the pod's, shared by every container).
func waitListening(t *testing.T, p *pod.Pod, container string, port int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if pid := p.Status().Container(container).PID; pid > 0 && listening(pid, port) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never listened on port %d within 30s (%s)", container, port, p.Status())
}

// listening reports whether /proc/PID/net/tcp has a socket in state LISTEN
// (0A) on port.
func listening(pid, port int) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if n, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(n) == port {
			return true
		}
	}
	return false
}
