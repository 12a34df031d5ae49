// Command poller is the naive way to stop a sidecar once the application
// has exited, as tools did before pidfds (Argo's PNS executor polled every
// 50 ms): find the app's and the sidecar's main processes in /proc, then
// check every -interval whether the app's /proc/PID still exists, and once
// it does not, send the sidecar SIGTERM. It learns no exit status and
// trusts the PID not to be recycled. The benchmarks (e2e/bench) run it as a
// pod's last container to compare it with the supervisor; it is not a
// product.
//
//	poller -interval 50ms -app podsim -sidecar pilot-agent
//
// A main process is one whose parent is outside the pod's PID namespace
// (PPID 0), PID 1 (the pause process) excepted; -app and -sidecar are the
// names (comm) of the two.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	interval := flag.Duration("interval", 50*time.Millisecond, "how often to look")
	appName := flag.String("app", "podsim", "comm of the app container's main process")
	sidecarName := flag.String("sidecar", "pilot-agent", "comm of the sidecar's main process")
	flag.Parse()
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	var app, sidecar int
	for app == 0 || sidecar == 0 {
		app, sidecar = find(*appName), find(*sidecarName)
		if app == 0 || sidecar == 0 {
			<-tick.C
		}
	}
	fmt.Printf("watching app=%d sidecar=%d every %s\n", app, sidecar, *interval)
	for range tick.C {
		_, err := os.Stat("/proc/" + strconv.Itoa(app))
		if err == nil {
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "poller: %v\n", err)
			os.Exit(1)
		}
		if err := syscall.Kill(sidecar, syscall.SIGTERM); err != nil {
			fmt.Fprintf(os.Stderr, "poller: signal sidecar %d: %v\n", sidecar, err)
			os.Exit(1)
		}
		fmt.Printf("app %d gone: sidecar %d sent SIGTERM\n", app, sidecar)
		return
	}
}

// find returns the PID of the main process named comm, or 0.
func find(comm string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		fmt.Fprintf(os.Stderr, "poller: %v\n", err)
		os.Exit(1)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "PID (COMM) STATE PPID ...": the comm may hold spaces and parentheses.
		s := string(b)
		l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if l < 0 || r < l {
			continue
		}
		fields := strings.Fields(s[r+1:])
		if len(fields) < 2 || s[l+1:r] != comm || fields[1] != "0" {
			continue
		}
		return pid
	}
	return 0
}
