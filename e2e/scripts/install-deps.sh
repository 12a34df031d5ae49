#!/usr/bin/env bash
# Install what the pod tests (e2e/pod, e2e/scenarios) need from Debian:
# E2E_DEBIAN_PACKAGES in e2e/versions.env (runc, the OCI runtime of the Runc
# backend; crun, for procscan's test of the runtimes' inits; dumb-init and busybox-static for the sidecar stand-ins). Idempotent: when everything is installed it only checks, in well
# under a second, and needs no network.
#
# Prints one NAME=PATH line per tool on stdout (logs go to stderr):
#   RUNC=/usr/sbin/runc
. "$(dirname "$0")/lib.sh"

install_deps_main() {
	# shellcheck disable=SC2086 # a list of package names
	apt_install $E2E_DEBIAN_PACKAGES
	local runc
	runc="$(command -v runc || true)"
	[ -n "$runc" ] || die "runc is installed but not on PATH ($PATH)"
	log "$("$runc" --version | head -n1)"
	printf 'RUNC=%s\n' "$runc"
}

install_deps_main "$@"
