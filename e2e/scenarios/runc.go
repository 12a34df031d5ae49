package scenarios

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// SharedMount is where the runc containers see the pod's shared directory
// (Built.Dir/shared), which holds the apps' and the stand-in's records, as
// an emptyDir volume would.
const SharedMount = "/var/run/podsim"

// BuildRunc builds d for the runc backend (runc is its binary, see
// pod.FindRunc). Each container gets its own root filesystem under
// Built.Dir/rootfs:
//
//   - an app: podsim alone, at /bin/podsim;
//   - istio-proxy: the stand-in (podsim as /usr/local/bin/pilot-agent, and
//     /bin/podsim for the readiness hook), or the real pilot-agent's tree
//     from istioproxy.Prepare with its writable directories bind-mounted
//     over a read-only root, as emptyDir volumes are;
//   - the supervisor: the image e2e/scripts/build-image.sh builds from the
//     Dockerfile, unpacked layer by layer, run as its USER with its
//     ENTRYPOINT and ENV, read-only, with /dev/termination-log mounted.
func BuildRunc(d Desc, tl pod.Tools, runc string) (Built, error) { return build(d, tl, runc) }

// supervisor is the supervisor's container: on the runc backend the image
// unpacked, on the namespaces backend the binary of pod.Tools, as the
// image's USER and with its ENTRYPOINT and ENV on the one, as uid 1337 on
// the other, with its state directory where d asks (supervisorState).
func (b Built) supervisor(d Desc, tl pod.Tools) (*pod.Container, error) {
	var c pod.Container
	inContainer := "" // the namespaces backend: the host's path
	if _, ok := b.Backend.(pod.Runc); !ok {
		msg := filepath.Join(b.Dir, "supervisor.termination-log")
		c = pod.Container{Argv: []string{tl.Supervisor},
			Env: append([]string{"SUPERVISOR_TERMINATION_MESSAGE_PATH=" + msg}, supervisorEnv(d)...),
			UID: ProxyUID, GID: ProxyUID, TerminationMessage: msg}
	} else {
		var err error
		if c, err = b.imageContainer("supervisor"); err != nil {
			return nil, err
		}
		c.Env = append(c.Env, supervisorEnv(d)...)
		// The kubelet's default terminationMessagePath, the supervisor's
		// default SUPERVISOR_TERMINATION_MESSAGE_PATH.
		c.TerminationMessage = "/dev/termination-log"
		inContainer = stateMount
	}
	if d.SupervisorAccounting {
		c.UID, c.GID = 0, 0 // its capabilities: assemble
	}
	return &c, supervisorState(d, b.Dir, &c, c.UID, inContainer)
}

// imageContainer is the container name running the supervisor image as
// the image says (ENTRYPOINT and CMD, ENV, WORKDIR, USER), unpacked into
// its own read-only root filesystem.
func (b Built) imageContainer(name string) (pod.Container, error) {
	im, err := supervisorImage()
	if err != nil {
		return pod.Container{}, fmt.Errorf("the supervisor image (e2e/%s): %w", ImageScript, err)
	}
	root := b.rootfs(name)
	if err := im.Unpack(root); err != nil {
		return pod.Container{}, fmt.Errorf("unpack %s: %w", im.Archive, err)
	}
	uid, gid, err := im.User()
	return pod.Container{Name: name, Rootfs: root, ReadOnlyRootfs: true, Argv: im.Argv(), Dir: im.Config.WorkingDir,
		Env: append([]string{}, im.Config.Env...), UID: uid, GID: gid}, err
}

// InstallTool puts a static binary at rel under root
// (istioproxy.InstallBinary: a hard link when the two are on one
// filesystem, else a copy).
func InstallTool(src, root, rel string) error {
	dst := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	return istioproxy.InstallBinary(src, dst)
}
