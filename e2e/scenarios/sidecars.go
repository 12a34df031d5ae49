package scenarios

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scripts"
)

// Sidecar is a sidecar container other than istio-proxy: the real
// cloud-sql-proxy, or one of podsim's stand-ins for a program that cannot be
// built here (cmd/podsim/sidecars.go). It is placed after the apps where a
// user writes it by hand, or after the supervisor where its injector
// appends it (Injected).
type Sidecar struct {
	// Name is the container's name; default the program's.
	Name string
	// Program is one of the Programs.
	Program string
	// Args are the program's arguments (after its path). For Vault, the
	// agent's configuration is VaultConfig instead.
	Args []string
	// Env is added to the program's environment.
	Env []string
	// UID runs it as this user instead of its image's (runAsUser).
	UID int
	// Injected: its injector adds it, after the pod's own containers and so
	// after the supervisor (Dapr, Vault, Consul, Linkerd); else it is
	// written by hand before the supervisor (cloud-sql-proxy). An injected
	// one starts once the supervisor has found the apps (appsFound).
	Injected bool
	// VaultConfig is the agent's JSON configuration, which vault-k8s passes
	// base64-encoded in $VAULT_CONFIG for the container's shell to decode.
	VaultConfig string
}

// The programs a Sidecar can run.
const (
	// CloudSQLProxy is Google's real cloud-sql-proxy v2 (scripts/build-sidecars.sh).
	CloudSQLProxy = "cloud-sql-proxy"
	// The stand-ins, podsim under each program's name.
	Daprd           = "daprd"
	LinkerdProxy    = "linkerd2-proxy"
	ConsulDataplane = "consul-dataplane"
	VaultAgent      = "vault"
	OtelcolContrib  = "otelcol-contrib"
	FluentBit       = "fluent-bit"
)

// sidecarImage is where each program sits in its image, the user it runs as
// there, and how its container starts it.
type sidecarImage struct {
	// path of the program in the image.
	path string
	uid  int
	// wrap prefixes the command: consul-dataplane's image starts it under
	// dumb-init (its ENTRYPOINT); vault-k8s starts the agent through the
	// image's shell.
	wrap string
}

var sidecarImages = map[string]sidecarImage{
	// gcr.io/cloud-sql-connectors/cloud-sql-proxy: distroless nonroot.
	CloudSQLProxy: {path: "/cloud-sql-proxy", uid: 65532},
	// daprio/daprd: the injector's command is /daprd; distroless nonroot.
	Daprd: {path: "/daprd", uid: 65532},
	// cr.l5d.io/linkerd/proxy: the identity wrapper execs this path;
	// the injector runs the proxy as uid 2102.
	LinkerdProxy: {path: "/usr/lib/linkerd/linkerd2-proxy", uid: 2102},
	// hashicorp/consul-dataplane: ENTRYPOINT [dumb-init, consul-dataplane];
	// consul-k8s sets only args and runs it as 5995.
	ConsulDataplane: {path: "/usr/local/bin/consul-dataplane", uid: 5995, wrap: "dumb-init"},
	// hashicorp/vault (Alpine): vault-k8s runs /bin/sh -ec '... && vault
	// agent -config=...' as uid 100; busybox's sh execs vault.
	VaultAgent: {path: "/bin/vault", uid: 100, wrap: "sh"},
	// otel/opentelemetry-collector-contrib: uid 10001.
	OtelcolContrib: {path: "/otelcol-contrib", uid: 10001},
	// fluent/fluent-bit (distroless).
	FluentBit: {path: "/fluent-bit/bin/fluent-bit", uid: 1000},
}

// appsFound holds an injected sidecar's start back (pod.Container.StartAfter)
// until the supervisor has logged "app found" for each of apps, as a kubelet
// starting the next container takes hundreds of milliseconds to. Without it
// the supervisor's first scan may catch the Vault agent's container while
// its shell has not exec'd vault yet, take that shell for an app, and wait
// for it forever (today's supervisor classifies a container once, by its
// main process's name at that moment, where names cannot be read).
func appsFound(apps []string) func(context.Context, *pod.Pod) error {
	return func(ctx context.Context, p *pod.Pod) error {
		return p.Await(ctx, func() bool {
			found := map[string]bool{}
			for _, l := range ParseLog(p.Logs("supervisor")) {
				if l.Msg() == "app found" {
					found[l.Str("container")] = true
				}
			}
			for _, a := range apps {
				if !found[a] {
					return false
				}
			}
			return true
		})
	}
}

// vaultShell is vault-k8s's container argument (agent-inject's
// DefaultContainerArg), with the configuration's directory as %s.
const vaultShell = `echo ${VAULT_CONFIG?} | base64 -d > %[1]s/config.json && vault agent -config=%[1]s/config.json`

// etcHosts is the kubelet's /etc/hosts, less the pod's own address.
const etcHosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

// DumbInitPath is Debian's dumb-init, the same program consul-dataplane's
// image runs as its container's main process (e2e/scripts/install-deps.sh).
const DumbInitPath = "/usr/bin/dumb-init"

// BusyboxPath is Debian's static busybox, whose sh is the Alpine-based
// Vault image's /bin/sh.
const BusyboxPath = "/bin/busybox"

// sidecarTools builds the real sidecars once per process (cached across
// runs by build-sidecars.sh).
var sidecarTools = sync.OnceValues(func() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var csp string
	if err := scripts.Run(ctx, filepath.Base(SidecarsScript), map[string]*string{"CLOUD_SQL_PROXY": &csp}); err != nil {
		return nil, err
	}
	return map[string]string{CloudSQLProxy: csp}, nil
})

