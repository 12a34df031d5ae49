package hardening

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

// creds is what /proc/PID/status says of a process's privileges.
type creds struct {
	Uid, Gid                       string // real, effective, saved, filesystem
	CapInh, CapPrm, CapEff, CapBnd string
	CapAmb, NoNewPrivs, Comm       string
}

func credsOf(t *testing.T, pid int) creds {
	t.Helper()
	st, err := pod.ProcStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	f := func(k string) string { return strings.Join(strings.Fields(st[k]), " ") }
	return creds{Uid: f("Uid"), Gid: f("Gid"), CapInh: st["CapInh"], CapPrm: st["CapPrm"], CapEff: st["CapEff"],
		CapBnd: st["CapBnd"], CapAmb: st["CapAmb"], NoNewPrivs: st["NoNewPrivs"], Comm: st["Name"]}
}

// supervisorProc waits until the supervisor container's process is the
// supervisor itself (the namespaces backend's entry process execs it) and
// returns its host PID.
func supervisorProc(t *testing.T, p *pod.Pod) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scenarios.EventBound)
	defer cancel()
	st, err := p.WaitRunning(ctx, "supervisor", 0)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, scenarios.EventBound, "supervisor process", func() bool { return commOf(st.PID) == "sidecar-supervi" })
	return st.PID
}

// TestPrivileges runs the supervisor as deploy/ does and checks, while it
// works, what it runs with and what it holds:
//
//   - pidfd (deploy/job.yaml, Linux 6.15+): uid and gid 1337, every
//     capability set empty (effective, permitted, bounding, inheritable,
//     ambient), no_new_privs; and it still does its job, here through the
//     HTTP action, so that it does hold a socket;
//   - ptrace (deploy/job-ptrace.yaml): root with SYS_PTRACE, SYS_PACCT and
//     KILL and nothing else in any set, its state directory given; and it
//     reads the app's exit code 3 through ptrace, process accounting on.
//
// Both, sampled every 2ms: no socket of its is ever listening (TCP LISTEN,
// an unconnected UDP socket, a unix socket that accepts), against the
// pod's /proc/net tables, and its descriptors stay few. The app runs until
// all that has been read and the supervisor has found it.
func TestPrivileges(t *testing.T) {
	for _, b := range scenarios.Builders(t) {
		t.Run(b.Name+"/pidfd, uid 1337, no capabilities", func(t *testing.T) {
			if !pidfdExitInfo(t) {
				t.Skip("the kernel has no PIDFD_INFO_EXIT (Linux 6.15+): the supervisor's no-privilege mode needs it")
			}
			built := b.MustBuild(t, httpAction("noprivs"))
			p := runWatched(t, built, creds{Uid: "1337 1337 1337 1337", Gid: "1337 1337 1337 1337", CapInh: pod.CapMask(),
				CapPrm: pod.CapMask(), CapEff: pod.CapMask(), CapBnd: pod.CapMask(), CapAmb: pod.CapMask(), NoNewPrivs: "1", Comm: "sidecar-supervi"})
			st := p.MustWaitPhase(t, scenarios.EventBound)
			if st.Phase != pod.Succeeded || st.Container("supervisor").ExitCode != 0 {
				t.Errorf("pod %s: the supervisor did not do its job", st)
			}
			if rec := scenarios.Record(built.PilotRecord); !slices.Contains(rec, "quitquitquit") {
				t.Errorf("pilot-agent record %q: no quitquitquit", rec)
			}
		})
		t.Run(b.Name+"/ptrace, root with SYS_PTRACE, SYS_PACCT and KILL only", func(t *testing.T) {
			built := b.MustBuild(t, scenarios.Desc{Name: "ptrace",
				Apps:            []scenarios.App{{Name: "app", Cued: true, Args: []string{"--exit", "3"}, UID: 1000}},
				SupervisorState: true, SupervisorAccounting: true,
				SupervisorEnv: patient("SUPERVISOR_APP_CONTAINERS=1", "SUPERVISOR_EXIT_STATUS=ptrace")})
			// As deploy/job-ptrace.yaml: runAsUser 0, drop ALL, add
			// SYS_PTRACE, SYS_PACCT and KILL, allowPrivilegeEscalation false.
			sup := scenarios.Container(&built.Spec, "supervisor")
			sup.UID, sup.GID = 0, 0
			sup.Caps = []int{unix.CAP_KILL, unix.CAP_SYS_PTRACE, unix.CAP_SYS_PACCT}
			sup.NoNewPrivs = true
			three := pod.CapMask(unix.CAP_KILL, unix.CAP_SYS_PTRACE, unix.CAP_SYS_PACCT)
			p := runWatched(t, built, creds{Uid: "0 0 0 0", Gid: "0 0 0 0", CapInh: pod.CapMask(), CapPrm: three, CapEff: three,
				CapBnd: three, CapAmb: pod.CapMask(), NoNewPrivs: "1", Comm: "sidecar-supervi"})
			st := ended(t, p, "istio-proxy")
			if len(scenarios.LogWhere(p, scenarios.Is(scenarios.AccountingOn))) != 1 {
				t.Errorf("process accounting is not on:\n%s", p.Logs("supervisor"))
			}
			exited := scenarios.LogWhere(p, scenarios.Is("app exited"))
			if len(exited) != 1 || exited[0].Str("exit_code") != "3" || exited[0].Str("method") != "ptrace" {
				t.Errorf("app exited: %v, want exit_code 3 read by ptrace", exited)
			}
			if c := st.Container("istio-proxy").ExitCode; c != 137 || st.Container("supervisor").ExitCode != 0 {
				t.Errorf("pod %s: want istio-proxy killed (137) on failure", st)
			}
		})
	}
}

