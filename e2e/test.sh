#!/bin/bash
# Every test of the project, as CI runs it (.ci/run calls this). As root: the
# end-to-end tests create namespaces, cgroups, containers, a qemu guest and a
# one-node Kubernetes. What they need (Debian packages, tools built from the
# Go module proxy) is installed by the scripts under e2e/scripts, idempotently,
# and cached under ~/.cache/sidecar-supervisor-e2e.
#
#   e2e/test.sh                  everything
#   e2e/test.sh -run TestJobs    passed to both `go test`s
set -euo pipefail
cd "$(dirname "$0")/.."
. e2e/scripts/lib.sh

[ "$(id -u)" -eq 0 ] || die "run as root: the end-to-end tests need namespaces and cgroups (sudo $0)"
start=$(date +%s)

log "product module: vet and tests"
go vet ./...
go test -count=1 "$@" ./...

log "e2e module: vet and tests"
cd e2e
go vet ./...
# -p 1: the heavy packages (qemu, the cluster) must not compete for 2 cores.
go test -count=1 -p 1 -timeout 80m "$@" ./...

log "all tests passed in $(( $(date +%s) - start ))s"
