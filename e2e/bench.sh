#!/usr/bin/env bash
# Measure the supervisor side by side with the alternatives (issue 8) and
# print BENCHMARKS.md: one markdown table (exit-to-stop latency, footprint,
# scale, ptrace's overhead) with the machine, the kernel, the date and the load.
# As root: the simulated pods need namespaces and cgroups. About 10 minutes.
#
#   sudo e2e/bench.sh > BENCHMARKS.md
#   sudo e2e/bench.sh -runs 20 -slow-runs 10 -idle 10s   # a quick look
#   sudo e2e/bench.sh -sections memory                   # memory at 100,000 processes
#   go -C e2e run ./bench -h                             # every option
#
# It builds the image as the tests do (e2e/scripts/build-image.sh) and
# measures its binary. Progress goes to stderr. By default it first waits (up
# to 30 minutes) for the 1-minute load average to drop below 1.5: the figures
# are only as quiet as the machine. The memory section is not run by default:
# its pods of up to 100,000 processes take about 10 minutes and 8 GiB of RAM.
. "$(dirname "$0")/scripts/lib.sh"

[ "$(id -u)" -eq 0 ] || die "run as root: the simulated pods need namespaces and cgroups (sudo $0)"
# pkill, for the seed's wrapper.
apt_install procps

image_vars="$(bash "$E2E_DIR/scripts/build-image.sh")"
eval "$image_vars"
log "measuring $SUPERVISOR_BINARY"
cd "$E2E_DIR"
exec go run ./bench -supervisor "$SUPERVISOR_BINARY" -image "$SUPERVISOR_IMAGE_ARCHIVE" -wait-load 1.5 "$@"
