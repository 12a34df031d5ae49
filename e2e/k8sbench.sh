#!/usr/bin/env bash
# Measure on the one-node Kubernetes (e2e/cluster) how soon the same busybox
# Job completes after its app exits, and what its pod's containers other than
# the app cost, for each way of ending Istio's sidecar (issue 20), and print
# one markdown document: the run's conditions, one table, the method.
# As root: it starts (or joins) the cluster and reads the containers' cgroups.
# About 20 minutes (10 Jobs per approach, one at a time).
#
#   sudo e2e/k8sbench.sh > BENCHMARKS-k8s.md
#   sudo e2e/k8sbench.sh -jobs 2 -only sup-term,sup-quit   # a quick look
#   go -C e2e run ./k8sbench -h                             # every option
#
# Progress goes to stderr. The cluster is torn down at the end unless another
# user (a test) holds it; the figures are only as quiet as the machine.
. "$(dirname "$0")/scripts/lib.sh"

[ "$(id -u)" -eq 0 ] || die "run as root: the cluster needs containerd and a kubelet, and the figures come from cgroups (sudo $0)"
cd "$E2E_DIR"
exec go run ./k8sbench "$@"
