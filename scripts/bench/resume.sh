#!/usr/bin/env bash
# Resume after a kill at journal-sealed vs a full first commit, side by side.
#   scripts/bench/resume.sh [SIZE_MIB] [WORK]
# Writes a tree of SIZE_MIB (default 1200) MiB (one large file per 100 MiB
# plus 2,000 small files), then: a full first commit (timed); a fresh store
# whose first commit is killed at journal-sealed; the rerun (timed).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=${1:-1200}; W=${2:-$(mktemp -d)}
BIN=${STRATA_BIN_DIR:-target/debug}/strata
src=$W/src; rm -rf "$W/full" "$W/resumed"; mkdir -p "$src"
if [ ! -e "$src/.made" ]; then
  for i in $(seq 1 $((SIZE / 100))); do head -c $((100 << 20)) /dev/urandom > "$src/large$i"; done
  for i in $(seq 1 2000); do head -c $((i * 7 % 9000 + 100)) /dev/urandom > "$src/s$((i % 20))-$i" 2>/dev/null || { mkdir -p "$src"; }; done
  touch "$src/.made"; sleep 1
fi
sync
secs() { local t0=$(date +%s.%N); "$@" > /dev/null; echo "$(date +%s.%N) - $t0" | bc; }
$BIN --store "$W/full" init > /dev/null
full=$(secs $BIN --store "$W/full" commit --set s "$src")
$BIN --store "$W/resumed" init > /dev/null
STRATA_FAILPOINTS=journal-sealed=kill $BIN --store "$W/resumed" commit --set s "$src" > /dev/null 2>&1 || true
resumed=$(secs $BIN --store "$W/resumed" commit --set s "$src")
$BIN --store "$W/resumed" verify --all > /dev/null
echo "tree ${SIZE} MiB: full first commit ${full} s; rerun after a kill at journal-sealed ${resumed} s; ratio $(echo "scale=3; $resumed / $full" | bc)"
