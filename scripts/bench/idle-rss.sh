#!/usr/bin/env bash
# Daemon memory after walking a tree and after idling, for two strata-mountd
# binaries side by side (each twice, in alternating order): mount, two
# `grep -r`, a `cat` of every file, RSS; then IDLE seconds without a
# request, RSS again.
#   scripts/bench/idle-rss.sh DAEMON_A DAEMON_B [tiny100k|wide1m] [WORKDIR]
#   (WORKDIR defaults to target/bench-idle-<tree>; IDLE defaults to 45)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
. "$ROOT/scripts/bench/lib.sh"
A="$1" B="$2" KIND="${3:-tiny100k}"
WORK="${4:-$ROOT/target/bench-idle-$KIND}"
IDLE="${IDLE:-45}"
cargo build --quiet
STRATA="$ROOT/target/debug/strata"
mkdir -p "$WORK/mnt"
committed_tree "$STRATA" "$KIND" "$WORK"
measure() {
    local bin=$1 pid
    "$bin" --store "$WORK/st" "$WORK/mnt" 2>/dev/null &
    pid=$!
    until mountpoint -q "$WORK/mnt"; do sleep 0.1; done
    rss() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status"; }
    grep -r zzzz "$WORK/mnt/b/latest/" >/dev/null || true
    grep -r zzzz "$WORK/mnt/b/latest/" >/dev/null || true
    find "$WORK/mnt/b/latest/" -type f -exec cat {} + >/dev/null
    local walked; walked=$(rss)
    sleep "$IDLE"
    echo "| $bin | $walked MiB | $(rss) MiB |"
    umount -l "$WORK/mnt"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
echo "| daemon | RSS after the walks | RSS after ${IDLE} s idle |"
echo "|---|---|---|"
for bin in "$A" "$B" "$B" "$A"; do measure "$bin"; done
