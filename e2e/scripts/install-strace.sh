#!/usr/bin/env bash
# Install strace(1) from Debian for the hardening tests (e2e/hardening), which
# run the supervisor under it to see every file it opens and every signal it
# sends. Idempotent: when strace is there it only checks, offline.
#
# Prints one line on stdout (logs go to stderr):
#   STRACE=/usr/bin/strace
. "$(dirname "$0")/lib.sh"

apt_install strace
strace="$(command -v strace || true)"
[ -n "$strace" ] || die "strace is installed but not on PATH ($PATH)"
log "$("$strace" -V | head -n1)"
printf 'STRACE=%s\n' "$strace"
