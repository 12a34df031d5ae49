package pod

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultCaps is the capability set a container gets from containerd's CRI
// plugin when its securityContext says nothing (containerd's
// oci.defaultUnixCaps, Docker's default too).
var DefaultCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER,
	unix.CAP_MKNOD, unix.CAP_NET_RAW, unix.CAP_SETGID, unix.CAP_SETUID,
	unix.CAP_SETFCAP, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE,
	unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE,
}

// CapMask is a capability set as /proc/PID/status prints it.
func CapMask(caps ...int) string {
	var m uint64
	for _, c := range caps {
		m |= 1 << c
	}
	return fmt.Sprintf("%016x", m)
}

// ProcStatus reads a host process's /proc/PID/status into a map of its
// fields.
func ProcStatus(pid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, nil
}

// capNames are the names runc's spec wants, by capability number.
var capNames = [...]string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// spec is the container's OCI runtime spec.
func (r Runc) spec(p *Pod, st *runcState, c *Container, id string, sandbox bool) (*ociSpec, error) {
	rootfs, readOnly := c.Rootfs, c.ReadOnlyRootfs
	mounts := defaultMounts()
	if rootfs == "" {
		rootfs = st.defaultRootfs()
		tools := filepath.Dir(r.Podsim)
		mounts = append(mounts, ociMount{Destination: tools, Type: "bind", Source: tools, Options: []string{"rbind", "ro"}})
	}
	if _, err := os.Stat(rootfs); err != nil {
		return nil, fmt.Errorf("container %s rootfs: %w", c.Name, err)
	}
	for _, m := range c.Mounts {
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		mounts = append(mounts, ociMount{Destination: m.Container, Type: "bind", Source: m.Host, Options: []string{"rbind", opt}})
	}
	// The termination-message file: the instance's, as the kubelet mounts
	// it (onto /dev/termination-log by default), or without names the
	// pod's file for the containers that write one.
	inst := ""
	if !sandbox {
		var err error
		if inst, err = p.instanceFile(c); err != nil {
			return nil, err
		}
	}
	switch dst := c.TerminationMessage; {
	case inst != "":
		dst = cmp.Or(dst, "/dev/termination-log")
		mounts = append(mounts, ociMount{Destination: dst, Type: "bind", Source: inst, Options: []string{"rbind", "rw"}})
	case dst != "":
		mounts = append(mounts, ociMount{Destination: dst, Type: "bind",
			Source: p.TerminationMessagePath(c.Name), Options: []string{"rbind", "rw"}})
	}
	caps := DefaultCaps
	if c.Caps != nil {
		caps = c.Caps
	}
	names := []string{} // [], not null, when caps is empty: none
	for _, n := range caps {
		if n < 0 || n >= len(capNames) {
			return nil, fmt.Errorf("container %s: unknown capability %d", c.Name, n)
		}
		names = append(names, capNames[n])
	}
	env := c.Env
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cwd := cmp.Or(c.Dir, "/")
	s := &ociSpec{
		Version: "1.0.2-dev",
		Process: ociProcess{
			User: ociUser{UID: c.UID, GID: c.GID}, Args: c.Argv, Env: env, Cwd: cwd,
			Capabilities:    ociCaps{Bounding: names, Effective: names, Permitted: names},
			NoNewPrivileges: c.NoNewPrivs,
		},
		Root:   ociRoot{Path: rootfs, Readonly: readOnly},
		Mounts: mounts,
		Linux: ociLinux{
			CgroupsPath: st.cgroup + "/" + id,
			// Deny every device but runc's defaults (null, zero, full, tty,
			// random, urandom, ptmx...), as containerd does.
			Resources:     &ociResources{Devices: []ociDevice{{Allow: false, Access: "rwm"}}},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	if sandbox { // the pause container makes the pod's namespaces
		s.Hostname = p.Spec.Name
		for _, t := range []string{"pid", "network", "ipc", "uts", "mount", "cgroup"} {
			s.Linux.Namespaces = append(s.Linux.Namespaces, ociNamespace{Type: t})
		}
		return s, nil
	}
	join := func(t, name string) ociNamespace {
		return ociNamespace{Type: t, Path: fmt.Sprintf("/proc/%d/ns/%s", p.PausePID, name)}
	}
	pid := join("pid", "pid")
	if c.OwnPIDNamespace {
		pid = ociNamespace{Type: "pid"}
	}
	s.Linux.Namespaces = []ociNamespace{pid, join("network", "net"), join("ipc", "ipc"), join("uts", "uts"),
		{Type: "mount"}, {Type: "cgroup"}}
	return s, nil
}

// defaultMounts are containerd's default mounts for a Linux container.
func defaultMounts() []ociMount {
	return []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

// containerd's default masked and read-only paths.
var (
	maskedPaths = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// The part of the OCI runtime spec (config.json) the backend writes.
type (
	ociSpec struct {
		Version  string     `json:"ociVersion"`
		Process  ociProcess `json:"process"`
		Root     ociRoot    `json:"root"`
		Hostname string     `json:"hostname,omitempty"`
		Mounts   []ociMount `json:"mounts"`
		Linux    ociLinux   `json:"linux"`
	}
	ociProcess struct {
		User            ociUser  `json:"user"`
		Args            []string `json:"args"`
		Env             []string `json:"env"`
		Cwd             string   `json:"cwd"`
		Capabilities    ociCaps  `json:"capabilities"`
		NoNewPrivileges bool     `json:"noNewPrivileges"`
	}
	ociUser struct {
		UID int `json:"uid"`
		GID int `json:"gid"`
	}
	ociCaps struct {
		Bounding  []string `json:"bounding"`
		Effective []string `json:"effective"`
		Permitted []string `json:"permitted"`
	}
	ociRoot struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	}
	ociMount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options,omitempty"`
	}
	ociLinux struct {
		Namespaces    []ociNamespace `json:"namespaces"`
		CgroupsPath   string         `json:"cgroupsPath"`
		Resources     *ociResources  `json:"resources,omitempty"`
		MaskedPaths   []string       `json:"maskedPaths,omitempty"`
		ReadonlyPaths []string       `json:"readonlyPaths,omitempty"`
	}
	ociNamespace struct {
		Type string `json:"type"`
		Path string `json:"path,omitempty"`
	}
	ociResources struct {
		Devices []ociDevice `json:"devices"`
	}
	ociDevice struct {
		Allow  bool   `json:"allow"`
		Access string `json:"access"`
	}
)