// httpAction is a pod whose supervisor stops pilot-agent through the HTTP
// action (/quitquitquit on its status port) once the cued app has ended.
func httpAction(name string) scenarios.Desc {
	return scenarios.Desc{Name: name, Apps: []scenarios.App{{Name: "app", Cued: true, UID: 1000}},
		SupervisorEnv: patient("SUPERVISOR_APP_CONTAINERS=1", "SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15020/quitquitquit")}
}

// minSamples is how many samples of the supervisor checkSockets wants.
const minSamples = 20

// runWatched starts built's pod and samples its supervisor every 2ms: it
// checks the supervisor's credentials (want) and the sockets listening in
// the pod from its start, releases the cued app once the supervisor has
// found it and the sampler has taken minSamples samples, and once the
// supervisor has ended checks what it held (checkSockets).
func runWatched(t *testing.T, built scenarios.Built, want creds) *pod.Pod {
	t.Helper()
	p := scenarios.Start(t, built)
	pid := supervisorProc(t, p)
	s := watch(pid, 2*time.Millisecond)
	defer s.Stop()
	if got := credsOf(t, pid); got != want {
		t.Errorf("credentials\n got %+v\nwant %+v", got, want)
	}
	// The sidecar listens once it has started, which a loaded machine may
	// delay past the supervisor's start: wait for its socket (seen once in
	// a cold run, where it was read too early and found empty).
	var lis map[string]string
	var err error
	waitUntil(t, scenarios.EventBound, "a listening socket in the pod (the sidecar's)", func() bool {
		lis, err = listening(pid)
		return err == nil && len(lis) > 0
	})
	waitUntil(t, scenarios.EventBound, fmt.Sprintf("%d samples of the supervisor", minSamples), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.samples >= minSamples
	})
	releaseFound(t, p, built, "app")
	ended(t, p, "supervisor")
	s.Stop()
	checkSockets(t, s, lis)
	return p
}

