package pod

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupRoot is where pods' cgroups are made: a cgroup v2 hierarchy (the
// unified one on a hybrid host), under this process's own cgroup.
func CgroupRoot() (string, error) {
	own, err := ownCgroups()
	if err == nil && own[""] == "" {
		err = errors.New("no cgroup2 filesystem mounted: the pod simulation needs cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup/unified)")
	}
	return own[""], err
}

// killCgroup kills every process in a cgroup v2 directory: cgroup.kill
// (Linux 5.14+), else one by one until cgroup.procs is empty (a process
// forked meanwhile is killed on the next round), for at most killBound.
func killCgroup(dir string) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		return
	}
	for end := time.Now().Add(killBound); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			return
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// killBound bounds killCgroup's rounds without cgroup.kill: a hang guard.
const killBound = 30 * time.Second

// removeCgroupTree removes a pod's cgroup directories, waiting (bounded) for
// killed processes to leave them.
func removeCgroupTree(dir string) error {
	entries, _ := os.ReadDir(dir)
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			sub := filepath.Join(dir, e.Name())
			killCgroup(sub)
			errs = append(errs, rmdirRetry(sub))
		}
	}
	errs = append(errs, rmdirRetry(dir))
	return errors.Join(errs...)
}

func rmdirRetry(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ownCgroups is this process's cgroup directory in each hierarchy it is in
// and is mounted here (one not mounted, runc cannot use either), by the
// hierarchy's controllers as /proc/self/cgroup names them ("" for cgroup2).
func ownCgroups() (map[string]string, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		// ID:CONTROLLERS:PATH
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			if mnt := mounts.find(parts[1]); mnt != "" {
				own[parts[1]] = filepath.Join(mnt, parts[2])
			}
		}
	}
	return own, nil
}

// runcCgroupDirs lists the pod's cgroup directory in every hierarchy this
// process is in: runc makes the containers' cgroups relative to its own
// (which is ours) in each of them.
func runcCgroupDirs(pod string) ([]string, error) {
	own, err := ownCgroups()
	var dirs []string
	for _, dir := range own {
		dirs = append(dirs, filepath.Join(dir, pod))
	}
	return dirs, err
}

// cgroupMount is a mounted cgroup hierarchy: its mount point and mount
// options, which name its controllers ("cpu", "name=systemd"); none for
// cgroup2.
type cgroupMount struct {
	dir  string
	v2   bool
	opts map[string]bool
}

type cgroupMountList []cgroupMount

// find returns where the hierarchy of a /proc/self/cgroup line's
// controller list ("" for cgroup2) is mounted, or "".
func (l cgroupMountList) find(controllers string) string {
	for _, m := range l {
		if controllers == "" {
			if m.v2 {
				return m.dir
			}
			continue
		}
		all := !m.v2
		for _, c := range strings.Split(controllers, ",") {
			all = all && m.opts[c]
		}
		if all {
			return m.dir
		}
	}
	return ""
}

// CgroupMount is where the hierarchy of controllers ("" for cgroup2) is
// mounted, "" where none is.
func CgroupMount(controllers string) (string, error) {
	l, err := cgroupMounts()
	return l.find(controllers), err
}

func cgroupMounts() (cgroupMountList, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var l cgroupMountList
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			// "... - FSTYPE SOURCE SUPEROPTS"
			if fld != "-" || i+3 >= len(fields) || (fields[i+1] != "cgroup" && fields[i+1] != "cgroup2") {
				continue
			}
			m := cgroupMount{dir: fields[4], v2: fields[i+1] == "cgroup2", opts: map[string]bool{}}
			for _, o := range strings.Split(fields[i+3], ",") {
				m.opts[o] = true
			}
			l = append(l, m)
		}
	}
	return l, sc.Err()
}
