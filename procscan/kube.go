package procscan

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// Kube is a container's identity as the kubelet gave it: its name in the
// pod spec and its pod's UID.
//
// The kubelet bind-mounts each container instance's termination-message
// file from <kubelet root>/pods/<pod UID>/containers/<name>/<8 hex digits>
// onto the container's terminationMessagePath (k8s.io/kubernetes
// pkg/kubelet/kuberuntime/kuberuntime_container.go, makeMounts; the digits
// are a random uint32, new for each instance). /proc/PID/mountinfo shows
// that source path as the mount's root (field 4), relative to the
// filesystem holding it: the kubelet's root directory, or where it is
// mounted, only changes the path's head, never its tail. mountinfo is
// world-readable: any process of the pod can read every container's name,
// with no privilege and no API, on every runtime the kubelet drives.
type Kube struct {
	Name, PodUID string
}

// Known reports whether the kubelet's mount was found.
func (k Kube) Known() bool { return k.Name != "" }

// kubeMax bounds the read of /proc/PID/mountinfo: a container has tens of
// mounts, a line each.
const kubeMax = 1 << 20

// Kube reads pid's container identity from its mountinfo. A process with
// no such mount (not a kubelet's container) has none: Known is false. It
// returns ErrGone for a process that no longer exists.
func (s *Scanner) Kube(pid int) (Kube, error) {
	f, err := os.Open(s.root + "/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return Kube{}, gone(pid, err)
	}
	defer f.Close()
	k, err := parseKube(io.LimitReader(f, kubeMax))
	if err != nil {
		return Kube{}, gone(pid, err)
	}
	return k, nil
}

// parseKube finds the termination-message mount in a mountinfo content.
// Two such mounts naming different containers (a pod that mounts another
// container's file on purpose) tell nothing: Known is false then.
func parseKube(r io.Reader) (Kube, error) {
	var found Kube
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw"
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		k, ok := kubeMount(unescape(fields[3]))
		if !ok {
			continue
		}
		if found.Known() && found != k {
			return Kube{}, nil
		}
		found = k
	}
	if err := sc.Err(); err != nil {
		return Kube{}, err
	}
	return found, nil
}

// kubeMount matches the tail ".../pods/<UID>/containers/<name>/<8 hex>".
func kubeMount(root string) (Kube, bool) {
	parts := strings.Split(root, "/")
	n := len(parts)
	if n < 5 || parts[n-5] != "pods" || parts[n-3] != "containers" {
		return Kube{}, false
	}
	uid, name, id := parts[n-4], parts[n-2], parts[n-1]
	if len(id) != 8 || strings.Trim(id, "0123456789abcdef") != "" || !dnsLabel(name) || !podUID(uid) {
		return Kube{}, false
	}
	return Kube{Name: name, PodUID: uid}, true
}

// dnsLabel is a container name as the API accepts it (RFC 1123 label).
func dnsLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// podUID is a pod's UID: a UUID, or for a static pod a hash, in hex.
func podUID(s string) bool {
	return len(s) >= 8 && len(s) <= 64 && strings.Trim(s, "0123456789abcdef-") == ""
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash (\040, \011, \012, \134).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
