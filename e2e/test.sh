#!/bin/bash
# Every test of the project, as CI runs it (.ci/run calls this). As root: the
# end-to-end tests create namespaces, cgroups, containers, qemu guests and a
# one-node Kubernetes. What they need (Debian packages, tools built from the
# Go module proxy) is installed by the scripts under e2e/scripts, idempotently,
# and cached under ~/.cache/sidecar-supervisor-e2e.
#
#   e2e/test.sh                  everything
#   e2e/test.sh -run TestJobs    passed to every `go test`
#
# The e2e packages, compiled first, run in three lanes at once, each one
# package at a time, beside a fourth that vets them:
#   cluster  the one-node Kubernetes (built from source on a cold machine:
#            minutes of compiling) and the tests on it
#   qemu     Debian's kernels under software emulation
#   host     everything else: simulated pods, Istio's injector, units
#   vet      go vet of the module, niced below everything else
# Most of the host lane's time is spent waiting on the processes it starts,
# which the other two lanes' compiling and emulating use; no test depends on
# the machine's speed (e2e/README.md), so they share it. Each lane's output
# is prefixed with its name; its log and timings are also written under
# $SUPERVISOR_E2E_RUN_DIR (default /tmp/sidecar-supervisor-e2e-run).
set -euo pipefail
cd "$(dirname "$0")/.."
. e2e/scripts/lib.sh

[ "$(id -u)" -eq 0 ] || die "run as root: the end-to-end tests need namespaces and cgroups (sudo $0)"
start=$(date +%s)
# What the run found in the cache: a cold run builds Kubernetes and more.
caches=warm
[ -d "$CACHE/kube/$KUBERNETES_VERSION" ] && [ -d "$CACHE/kernel" ] || caches=cold
RUN_DIR="${SUPERVISOR_E2E_RUN_DIR:-/tmp/sidecar-supervisor-e2e-run}"
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"

# cpu_now sets CPU to the CPU seconds (user and system) this shell's
# children have used so far, the ones it waited for and theirs (bash's
# `times`; not in a pipe or $(...), whose subshell has its own). The
# daemons a test starts detached (containerd, the pods' processes) are not
# among them.
cpu_now() {
	local f="$RUN_DIR/.times.$BASHPID"
	times >"$f"
	CPU=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] } printf "%d\n", n }' "$f")
	rm -f "$f"
}
# phase NAME T0 CPU0: records a step's wall and CPU seconds for timings().
phase() {
	cpu_now
	printf '%s %d %d\n' "$1" $(($(date +%s) - $2)) $((CPU - $3)) >>"$RUN_DIR/phases"
}

log "product module: vet and tests"
cpu_now
t0=$(date +%s) cpu0=$CPU
# procscan's TestRealRuntimeInits creates containers with runc and crun.
e2e/scripts/install-deps.sh >/dev/null
go vet ./...
go test -count=1 "$@" ./...
phase product "$t0" "$cpu0"

log "e2e module: compile"
cpu_now
t0=$(date +%s) cpu0=$CPU
cd e2e
# Every package and test of the module compiled once, before the lanes,
# which would otherwise compile the packages they share each on its own, at
# once. Static, as every binary the tests build: and so the Kubernetes build
# (scripts/cluster-tools.sh) finds the packages it shares with this module
# in the build cache this fills, instead of compiling them again. The vet
# is a lane of its own (below).
export CGO_ENABLED=0
go list -export -test ./... >/dev/null
phase "e2e-compile" "$t0" "$cpu0"

# vet: go vet type-checks every dependency again for its facts (printf's
# wrappers, lostcancel's no-return functions), work none of the tests
# needs: 300 CPU seconds of a cold run. It waits for the Kubernetes build
# (the cluster lane's, the run's longest step: kube_built), then takes,
# niced, the CPU the cluster's tests leave; a warm run finds it all cached.
lanes=(cluster qemu host vet) # cluster first: the vet lane waits on it
# kube_built: the binaries scripts/cluster-tools.sh builds are in the cache
# (it moves them there once all are built).
# shellcheck source=scripts/cluster-tools.sh
. scripts/cluster-tools.sh
kube_built() {
	[ -z "$(missing_packages "$CACHE/kube/$KUBERNETES_VERSION" "$CACHE/crictl/$CRI_TOOLS_VERSION")" ]
}
declare -A pkgs=(
	[cluster]="./cluster ./k8sjobs"
	[qemu]="./qemu ./exitstatus ./guests"
)
all="$(go list ./...)"
host=()
for p in $all; do
	rel="./${p#github.com/sidecar-supervisor/sidecar-supervisor/e2e/}"
	case " ${pkgs[cluster]} ${pkgs[qemu]} " in *" $rel "*) ;; *) host+=("$rel") ;; esac
done
pkgs[host]="${host[*]}"

