package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// killed is what became of a timeline's kill (killPlan).
type killed struct {
	pod     string    // the pod whose supervisor it was for
	planned time.Time // the moment drawn
	at      time.Time // when SIGKILL was sent; zero if it was not
	pid     int       // the supervisor's main process, as the node sees it
	id      string    // its container
	err     error     // why it was not sent
}

func (k *killed) sent() bool { return k != nil && !k.at.IsZero() }

// The stamps are polled this often while waiting for an instance's start,
// and this often around the end a kill during the stop follows.
const (
	stampPoll     = 20 * time.Millisecond
	stampPollFast = time.Millisecond
)

// killSupervisor carries out t.kill: it waits for the app instance the
// moment is relative to (or, for the stop, the pod's last app end), finds
// the supervisor of that pod from the node (crictl, then a pidfd on its
// process) and SIGKILLs it at the moment drawn, as an OOM kill or a node's
// kill would. ctx ends with the Job: a moment not reached by then is not
// carried out.
func (s *soak) killSupervisor(ctx context.Context, t timeline, dir string) killed {
	k := *t.kill
	w := t.want.pods[k.pod]
	var res killed
	var in instance
	err := pollStamps(ctx, dir, t, stampPoll, func(inst map[string][]instance) bool {
		x := find(inst[k.app], k.n)
		if x != nil {
			in = *x
		}
		return x != nil
	})
	if err != nil {
		res.err = fmt.Errorf("%s #%d never started: %w", k.app, k.n, err)
		return res
	}
	res.pod = in.pod
	var fd int
	// containerd may be restarting.
	if err := retry(ctx, func() (err error) { fd, err = s.supervisorProcess(ctx, &res); return err }); err != nil {
		res.err = fmt.Errorf("find the supervisor: %w", err)
		return res
	}
	defer unix.Close(fd)

	d := t.apps[slices.IndexFunc(t.apps, func(a appPlan) bool { return a.name == k.app })].at(k.n).d
	switch k.moment {
	case killRun:
		res.planned = in.start.Add(time.Duration(k.frac * float64(d)))
	case killExit:
		res.planned = in.start.Add(d + k.off)
		if res.planned.Before(in.start) {
			res.planned = in.start
		}
	case killStop:
		// The pod's apps' last instances: once each has started, its end
		// is near its start plus its run; the stamps are read every
		// millisecond from shortly before the first of those ends.
		var soonest time.Time
		err := pollStamps(ctx, dir, t, stampPoll, func(inst map[string][]instance) bool {
			soonest = time.Time{}
			for _, a := range t.apps {
				x := find(inst[a.name], w.last[a.name])
				if x == nil {
					return false
				}
				if e := x.start.Add(a.at(x.n).d); soonest.IsZero() || e.Before(soonest) {
					soonest = e
				}
			}
			return true
		})
		if err == nil {
			err = sleepUntil(ctx, soonest.Add(-20*time.Millisecond))
		}
		var last time.Time
		if err == nil {
			err = pollStamps(ctx, dir, t, stampPollFast, func(inst map[string][]instance) bool {
				last = time.Time{}
				for _, a := range t.apps {
					x := find(inst[a.name], w.last[a.name])
					if x == nil || x.end.IsZero() {
						return false
					}
					if x.end.After(last) {
						last = x.end
					}
				}
				return true
			})
		}
		if err != nil {
			res.err = fmt.Errorf("the pod's apps did not all end: %w", err)
			return res
		}
		res.planned = last.Add(k.off)
	}
	if err := sleepUntil(ctx, res.planned); err != nil {
		res.err = fmt.Errorf("the Job ended before the moment: %w", err)
		return res
	}
	err = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	if err != nil {
		// ESRCH: it had exited (a container supervisor is done once it
		// has stopped the sidecars).
		res.err = fmt.Errorf("pidfd_send_signal to pid %d: %w", res.pid, err)
		return res
	}
	res.at = time.Now()
	logf("%s: supervisor of pod %s (pid %d) SIGKILLed, %s after the moment drawn", t.name(), res.pod, res.pid,
		res.at.Sub(res.planned).Round(time.Millisecond))
	return res
}

func find(list []instance, n int) *instance {
	for i := range list {
		if list[i].n == n {
			return &list[i]
		}
	}
	return nil
}

// pollStamps reads the Job's stamps every interval until cond holds or ctx
// ends.
func pollStamps(ctx context.Context, dir string, t timeline, interval time.Duration, cond func(map[string][]instance) bool) error {
	return wait.PollUntilContextCancel(ctx, interval, true, func(context.Context) (bool, error) {
		inst, err := readStamps(dir, t.apps)
		return err == nil && cond(inst), nil
	})
}

func sleepUntil(ctx context.Context, at time.Time) error {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// supervisorComm is the supervisor's /proc comm: its binary's name, cut
// to 15 bytes.
const supervisorComm = "sidecar-supervi"

// supervisorProcess finds the running supervisor of pod res.pod in the
// runtime (its container, then its main process) and opens a pidfd on it,
// so that the SIGKILL reaches that process and no other.
func (s *soak) supervisorProcess(ctx context.Context, res *killed) (int, error) {
	out, err := s.crictl(ctx, "ps", "-q", "--state", "running", "--name", "^"+supervisorName+"$",
		"--label", "io.kubernetes.pod.namespace="+s.ns, "--label", "io.kubernetes.pod.name="+res.pod)
	if err != nil {
		return -1, err
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return -1, fmt.Errorf("pod %s: %d running supervisor containers (%s), want 1", res.pod, len(ids), strings.Join(ids, " "))
	}
	res.id = ids[0]
	out, err = s.crictl(ctx, "inspect", res.id)
	if err != nil {
		return -1, err
	}
	var info struct {
		Info struct {
			Pid int `json:"pid"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Info.Pid <= 0 {
		return -1, fmt.Errorf("crictl inspect %s: no pid (%v)", res.id, err)
	}
	res.pid = info.Info.Pid
	fd, err := unix.PidfdOpen(res.pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", res.pid, err)
	}
	// Read after the pidfd is open: a PID reused since crictl looked would
	// show another name.
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(res.pid) + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != supervisorComm {
		unix.Close(fd)
		return -1, fmt.Errorf("pid %d of container %s is %q (%v), not the supervisor", res.pid, res.id, bytes.TrimSpace(comm), err)
	}
	return fd, nil
}
