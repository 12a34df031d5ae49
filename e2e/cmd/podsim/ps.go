package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// ps lists the processes this container sees, one per line:
// "PID PPID UID COMM CGROUP" (cgroup: the unified line's path).
func ps(args []string) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if l < 0 || r < 0 {
			continue
		}
		comm := s[l+1 : r]
		fields := strings.Fields(s[r+1:])
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		unified := "?"
		for _, line := range strings.Split(string(cg), "\n") {
			if strings.HasPrefix(line, "0::") {
				unified = strings.TrimPrefix(line, "0::")
			}
		}
		uid := -1
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			uid = int(fi.Sys().(*syscall.Stat_t).Uid)
		}
		fmt.Printf("%d %s %d %s %s\n", pid, fields[1], uid, strings.ReplaceAll(comm, " ", "_"), unified)
	}
	return nil
}
