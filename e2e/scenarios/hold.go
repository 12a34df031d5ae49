package scenarios

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// HoldMount is where the install init container and istio-proxy see the
// emptyDir that carries the binary, as deploy/deployment.yaml mounts it.
const HoldMount = "/var/run/sidecar-supervisor"

// WithHold turns a built pod into a long-running one (restartPolicy Always)
// with the hold, as the injection template makes it: an init container
// `sidecar-supervisor install` fills a shared directory (an emptyDir) with
// the binary, and istio-proxy's preStop hook runs `sidecar-supervisor hold`
// from it, with SUPERVISOR_HOLD_TIMEOUT in istio-proxy's environment. Build
// the pod with NoSupervisor: such pods have no supervisor container.
func WithHold(b Built, tl pod.Tools, timeout time.Duration) (Built, error) {
	bin := filepath.Join(b.Dir, "supervisor-bin")
	if err := os.Mkdir(bin, 0o777); err != nil {
		return b, err
	}
	// The init container runs as 1337 and writes here.
	if err := os.Chmod(bin, 0o777); err != nil {
		return b, err
	}
	install := pod.Container{Name: "sidecar-supervisor-install", UID: ProxyUID, GID: ProxyUID, NoNewPrivs: true, Caps: []int{}}
	hook := []string{filepath.Join(HoldMount, "sidecar-supervisor"), "hold"}
	switch be := b.Backend.(type) {
	case pod.Namespaces:
		// Over the host's filesystem: the shared directory is seen where
		// it is.
		install.Argv = []string{tl.Supervisor, "install", bin}
		hook[0] = filepath.Join(bin, "sidecar-supervisor")
	case pod.Runc:
		c, err := b.imageContainer(install.Name)
		if err != nil {
			return b, err
		}
		install.Rootfs, install.ReadOnlyRootfs, install.UID, install.GID = c.Rootfs, true, c.UID, c.GID
		install.Argv, install.Env = append(c.Argv, "install", HoldMount), c.Env
		install.Mounts = []pod.Mount{{Host: bin, Container: HoldMount}}
	default:
		return b, fmt.Errorf("no hold for the %s backend", be.Name())
	}
	b.Spec.InitContainers = append(b.Spec.InitContainers, install)
	b.Spec.RestartPolicy = pod.Always
	found := false
	for i := range b.Spec.Containers {
		c := &b.Spec.Containers[i]
		if c.Name != "istio-proxy" {
			continue
		}
		found = true
		c.PreStop = hook
		c.Env = append(c.Env, "SUPERVISOR_HOLD_TIMEOUT="+timeout.String())
		if _, ok := b.Backend.(pod.Runc); ok {
			c.Mounts = append(c.Mounts, pod.Mount{Host: bin, Container: HoldMount, ReadOnly: true})
		}
	}
	if !found {
		return b, fmt.Errorf("no istio-proxy container to hold")
	}
	return b, nil
}

// appRecord is where app name's record lands on the host.
func appRecord(b Built, name string) string { return filepath.Join(b.Shared, name+".record") }
