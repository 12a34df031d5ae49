#!/bin/bash
# The supervisor at work: Job pods in a simulated pod (real processes, real
# namespaces), each pod's timeline on screen. Needs root and the Go toolchain.
#   e2e/demo.sh              a Job that succeeds, one that fails, and the control
#   e2e/demo.sh -only ok     just one of them (ok, fail, control)
set -euo pipefail
cd "$(dirname "$0")"
[ "$(id -u)" -eq 0 ] || { echo "demo: needs root, to create the pod's namespaces and cgroups (sudo $0)" >&2; exit 1; }
export CGO_ENABLED=0 # static, as e2e/test.sh builds: its build cache serves
exec go run ./cmd/demo "$@"