# lane NAME: its packages, one at a time; output prefixed, and kept. The
# cluster lane's packages share one cluster: each test joins the one up
# (cluster-up.sh reuses a Ready cluster) instead of starting its own and
# tearing it down (some 15 s each way, seven times), and the lane tears it
# down at its end.
#
# The images the cluster's pods run are built (or found in the cache) from
# the lane's start, beside its tests: on a cold machine while the Kubernetes
# build (niced) still runs, rather than after it, when the cluster's tests
# are all that is left to run and would wait for them. The tests take them
# from the cache, or wait on its lock while they are being built.
lane() {
	local name="$1" t0 rc=0 keep=0 images=
	t0=$(date +%s)
	if [ "$name" = cluster ]; then
		keep=1
		{ bash scripts/build-image.sh && bash scripts/cluster-images.sh pause busybox istio-proxy cloud-sql-proxy standins; } \
			>/dev/null 2>"$RUN_DIR/images.log" &
		images=$!
	fi
	if [ "$name" = vet ]; then
		# After the Kubernetes build (or the cluster lane's end, should it
		# fail before): until then its CPU would only push the build's end,
		# and so the cluster's tests, later.
		while ! kube_built && kill -0 "${pids[0]}" 2>/dev/null; do
			sleep 5
		done
		nice -n 15 go vet ./... >"$RUN_DIR/$name.log" 2>&1 || rc=$?
	else
		# shellcheck disable=SC2086
		SUPERVISOR_E2E_KEEP_CLUSTER=$keep go test -count=1 -p 1 -timeout 80m "${args[@]}" ${pkgs[$name]} >"$RUN_DIR/$name.log" 2>&1 || rc=$?
	fi
	if [ -n "$images" ] && ! wait "$images"; then
		{ echo "building the cluster's images failed:"; cat "$RUN_DIR/images.log"; } >>"$RUN_DIR/$name.log"
		rc=$((rc ? rc : 1))
	fi
	if [ $keep = 1 ]; then
		bash scripts/cluster-down.sh >>"$RUN_DIR/$name.log" 2>&1 || rc=$((rc ? rc : 1))
	fi
	cpu_now
	printf '%s %s %d %d\n' "$name" "$rc" $(($(date +%s) - t0)) "$CPU" >"$RUN_DIR/$name.status"
	return $rc
}
args=("$@")

# timings TOTAL: the run's figures as markdown, for e2e/TIMINGS.md: each
# step's and lane's wall and CPU seconds (a lane's CPU includes the
# compiles and links of its test binaries, and a cold cluster lane's
# Kubernetes build), and each package's own figure (go test's, which
# leaves out its compile).
timings() {
	printf '### %s, commit %s, caches %s: %ss in all\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" \
		"$(git -C .. rev-parse --short HEAD 2>/dev/null || echo unknown)" "$caches" "$1"
	printf '| step | exit | seconds | CPU seconds |\n|---|---|---|---|\n'
	local l p rc secs cpu
	while read -r l secs cpu; do
		printf '| %s | 0 | %s | %s |\n' "$l" "$secs" "$cpu"
	done <"$RUN_DIR/phases"
	for l in "${lanes[@]}"; do
		read -r _ rc secs cpu <"$RUN_DIR/$l.status"
		printf '| %s | %s | %s | %s |\n' "$l" "$rc" "$secs" "$cpu"
	done
	printf '\n| package | lane | result | seconds |\n|---|---|---|---|\n'
	for l in "${lanes[@]}"; do
		# The vet lane runs no package: no line, and grep's 1 is no failure.
		{ grep -hE '^(ok|FAIL)[[:space:]]+github' "$RUN_DIR/$l.log" || true; } |
			awk -v lane="$l" '{p=$2; sub("github.com/sidecar-supervisor/sidecar-supervisor/", "", p); printf "| %s | %s | %s | %s |\n", p, lane, $1, $3}'
	done
}
# failures LOG: the failed tests in a lane's LOG (the vet's: its findings), each with the first line
# of its messages (a dump's is its heading), cut at 1,000 characters: the last
# lines of a run, the ones a reader of its end sees, say what failed and why.
failures() {
	case "$1" in */vet.log) head -n 200 "$1"; return ;; esac
	awk '/^[[:space:]]*--- FAIL: |^panic: |^FAIL[[:space:]]|test timed out/ { print; next }
		/^[[:space:]]+[A-Za-z0-9_]+\.go:[0-9]+: / { print substr($0, 1, 1000) }' "$1" | head -n 200
}
log "e2e module: tests, in lanes: ${lanes[*]}"
pids=() tails=()
for l in "${lanes[@]}"; do
	: >"$RUN_DIR/$l.log"
	lane "$l" &
	pids+=($!)
	# Follow the lane's log as it is written, prefixed, to the lane's end.
	tail -n +1 -F --pid="$!" "$RUN_DIR/$l.log" 2>/dev/null | sed -u "s/^/[$l] /" &
	tails+=($!)
done
failed=()
for i in "${!lanes[@]}"; do
	wait "${pids[$i]}" || failed+=("${lanes[$i]}")
done
wait "${tails[@]}" || true
for l in "${lanes[@]}"; do
	read -r _ rc secs _ <"$RUN_DIR/$l.status"
	log "lane $l: exit $rc in ${secs}s"
done
timings "$(($(date +%s) - start))" >"$RUN_DIR/timings.md"
for l in "${failed[@]}"; do
	log "lane $l failed: its failed tests and the first line of each of their messages"
	failures "$RUN_DIR/$l.log" | sed "s/^/[$l] /"
done
[ ${#failed[@]} -eq 0 ] || die "failed: ${failed[*]} (logs in $RUN_DIR)"
log "all tests passed in $(($(date +%s) - start))s (timings: $RUN_DIR/timings.md)"
