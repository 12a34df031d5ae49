package istioproxy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/istioproxy/record"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/selfsigned"
)

// Ports of an Istio sidecar, fixed by Istio's defaults and bootstrap.
const (
	// AdminPort is envoy's admin API, on 127.0.0.1 only.
	AdminPort = 15000
	// StatusPort is pilot-agent's status server: /healthz/ready, POST /quitquitquit, POST /drain.
	StatusPort = 15020
	// HealthPort is envoy's listener that forwards /healthz/ready to StatusPort;
	// Istio's injected readinessProbe points here.
	HealthPort = 15021
	// PrometheusPort is envoy's listener for /stats/prometheus.
	PrometheusPort = 15090
)

// ProxyUID and ProxyGID are the uid and gid Istio's injector runs istio-proxy as.
const (
	ProxyUID = 1337
	ProxyGID = 1337
)

// DefaultTerminationDrainDuration is Istio's default terminationDrainDuration:
// how long pilot-agent lets envoy drain after SIGTERM before killing it.
const DefaultTerminationDrainDuration = 5 * time.Second

// Paths inside the tree, relative to its root (pilot-agent's working directory).
const (
	PilotAgentPath        = "usr/local/bin/pilot-agent"
	EnvoyPath             = "usr/local/bin/envoy"
	BootstrapTemplatePath = "var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
	RootCertPath          = "var/run/secrets/istio/root-cert.pem"
	ConfigDir             = "etc/istio/proxy"
	// RecordPath is where the stand-in envoy appends its record.
	RecordPath = "var/lib/istio/data/envoy-standin.jsonl"
)

// writableDirs are the directories pilot-agent and envoy write to; in a real
// pod each is an emptyDir volume (istio-envoy, workload-socket,
// credential-socket, workload-certs, istio-data).
var writableDirs = []string{
	ConfigDir,
	"var/run/secrets/workload-spiffe-uds",
	"var/run/secrets/credential-uds",
	"var/run/secrets/workload-spiffe-credentials",
	"var/lib/istio/data",
}

// readOnlyDirs exist in a real pod as read-only mounts (istio-token,
// istio-podinfo, istiod-ca-cert) or image directories.
var readOnlyDirs = []string{
	"var/run/secrets/tokens",
	"var/run/secrets/istio",
	"var/lib/istio/envoy",
	"etc/istio/pod",
	"usr/local/bin",
}

// Config describes the istio-proxy container to lay out. The zero value is
// usable once Tools is set.
type Config struct {
	// Tools are the binaries and template to install (see BuildTools).
	Tools Tools
	// PodName is POD_NAME; default "job".
	PodName string
	// PodNamespace is POD_NAMESPACE; default "default".
	PodNamespace string
	// InstanceIP is INSTANCE_IP, the pod IP; default "127.0.0.1" (a test
	// network namespace may have nothing but loopback).
	InstanceIP string
	// ServiceAccount is SERVICE_ACCOUNT; default "default".
	ServiceAccount string
	// AppContainers become ISTIO_META_APP_CONTAINERS; default ["app"].
	AppContainers []string
	// TerminationDrainDuration is ProxyConfig.terminationDrainDuration:
	// after SIGTERM pilot-agent drains envoy, waits this long, then kills
	// it. Zero means DefaultTerminationDrainDuration (Istio's 5s).
	// pilot-agent accepts whole milliseconds at least.
	TerminationDrainDuration time.Duration
	// DiscoveryAddress is ProxyConfig.discoveryAddress and CA_ADDR; default
	// "localhost:15012", where nothing listens (see the package doc).
	DiscoveryAddress string
	// AgentLogLevel is pilot-agent's --log_output_level; default "default:info".
	AgentLogLevel string
	// RunAsRoot runs the container as root instead of ProxyUID/ProxyGID.
	RunAsRoot bool
	// EnvoyReadyDelay makes the stand-in report "not ready" for this long after it starts.
	EnvoyReadyDelay time.Duration
	// Env is appended to the generated environment; later entries win.
	Env []string
}

// Proxy is a laid-out istio-proxy container.
type Proxy struct {
	// Root is the host path of the tree: the working directory (plain
	// namespaces) or the rootfs (runc).
	Root string
	// Argv runs pilot-agent: "./usr/local/bin/pilot-agent proxy sidecar ...".
	// Its paths are relative: run it with the working directory at Root.
	Argv []string
	// Env is the complete environment (nothing from the test process leaks in).
	Env []string
	// UID and GID to run as (ProxyUID/ProxyGID unless Config.RunAsRoot).
	UID, GID int
	// Writable lists the directories (relative to Root) that the container
	// must be able to write; they are owned by UID:GID. A backend that
	// makes the rest read-only must keep these writable and visible on the
	// host (bind mounts, not a tmpfs: the record lives in one of them).
	Writable []string
	// TerminationDrainDuration is the effective drain duration.
	TerminationDrainDuration time.Duration
}

