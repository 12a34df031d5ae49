package procscan

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const uid = "b368de86-5b2f-4bd4-9f4e-2a1b3c4d5e6f"

func TestParseKube(t *testing.T) {
	line := func(root, point string) string {
		return "1234 1200 8:1 " + root + " " + point + " rw,relatime - ext4 /dev/sda1 rw\n"
	}
	base := line("/", "/") + line("/var/lib/kubelet/pods/"+uid+"/etc-hosts", "/etc/hosts")
	tests := []struct {
		name, mountinfo string
		want            Kube
	}{
		{"default kubelet root", base + line("/var/lib/kubelet/pods/"+uid+"/containers/app/98deae07", "/dev/termination-log"),
			Kube{Name: "app", PodUID: uid}},
		{"kubelet root on its own filesystem", base + line("/pods/"+uid+"/containers/istio-proxy/0000ffff", "/dev/termination-log"),
			Kube{Name: "istio-proxy", PodUID: uid}},
		{"another termination path", base + line("/data/kubelet/pods/"+uid+"/containers/worker-2/abcdef01", "/tmp/done"),
			Kube{Name: "worker-2", PodUID: uid}},
		{"a static pod's hash", base + line("/var/lib/kubelet/pods/0f3c5a2b9e8d7c6b5a4f3e2d1c0b9a8f/containers/etcd/12345678", "/dev/termination-log"),
			Kube{Name: "etcd", PodUID: "0f3c5a2b9e8d7c6b5a4f3e2d1c0b9a8f"}},
		{"no termination mount", base, Kube{}},
		{"not 8 hex digits", line("/var/lib/kubelet/pods/"+uid+"/containers/app/98deae0", "/x"), Kube{}},
		{"not a DNS label", line("/var/lib/kubelet/pods/"+uid+"/containers/App/98deae07", "/x"), Kube{}},
		{"a volume, not a container", line("/var/lib/kubelet/pods/"+uid+"/volumes/kubernetes.io~empty-dir/98deae07", "/x"), Kube{}},
		{"two containers' files: no answer", line("/var/lib/kubelet/pods/"+uid+"/containers/app/98deae07", "/x") +
			line("/var/lib/kubelet/pods/"+uid+"/containers/other/98deae08", "/y"), Kube{}},
		{"the same one twice", line("/p/pods/"+uid+"/containers/app/98deae07", "/x") +
			line("/q/pods/"+uid+"/containers/app/98deae07", "/y"), Kube{Name: "app", PodUID: uid}},
		{"escaped spaces in the head", line(`/var/lib/my\040kubelet/pods/`+uid+"/containers/app/98deae07", "/x"),
			Kube{Name: "app", PodUID: uid}},
		{"short lines", "1 2 3\n\n", Kube{}},
	}
	for _, tt := range tests {
		got, err := parseKube(strings.NewReader(tt.mountinfo))
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func FuzzKube(f *testing.F) {
	f.Add("1 2 8:1 /var/lib/kubelet/pods/" + uid + "/containers/app/98deae07 /dev/termination-log rw - ext4 /dev/sda1 rw\n")
	f.Add(`1 2 8:1 /a\040b/pods/x/containers/y/0000000z /z rw`)
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseKube(strings.NewReader(s))
		if err != nil {
			return // a line over the scanner's bound
		}
		if k.Known() && (!dnsLabel(k.Name) || !podUID(k.PodUID)) {
			t.Fatalf("%q gave %+v", s, k)
		}
		if !k.Known() && k.PodUID != "" {
			t.Fatalf("%q: a UID without a name", s)
		}
	})
}

// TestKubeReal bind-mounts a file laid out as the kubelet's onto another,
// in a new mount namespace, and reads the name from that process's
// mountinfo, as the supervisor reads another container's.
func TestKubeReal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace and a bind mount")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "kubelet", "pods", uid, "containers", "app", "98deae07")
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "termination-log")
	for _, f := range []string{src, dst} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", "mount --bind \"$0\" \"$1\" && echo ready && read x", src, dst)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	ready := make(chan string, 1)
	go func() { s, _ := bufio.NewReader(out).ReadString('\n'); ready <- s }()
	select {
	case s := <-ready:
		if strings.TrimSpace(s) != "ready" {
			t.Fatalf("bind mount failed (%q)", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no bind mount within 10s")
	}
	s, err := NewScanner("/proc")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Kube(cmd.Process.Pid)
	if err != nil || got != (Kube{Name: "app", PodUID: uid}) {
		t.Errorf("Kube = %+v, %v", got, err)
	}
	if self, err := s.Kube(os.Getpid()); err != nil || self.Known() {
		t.Errorf("this process, not in a pod: %+v, %v", self, err)
	}
}
