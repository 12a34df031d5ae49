#!/usr/bin/env bash
# Soak the supervisor on the one-node Kubernetes (e2e/cluster): hundreds of
# Jobs with random timelines drawn from a seed (printed), injected by Istio's
# own injector with our template, a window at a time, with the kubelet and
# then containerd restarted mid-soak, and the supervisor SIGKILLed in about
# one Job in ten; every Job is checked against five invariants (its
# condition; istio-proxy stopped only after every app run of its pod; no
# container left running; the supervisor's termination message; the
# supervisor restarted only where killed, then carrying on from its journal
# and stopping istio-proxy in time).
# Prints one markdown document (conditions, one table, each violation) and
# exits 1 if an invariant failed. About 25 minutes for 200 Jobs; not part of
# e2e/test.sh.
#
#   flock /tmp/sidecar-supervisor-cluster.lock sudo e2e/soak.sh
#   sudo e2e/soak.sh -seed 123 -jobs 20          # a short one
#   sudo e2e/soak.sh -seed 123 -only 17,42       # replay two Jobs of a seed
#   sudo e2e/soak.sh -standby                    # every pod with a standby supervisor
#   go -C e2e run ./soak -h                      # every option
#
# Progress goes to stderr. As root: it runs the cluster, restarts its daemons
# and reads the apps' stamps on the node. The cluster is torn down at the end
# unless another user holds it.
. "$(dirname "$0")/scripts/lib.sh"

[ "$(id -u)" -eq 0 ] || die "run as root: the cluster needs containerd and a kubelet, and the soak restarts them (sudo $0)"
cd "$E2E_DIR"
exec go run ./soak "$@"