func (c Config) withDefaults() Config {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.PodName, "job")
	def(&c.PodNamespace, "default")
	def(&c.InstanceIP, "127.0.0.1")
	def(&c.ServiceAccount, "default")
	def(&c.DiscoveryAddress, "localhost:15012")
	def(&c.AgentLogLevel, "default:info")
	if len(c.AppContainers) == 0 {
		c.AppContainers = []string{"app"}
	}
	c.TerminationDrainDuration = cmp.Or(c.TerminationDrainDuration, DefaultTerminationDrainDuration)
	return c
}

// Prepare lays out the container tree under root (created if missing; it
// may already hold other things, e.g. a rootfs the harness built) and
// returns how to run pilot-agent in it. It must run as root unless
// Config.RunAsRoot is set, since it hands the writable directories to 1337.
func Prepare(root string, cfg Config) (*Proxy, error) {
	cfg = cfg.withDefaults()
	if cfg.Tools.PilotAgent == "" || cfg.Tools.Envoy == "" || cfg.Tools.BootstrapTemplate == "" {
		return nil, errors.New("istioproxy: Config.Tools is incomplete (use BuildTools)")
	}
	if cfg.TerminationDrainDuration < 0 {
		return nil, fmt.Errorf("istioproxy: negative TerminationDrainDuration %v", cfg.TerminationDrainDuration)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	p := &Proxy{Root: root, UID: ProxyUID, GID: ProxyGID, TerminationDrainDuration: cfg.TerminationDrainDuration}
	if cfg.RunAsRoot {
		p.UID, p.GID = 0, 0
	}
	p.Writable = append([]string(nil), writableDirs...)

	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	// The root itself must be searchable by the proxy user (MkdirTemp makes 0700).
	if err := os.Chmod(root, 0o755); err != nil {
		return nil, err
	}
	for _, d := range readOnlyDirs {
		if err := os.MkdirAll(p.Path(d), 0o755); err != nil {
			return nil, err
		}
	}
	for _, d := range writableDirs {
		if err := os.MkdirAll(p.Path(d), 0o755); err != nil {
			return nil, err
		}
		// 0750 like pilot-agent's own MkdirAll of these; owned by the proxy user.
		if err := os.Chmod(p.Path(d), 0o750); err != nil {
			return nil, err
		}
		if err := os.Lchown(p.Path(d), p.UID, p.GID); err != nil {
			return nil, err
		}
	}
	if err := InstallBinary(cfg.Tools.PilotAgent, p.Path(PilotAgentPath)); err != nil {
		return nil, err
	}
	if err := InstallBinary(cfg.Tools.Envoy, p.Path(EnvoyPath)); err != nil {
		return nil, err
	}
	if err := copyFile(cfg.Tools.BootstrapTemplate, p.Path(BootstrapTemplatePath), 0o644); err != nil {
		return nil, err
	}
	// pilot-agent only checks that its root exists (and watches it) before
	// it dials the CA, which it never reaches here.
	certPEM, err := selfsigned.PEM("sidecar-supervisor e2e root", nil)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.Path(RootCertPath), certPEM, 0o644); err != nil {
		return nil, err
	}
	// Downward API files as the injector mounts them (key="value" lines);
	// pilot-agent reads annotations for overrides and labels for metadata.
	labels := fmt.Sprintf("security.istio.io/tlsMode=%q\nservice.istio.io/canonical-name=%q\n", "istio", cfg.PodName)
	if err := os.WriteFile(p.Path("etc/istio/pod/labels"), []byte(labels), 0o644); err != nil {
		return nil, err
	}
	annotations := fmt.Sprintf("kubectl.kubernetes.io/default-container=%q\n", cfg.AppContainers[0])
	if err := os.WriteFile(p.Path("etc/istio/pod/annotations"), []byte(annotations), 0o644); err != nil {
		return nil, err
	}
	// pilot-agent reaches envoy's admin API as "localhost:15000"; Go resolves
	// localhost through /etc/hosts, which a runc rootfs would otherwise lack.
	if err := os.WriteFile(p.Path("etc/hosts"), []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"), 0o644); err != nil {
		return nil, err
	}
	// Create the record now, owned by the proxy user, so that it exists (empty)
	// even if envoy never starts, and so that truncation between runs is ours.
	if err := os.WriteFile(p.Path(RecordPath), nil, 0o644); err != nil {
		return nil, err
	}
	if err := os.Lchown(p.Path(RecordPath), p.UID, p.GID); err != nil {
		return nil, err
	}

	p.Argv = []string{
		"./" + PilotAgentPath, "proxy", "sidecar",
		"--domain", cfg.PodNamespace + ".svc.cluster.local",
		"--proxyLogLevel=warning",
		"--proxyComponentLogLevel=misc:error",
		"--log_output_level=" + cfg.AgentLogLevel,
	}
	p.Env, err = environment(cfg)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// environment is what Istio's injection template sets on istio-proxy,
// trimmed to what pilot-agent reads, plus the stand-in's record path.
func environment(cfg Config) ([]string, error) {
	// PROXY_CONFIG carries the mesh's defaultConfig; the injector puts it
	// here as JSON. binaryPath is relative so it works in both backends.
	proxyConfig, err := json.Marshal(map[string]any{
		"binaryPath":               "./" + EnvoyPath,
		"discoveryAddress":         cfg.DiscoveryAddress,
		"terminationDrainDuration": cfg.TerminationDrainDuration.String(),
		// Set, as the injector does through ISTIO_CPU_LIMIT, to keep envoy
		// off "a thread per host CPU" (and pilot-agent from warning about it).
		"concurrency": 2,
	})
	if err != nil {
		return nil, err
	}
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"PILOT_CERT_PROVIDER=istiod",
		"CA_ADDR=" + cfg.DiscoveryAddress,
		"POD_NAME=" + cfg.PodName,
		"POD_NAMESPACE=" + cfg.PodNamespace,
		"INSTANCE_IP=" + cfg.InstanceIP,
		"SERVICE_ACCOUNT=" + cfg.ServiceAccount,
		"HOST_IP=" + cfg.InstanceIP,
		"PROXY_CONFIG=" + string(proxyConfig),
		"ISTIO_META_POD_PORTS=[]",
		"ISTIO_META_APP_CONTAINERS=" + strings.Join(cfg.AppContainers, ","),
		"ISTIO_META_CLUSTER_ID=Kubernetes",
		"ISTIO_META_NODE_NAME=node",
		"ISTIO_META_INTERCEPTION_MODE=REDIRECT",
		"ISTIO_META_WORKLOAD_NAME=" + cfg.PodName,
		"ISTIO_META_OWNER=kubernetes://apis/batch/v1/namespaces/" + cfg.PodNamespace + "/jobs/" + cfg.PodName,
		"ISTIO_META_MESH_ID=cluster.local",
		"TRUST_DOMAIN=cluster.local",
		record.EnvVar + "=./" + RecordPath,
	}
	if cfg.EnvoyReadyDelay > 0 {
		env = append(env, "ENVOY_STANDIN_READY_DELAY="+cfg.EnvoyReadyDelay.String())
	}
	return append(env, cfg.Env...), nil
}

