#!/usr/bin/env bash
# Daemon memory while walking a tree, for two strata-mountd binaries side by
# side (each twice, in alternating order): a fresh mount, `grep -r` of the
# whole generation, RSS; 8 greps at once over disjoint subtrees (every 8th
# top-level directory each), RSS; with the seconds each took.
#   scripts/bench/walk-rss.sh DAEMON_A DAEMON_B [wide1m|tiny100k] [WORKDIR]
#   (WORKDIR defaults to target/bench-walk-<tree>)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
. "$ROOT/scripts/bench/lib.sh"
A="$1" B="$2" KIND="${3:-wide1m}"
WORK="${4:-$ROOT/target/bench-walk-$KIND}"
cargo build --release --quiet
STRATA="$ROOT/target/release/strata"
mkdir -p "$WORK/mnt"
committed_tree "$STRATA" "$KIND" "$WORK"
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
par8() {
    local d=$1 i j pids=()
    mapfile -t tops < <(ls "$d")
    for i in 0 1 2 3 4 5 6 7; do
        (for ((j = i; j < ${#tops[@]}; j += 8)); do grep -r -q needle-not-there "$d/${tops[j]}" || true; done) &
        pids+=($!)
    done
    wait "${pids[@]}"
}
measure() {
    local bin=$1 pid t grep_s par8_s grep_rss
    "$bin" --store "$WORK/st" "$WORK/mnt" 2>/dev/null &
    pid=$!
    until mountpoint -q "$WORK/mnt"; do sleep 0.1; done
    rss() { awk '/VmRSS/ {printf "%d", $2 / 1024}' "/proc/$pid/status"; }
    t=$(now)
    grep -r -q needle-not-there "$WORK/mnt/b/latest/" || true
    grep_s=$(since "$t")
    grep_rss=$(rss)
    t=$(now)
    par8 "$WORK/mnt/b/latest/"
    par8_s=$(since "$t")
    printf '| %s | %.1f s | %s MiB | %.1f s | %s MiB |\n' "$bin" "$grep_s" "$grep_rss" "$par8_s" "$(rss)"
    umount -l "$WORK/mnt"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
echo "| daemon | grep -r | RSS after | 8 greps at once | RSS after |"
echo "|---|---|---|---|---|"
for bin in "$A" "$B" "$B" "$A"; do measure "$bin"; done
