package scenarios

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

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
func BuildRunc(d Desc, tl pod.Tools, runc string) (Built, error) {
	dir, err := os.MkdirTemp("", "podsim-"+d.Name+"-")
	if err != nil {
		return Built{}, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return Built{}, err
	}
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		return Built{}, err
	}
	// Containers of several uids write records here.
	if err := os.Chmod(shared, 0o777); err != nil {
		return Built{}, err
	}
	sharedMount := []pod.Mount{{Host: shared, Container: SharedMount}}
	rootfs := func(name string) string { return filepath.Join(dir, "rootfs", name) }
	b := Built{Dir: dir, Shared: shared, Backend: pod.Runc{Path: runc, Podsim: tl.Podsim}}

	var apps []pod.Container
	for _, a := range d.Apps {
		if err := InstallTool(tl.Podsim, rootfs(a.Name), "bin/podsim"); err != nil {
			return Built{}, err
		}
		cue, err := b.appCues(a, shared, SharedMount)
		if err != nil {
			return Built{}, err
		}
		argv := append([]string{"/bin/podsim", "app", "--record", SharedMount + "/" + a.Name + ".record"}, cue...)
		apps = append(apps, pod.Container{
			Name: a.Name, Rootfs: rootfs(a.Name), Mounts: sharedMount, Argv: append(argv, a.Args...),
			UID: a.UID, GID: a.UID, Native: a.Native, Ephemeral: a.Ephemeral,
		})
	}

	var injected []pod.Container
	for _, s := range d.Sidecars {
		if err := vaultDir(shared, s); err != nil {
			return Built{}, err
		}
		c, err := sidecarContainer(s, tl, rootfs(s.name()), "", SharedMount)
		if err != nil {
			return Built{}, fmt.Errorf("sidecar %s: %w", s.name(), err)
		}
		c.Rootfs, c.ReadOnlyRootfs, c.Mounts = rootfs(s.name()), true, sharedMount
		if s.Injected {
			injected = append(injected, c)
		} else {
			apps = append(apps, c)
		}
	}

	var proxy *pod.Container
	switch d.Proxy {
	case StandIn:
		root := rootfs("istio-proxy")
		// Named pilot-agent, so that its comm is.
		if err := InstallTool(tl.PilotAgent, root, "usr/local/bin/pilot-agent"); err != nil {
			return Built{}, err
		}
		if err := InstallTool(tl.Podsim, root, "bin/podsim"); err != nil {
			return Built{}, err
		}
		b.PilotRecord = filepath.Join(shared, "pilot-agent.record")
		cue, err := b.proxyCues(d, shared, SharedMount)
		if err != nil {
			return Built{}, err
		}
		proxy = &pod.Container{
			Rootfs: root, ReadOnlyRootfs: true, Mounts: sharedMount,
			Argv: []string{"/usr/local/bin/pilot-agent", "proxy", "sidecar"},
			Env:  append(standInEnv(d, SharedMount+"/pilot-agent.record"), cue...),
			// podsim's stand-in has no `wait`: podsim does it.
			PostStart: []string{"/bin/podsim", "wait-http", "http://127.0.0.1:15021/healthz/ready", "60s"},
		}
	case RealPilot:
		px, err := prepareRealPilot(d, rootfs("istio-proxy"))
		if err != nil {
			return Built{}, err
		}
		b.Proxy = px
		proxy = &pod.Container{Rootfs: px.Root, ReadOnlyRootfs: true, Argv: px.Argv, Env: px.Env, UID: px.UID, GID: px.GID,
			PostStart: realPilotWait}
		for _, w := range px.Writable {
			proxy.Mounts = append(proxy.Mounts, pod.Mount{Host: px.Path(w), Container: "/" + w})
		}
	}

	var supervisor *pod.Container
	if !d.NoSupervisor {
		im, err := supervisorImage()
		if err != nil {
			return Built{}, fmt.Errorf("the supervisor image (e2e/%s): %w", ImageScript, err)
		}
		if err := im.Unpack(rootfs("supervisor")); err != nil {
			return Built{}, fmt.Errorf("unpack %s: %w", im.Archive, err)
		}
		uid, gid, err := im.User()
		if err != nil {
			return Built{}, err
		}
		supervisor = &pod.Container{
			Rootfs: rootfs("supervisor"), ReadOnlyRootfs: true, Argv: im.Argv(), Dir: im.Config.WorkingDir,
			Env: append(append([]string{}, im.Config.Env...), supervisorEnv(d)...), UID: uid, GID: gid,
			// The kubelet's default terminationMessagePath, the supervisor's
			// default SUPERVISOR_TERMINATION_MESSAGE_PATH.
			TerminationMessage: "/dev/termination-log",
		}
		if err := supervisorState(d, dir, supervisor, uid, stateMount); err != nil {
			return Built{}, err
		}
	}
	b.Spec = assemble(d, dir, apps, proxy, supervisor, injected)
	return b, nil
}

// InstallTool puts a static binary at rel under root: a hard link when the
// two are on one filesystem, else a copy.
func InstallTool(src, root, rel string) error {
	dst := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
