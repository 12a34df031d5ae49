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
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	mnt := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" {
				mnt = fields[4]
			}
		}
		if mnt != "" {
			break
		}
	}
	if mnt == "" {
		return "", errors.New("no cgroup2 filesystem mounted: the pod simulation needs cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup/unified)")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	own := "/"
	for _, line := range strings.Split(string(self), "\n") {
		if strings.HasPrefix(line, "0::") {
			own = strings.TrimPrefix(line, "0::")
		}
	}
	return filepath.Join(mnt, own), nil
}

// killCgroup kills every process in a cgroup v2 directory: cgroup.kill
// (Linux 5.14+), else one by one.
func killCgroup(dir string) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		return
	}
	for i := 0; i < 10; i++ {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			return
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

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
