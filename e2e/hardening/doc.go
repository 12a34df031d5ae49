// Package hardening holds the end-to-end hardening tests of the supervisor
// (issue 9): the real binary, in a simulated pod (package pod, the
// namespaces backend, and the runc backend where the test needs nothing the
// image lacks), as uid 1337 with no capabilities, facing hostile process
// names, decoys named like the sidecar, thousands of processes coming and
// going, and watched from outside: strace(1) for every file it opens and
// every signal it sends, /proc/PID/status for its credentials and memory,
// /proc/PID/fd and /proc/PID/net for its descriptors and sockets.
//
// The tests need root (namespaces, cgroups) and strace, which
// e2e/scripts/install-strace.sh installs from Debian when it is missing.
// SECURITY.md at the top of the repository is the threat model they check.
package hardening
