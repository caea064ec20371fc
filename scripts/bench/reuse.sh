#!/usr/bin/env bash
# Verified reuse benchmark: commits of a tree identical to one already in the
# store, each into a set of its own (no parent, so nothing is deduplicated by
# parent: every object whose name exists is looked up, and checked before it
# is adopted), by this build and by an earlier one, alternating on one store.
#   BEFORE_BIN=PATH scripts/bench/reuse.sh [WORKDIR]   (default: target/bench-reuse)
#   STRATA_BIN=PATH    this build's strata (default: the release build, built here)
#   TREES="mixed wide" ROUNDS=3
# Trees come from gentree.py (mixed: 30,000 files, 1.4 GB, one 512 MiB file;
# wide: 300,000 small files). Needs ~12 GiB with both trees and 3 rounds.
# Prints a Markdown table (medians of the rounds: wall seconds, CPU seconds
# user + system, which a shared machine disturbs less; peak RSS) and writes
# it to WORKDIR/reuse-results.md (each round's figures: WORKDIR/TREE-BUILD.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
WORK="${1:-$ROOT/target/bench-reuse}"
TREES="${TREES:-mixed wide}"
ROUNDS="${ROUNDS:-3}"
. "$ROOT/scripts/bench/lib.sh"
need /usr/bin/time:time
BEFORE="${BEFORE_BIN:?BEFORE_BIN=path of the earlier strata binary}"
if [ -z "${STRATA_BIN:-}" ]; then
    cargo build --release --quiet --bin strata
    STRATA_BIN="$ROOT/target/release/strata"
fi
rm -rf "$WORK" && mkdir -p "$WORK"
RESULTS="$WORK/reuse-results.md"

# timed BIN STORE SET TREE: wall seconds, CPU seconds and peak RSS KiB of one commit
timed() {
    sync
    /usr/bin/time -f "%e %U %S %M" -o "$WORK/time.out" "$1" --store "$2" commit --set "$3" "$4" \
        >"$WORK/last.out" 2>"$WORK/last.err" || { cat "$WORK/last.err"; exit 1; }
    # Nothing in these stores is damaged: a replacement would be a bug.
    if grep -q replaced "$WORK/last.err"; then cat "$WORK/last.err" >&2; exit 1; fi
    awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$WORK/time.out"
}

median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

printf '| tree | build | wall s (median of %s) | CPU s | peak RSS MiB |\n|---|---|---|---|---|\n' "$ROUNDS" | tee "$RESULTS"
for kind in $TREES; do
    tree="$WORK/$kind" store="$WORK/store-$kind"
    echo "generating $kind tree..." >&2
    python3 "$ROOT/scripts/bench/gentree.py" "$kind" "$tree"
    "$STRATA_BIN" --store "$store" init >/dev/null
    timed "$BEFORE" "$store" first "$tree" >/dev/null
    for r in $(seq 1 "$ROUNDS"); do
        timed "$BEFORE" "$store" "before-$r" "$tree" >>"$WORK/$kind-before.txt"
        timed "$STRATA_BIN" "$store" "after-$r" "$tree" >>"$WORK/$kind-after.txt"
    done
    for build in before after; do
        secs=$(cut -d' ' -f1 "$WORK/$kind-$build.txt" | median)
        cpu=$(cut -d' ' -f2 "$WORK/$kind-$build.txt" | median)
        rss=$(cut -d' ' -f3 "$WORK/$kind-$build.txt" | sort -n | tail -1)
        printf '| %s | %s | %s | %s | %d |\n' "$kind" "$build" "$secs" "$cpu" $((rss / 1024)) | tee -a "$RESULTS"
    done
    rm -rf "$tree"
done
