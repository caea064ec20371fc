#!/usr/bin/env bash
# Installs what the test suite needs (on a fresh Debian machine) and runs it:
# format check, clippy with warnings denied, every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { # need COMMAND DEBIAN-PACKAGE
    command -v "$1" >/dev/null 2>&1 && return
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"
    else
        echo "missing $1: install the Debian package $2" >&2; exit 1
    fi
}
need setpriv util-linux   # unreadable-file tests run the CLI as an unprivileged user
need mkfifo coreutils     # special-file tests
need umount mount         # mount tests detach leftover mounts
need diff diffutils       # mount tests compare generations with diff -r
need fusermount3 fuse3    # a user's mount (not root) is made and unmounted through it
need setfattr attr        # fidelity tests set and read extended attributes
need setfacl acl          # ... and a POSIX ACL
need rsync rsync          # restored trees are compared with rsync -aHAXn
# The control-socket test runs a tiny client as another uid; it needs the
# system interpreter (a per-user one under /root is unreadable to nobody).
[ -x /usr/bin/python3 ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3; }
[ -e /dev/fuse ] || { echo "mount tests need /dev/fuse" >&2; exit 1; }
command -v cargo >/dev/null || { echo "cargo is required (rustup)" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt 2>/dev/null || true

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
mkdir -p target
# FUSE over io_uring (Linux 6.14+): the daemon takes its requests that way
# where the kernel offers it (the fuse module's enable_uring, read at each
# mount) and does not schedule sessions as groups (sched_autogroup_enabled).
# Everything runs with the first off (the kernel's default), then the mount
# tests and the soak again with it on and the second off; both settings are
# restored at exit.
URING=/sys/module/fuse/parameters/enable_uring
AUTOGROUP=/proc/sys/kernel/sched_autogroup_enabled
URING_WAS=$(cat "$URING" 2>/dev/null || true)
AUTOGROUP_WAS=$(cat "$AUTOGROUP" 2>/dev/null || true)
setting() { [ -w "$1" ] && echo "$2" > "$1"; }
restore() {
    [ -n "$URING_WAS" ] && setting "$URING" "$URING_WAS"
    [ -n "$AUTOGROUP_WAS" ] && setting "$AUTOGROUP" "$AUTOGROUP_WAS"
    true
}
# A private S3-compatible server on 127.0.0.1 (SeaweedFS from PyPI) for the
# object-store tests; stopped when this script ends.
eval "$(scripts/s3-server.sh start target/s3-server)"
trap 'scripts/s3-server.sh stop target/s3-server; restore' EXIT
setting "$URING" N || true
set +e
# The vendored fuser's own unit tests (its ring buffers among them).
CARGO_TARGET_DIR=target/fuser cargo test --manifest-path third_party/fuser/Cargo.toml --lib 2>&1 | tee target/test-output.log
status=${PIPESTATUS[0]}
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee -a target/test-output.log
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# The core store's round-trip and property suites again, on the S3 backend.
STRATA_TEST_BACKEND=s3 cargo test --test store --test model 2>&1 | tee -a target/test-output.log
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# The whole system under load for 2 minutes: readers, commits, policy
# materializations, sweeps, retention, SIGKILLed daemons and committers.
scripts/soak --duration "${STRATA_SOAK_SECONDS:-120}" 2>&1 | tee target/soak-output.log
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# The mount tests and the soak again, requests coming over io_uring.
if setting "$URING" Y && { [ ! -e "$AUTOGROUP" ] || setting "$AUTOGROUP" 0; }; then
    cargo test -p strata-mountd --test mount --no-fail-fast 2>&1 | tee -a target/test-output.log
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    cargo test --test cli 2>&1 | tee -a target/test-output.log
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    scripts/soak --duration "${STRATA_SOAK_SECONDS:-120}" 2>&1 | tee -a target/soak-output.log
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
else
    echo "this kernel has no FUSE over io_uring: its mount tests are skipped" | tee -a target/test-output.log
fi
set -e
# One plain closing line with the totals of every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test-output.log
grep '^soak:' target/soak-output.log
exit "$status"
