// Package procscan reads a pod's processes from /proc and tells its
// containers apart.
//
// It reads a proc filesystem mounted anywhere, so tests run against fixture
// trees under testdata/, and returns plain values. It never signals or waits.
// Of each process it reads stat, argv[0] alone (the first 4 KiB of cmdline at
// most; past argv[0] only whether the rest is the word "init", as a runtime's
// init has it) and cgroup (byte for byte), and nothing else: never environ,
// which holds other containers' secrets. A scan (Scanner.Scan) groups processes into
// containers as it reads them and keeps a few values per container, so that
// its memory does not grow with the pod's processes: a pod of 100,000 costs
// the supervisor no more than one of 1,000 (BENCHMARKS.md).
//
// Containers are told apart by the whole content of /proc/PID/cgroup: two
// processes are in the same container when it is identical. The rule holds on
// cgroup v2, v1 and hybrid hosts alike, with or without a cgroup namespace. A
// container's main process is its oldest, whose parent is outside the pod's PID
// namespace (PPID 0); orphans are re-parented to the pause process (PID 1) and
// keep their container's cgroup.
package procscan