// Path returns the host path of rel, a path inside the tree.
func (p *Proxy) Path(rel string) string {
	return filepath.Join(p.Root, filepath.FromSlash(strings.TrimPrefix(rel, "./")))
}

// RecordFile is the host path of the stand-in envoy's record.
func (p *Proxy) RecordFile() string { return p.Path(RecordPath) }

// Record reads the stand-in envoy's record so far.
func (p *Proxy) Record() ([]record.Event, error) { return record.Read(p.RecordFile()) }

// Command returns pilot-agent ready to start with plain namespaces: working
// directory Root, the environment and credentials of Proxy, output to this
// process's (the caller may redirect it). Put it into a network namespace
// of its own (SysProcAttr.Cloneflags, or start it from a thread that is in
// one) so that ports 15000/15020/15021/15090 do not clash.
func (p *Proxy) Command() (*exec.Cmd, error) {
	if p.UID != 0 {
		if err := searchableByOthers(p.Root); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Path = p.Path(PilotAgentPath)
	cmd.Dir = p.Root
	cmd.Env = append([]string(nil), p.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if p.UID != 0 || p.GID != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(p.UID), Gid: uint32(p.GID)}
	}
	return cmd, nil
}

// searchableByOthers checks that a non-root user can reach dir: every
// directory from / down must have the search bit for others.
func searchableByOthers(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("istioproxy: %s is not searchable by others (mode %v), so uid %d cannot reach %s: chmod o+x it or set Config.RunAsRoot",
				d, fi.Mode().Perm(), ProxyUID, dir)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// InstallBinary hard-links src to dst (the build cache and the tree are
// usually on one filesystem, and a link costs nothing where a copy of
// pilot-agent is 46 MB), falling back to a copy. Either way the binary in
// the tree is reachable by uid 1337 even though the cache under /root is not.
func InstallBinary(src, dst string) error {
	_ = os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return copyFile(src, dst, 0o755)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