// SidecarsScript builds the real sidecars, relative to the e2e module.
const SidecarsScript = "scripts/build-sidecars.sh"

// binary is the host file that runs as program: the real one, or podsim.
func (s Sidecar) binary(tl pod.Tools) (string, error) {
	if s.Program == CloudSQLProxy {
		tools, err := sidecarTools()
		if err != nil {
			return "", err
		}
		return tools[CloudSQLProxy], nil
	}
	if _, ok := sidecarImages[s.Program]; !ok {
		return "", fmt.Errorf("unknown sidecar program %q", s.Program)
	}
	return tl.Podsim, nil
}

// name is the container's name.
func (s Sidecar) name() string {
	if s.Name != "" {
		return s.Name
	}
	return s.Program
}

// RecordFile is where a stand-in's record goes, relative to the pod's
// shared directory.
func (s Sidecar) RecordFile() string { return s.name() + ".record" }

// sidecarContainer lays sidecar s out: the program under root at its image
// path (root is "" for the namespaces backend, which runs over the host's
// filesystem: the program then goes into bin, named as in its image), and
// returns its container. shared is the pod's shared directory as the
// container sees it.
func sidecarContainer(s Sidecar, tl pod.Tools, root, bin, shared string) (pod.Container, error) {
	img := sidecarImages[s.Program]
	src, err := s.binary(tl)
	if err != nil {
		return pod.Container{}, err
	}
	// Where the program is, as the container sees it, and the host's copy.
	path := img.path
	var dumbInit, sh string
	if root == "" {
		path = filepath.Join(bin, filepath.Base(img.path))
		if err := InstallTool(src, bin, filepath.Base(img.path)); err != nil {
			return pod.Container{}, err
		}
		dumbInit, sh = DumbInitPath, BusyboxPath
	} else {
		if err := InstallTool(src, root, strings.TrimPrefix(img.path, "/")); err != nil {
			return pod.Container{}, err
		}
		// The kubelet mounts one into every container; cloud-sql-proxy
		// resolves "localhost" for its admin server with it.
		if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
			return pod.Container{}, err
		}
		if err := os.WriteFile(filepath.Join(root, "etc", "hosts"), []byte(etcHosts), 0o644); err != nil {
			return pod.Container{}, err
		}
		switch img.wrap {
		case "dumb-init":
			// Debian's is linked to glibc, which consul-dataplane's
			// distroless/base image has too.
			dumbInit = "/usr/local/bin/dumb-init"
			err = installWithLibs(DumbInitPath, root, strings.TrimPrefix(dumbInit, "/"))
		case "sh":
			sh = "/bin/sh"
			err = InstallTool(BusyboxPath, root, "bin/sh")
		}
		if err != nil {
			return pod.Container{}, err
		}
	}
	uid := img.uid
	if s.UID != 0 {
		uid = s.UID
	}
	c := pod.Container{Name: s.name(), UID: uid, GID: uid, NoNewPrivs: true, Caps: []int{}}
	env := append([]string{"STANDIN_RECORD=" + shared + "/" + s.RecordFile()}, s.Env...)
	switch img.wrap {
	case "dumb-init":
		c.Argv = append([]string{dumbInit, path}, s.Args...)
	case "sh":
		// busybox finds its applets (base64) and vault by PATH.
		dir := shared + "/" + s.name()
		c.Argv = []string{sh, "-ec", fmt.Sprintf(vaultShell, dir)}
		if root == "" {
			// The host's busybox runs as sh by its first argument.
			c.Argv = append([]string{sh, "sh"}, c.Argv[1:]...)
		}
		env = append(env, "PATH="+filepath.Dir(path)+":/bin:/usr/bin",
			"VAULT_CONFIG="+base64.StdEncoding.EncodeToString([]byte(s.VaultConfig)))
	default:
		c.Argv = append([]string{path}, s.Args...)
	}
	if s.Program != CloudSQLProxy {
		// podsim takes its mode from this, whatever its file is called.
		env = append(env, "PODSIM_MODE="+s.Program)
	}
	c.Env = env
	return c, nil
}

// vaultDir makes the directory the Vault shell writes its configuration
// to (an emptyDir in vault-k8s's pod, /home/vault) in the shared directory.
func vaultDir(hostShared string, s Sidecar) error {
	if sidecarImages[s.Program].wrap != "sh" {
		return nil
	}
	d := filepath.Join(hostShared, s.name())
	if err := os.MkdirAll(d, 0o777); err != nil {
		return err
	}
	return os.Chmod(d, 0o777)
}

// installWithLibs installs a dynamically linked program at rel under root
// with the shared libraries ldd lists for it, at their own paths.
func installWithLibs(src, root, rel string) error {
	if err := InstallTool(src, root, rel); err != nil {
		return err
	}
	out, err := exec.Command("ldd", src).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", src, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		for i, f := range fields {
			// "libc.so.6 => /lib/.../libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
			if strings.HasPrefix(f, "/") && (i == 0 || fields[i-1] == "=>") {
				// The file itself where ldd names a symlink (/lib64/ld-linux...).
				real, err := filepath.EvalSymlinks(f)
				if err != nil {
					return err
				}
				if err := InstallTool(real, root, strings.TrimPrefix(f, "/")); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
