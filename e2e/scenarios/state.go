package scenarios

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// stateMount is where the runc backend mounts the supervisor's state
// directory, as the injection template does its emptyDir.
const stateMount = "/var/run/sidecar-supervisor-state"

// supervisorState gives the supervisor its state directory where d asks:
// a directory of the pod's, owned by uid, mounted at inContainer ("": the
// host's path, for the namespaces backend), kept across its restarts.
// SUPERVISOR_STATE_DIR in d.SupervisorEnv says where the supervisor is
// told it is instead.
func supervisorState(d Desc, dir string, supervisor *pod.Container, uid int, inContainer string) error {
	if !d.SupervisorState && !d.SupervisorNative && !d.SupervisorFirst {
		return nil
	}
	host := filepath.Join(dir, "supervisor-state")
	if err := os.Mkdir(host, 0o700); err != nil {
		return err
	}
	if err := os.Chown(host, uid, uid); err != nil {
		return err
	}
	path := host
	if inContainer != "" {
		path = inContainer
		supervisor.Mounts = append(supervisor.Mounts, pod.Mount{Host: host, Container: inContainer})
	}
	if !slices.ContainsFunc(d.SupervisorEnv, func(kv string) bool { return strings.HasPrefix(kv, "SUPERVISOR_STATE_DIR=") }) {
		supervisor.Env = append(supervisor.Env, "SUPERVISOR_STATE_DIR="+path)
	}
	if d.SupervisorNative {
		supervisor.Env = append(supervisor.Env, "SUPERVISOR_SHAPE=native")
	}
	return nil
}