// checkSockets asserts the sampler saw the supervisor often, that the pod's
// listening table was readable and not empty (the sidecar listens), and
// that none of the supervisor's sockets was ever a listening one.
func checkSockets(t *testing.T, s *sampler, podListening map[string]string) {
	t.Helper()
	if len(podListening) == 0 {
		t.Errorf("no listening socket in the pod's network namespace: the sidecar's should be there; the check would see nothing")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.samples < minSamples {
		t.Errorf("only %d samples of the supervisor's descriptors", s.samples)
	}
	for inode, what := range s.listens {
		t.Errorf("the supervisor held a listening socket: inode %s, %s", inode, what)
	}
	// The kernel hands out the lowest free number: a supervisor holding at
	// most 16 never gets one above that itself. A higher one was inherited
	// from the harness (a runtime passes 0, 1 and 2 only).
	for fd, what := range s.fdsAt {
		if fd > 16 {
			t.Errorf("the supervisor held descriptor %d (%s), which it did not open: inherited", fd, what)
		}
	}
	if s.maxFDs > 16 {
		t.Errorf("the supervisor held %d descriptors at once: %v", s.maxFDs, s.fdsAt)
	}
	t.Logf("%d samples: at most %d descriptors (%v), %d sockets seen, none listening; VmHWM %d kB",
		s.samples, s.maxFDs, describeFDs(s.fdsAt), len(s.sockets), s.hwmKB)
}

// describeFDs summarises what a process's descriptors are.
func describeFDs(fds map[int]string) string {
	kinds := map[string]int{}
	for _, target := range fds {
		k := target
		if i := strings.IndexAny(k, ":["); i > 0 {
			k = k[:i]
		}
		if strings.HasPrefix(k, "/") {
			k = filepath.Dir(k) + "/..."
		}
		kinds[k]++
	}
	var parts []string
	for k, n := range kinds {
		parts = append(parts, fmt.Sprintf("%s×%d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// pidfdExitInfo probes, by real calls, whether this kernel gives a
// non-parent the exit status through a pidfd (PIDFD_INFO_EXIT, 6.15+).
func pidfdExitInfo(t *testing.T) bool {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "exit 7")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	cmd.Wait()
	if err != nil {
		t.Fatalf("pidfd_open: %v", err)
	}
	defer unix.Close(fd)
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	if err := unix.IoctlPidfdInfo(fd, &info); err != nil || info.Mask&unix.PIDFD_INFO_EXIT == 0 {
		return false
	}
	return info.Exit_code == 7<<8
}

// TestHTTPActionNetwork runs the HTTP action under strace: the supervisor's
// only network use is TCP connections to the URL it was given (pilot-agent:
// /drain, then the quit, on its port); it never binds, listens or accepts.
func TestHTTPActionNetwork(t *testing.T) {
	b, _ := buildNamespaces(t, httpAction("http"))
	sup := scenarios.Container(&b.Spec, "supervisor")
	trace := filepath.Join(b.Dir, "supervisor.strace")
	sup.Argv = straceArgs(strace(t), trace, sup.Argv...)
	p := scenarios.Start(t, b)
	// The app ends once the supervisor, slowed down by strace, has found it.
	releaseFound(t, p, b, "app")
	if st := ended(t, p, "supervisor"); st.Container("supervisor").ExitCode != 0 {
		t.Fatalf("pod %s", st)
	}
	if rec := scenarios.Record(b.PilotRecord); !slices.Contains(rec, "quitquitquit") {
		t.Errorf("pilot-agent record %q: no quitquitquit", rec)
	}
	connects := 0
	for _, c := range parseStrace(t, trace) {
		switch c.name {
		case "socket":
			if !strings.HasPrefix(c.args, "AF_INET, SOCK_STREAM") {
				t.Errorf("socket(%s) = %s: want a TCP socket only", c.args, c.ret)
			}
		case "connect":
			if !strings.Contains(c.args, "sin_port=htons(15020)") || !strings.Contains(c.args, `inet_addr("127.0.0.1")`) {
				t.Errorf("connect(%s) = %s: not the action's URL", c.args, c.ret)
			}
			connects++
		case "bind", "listen", "accept", "accept4":
			t.Errorf("%s(%s) = %s: the supervisor serves nothing", c.name, c.args, c.ret)
		}
	}
	if connects == 0 {
		t.Error("no connect in the trace: the POST was not seen")
	}
}
