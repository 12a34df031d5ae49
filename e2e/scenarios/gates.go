package scenarios

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// Ways for tests to order a pod's containers by events (pod.Container.
// StartAfter), and to count the supervisor's reads of /proc.

// Container returns the named container of spec, or nil.
func Container(spec *pod.Spec, name string) *pod.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// StartLast moves the named container to the end of spec, after the
// supervisor, held back by after (pod.Container.StartAfter): a container
// the supervisor does not find at its start.
func StartLast(spec *pod.Spec, name string, after func(context.Context, *pod.Pod) error) {
	c := *Container(spec, name)
	spec.Containers = slices.DeleteFunc(spec.Containers, func(x pod.Container) bool { return x.Name == name })
	c.StartAfter = after
	spec.Containers = append(spec.Containers, c)
}

// Gate is a pod.Container.StartAfter that returns once open is closed.
func Gate(open <-chan struct{}) func(context.Context, *pod.Pod) error {
	return func(ctx context.Context, _ *pod.Pod) error {
		select {
		case <-open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Syscr is how many read system calls process pid has made (/proc/PID/io):
// while it waits, the supervisor reads only /proc, so this counts its scans.
func Syscr(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/io: no syscr line", pid)
}
