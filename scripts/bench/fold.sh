#!/usr/bin/env bash
# Materialization benchmark: fold a 1M-row base with a 100k-row delta into a
# new base, against `sort -m` of the same rows as text (the physical
# reference for a sort-merge of pre-sorted inputs), and the latency of a cold
# metadata walk of a mounted generation while the fold runs.
#   scripts/bench/fold.sh [WORKDIR]     (default: target/bench-fold)
# The tree (1M empty files in 1,000 directories) lives on /dev/shm so that
# making it takes seconds; the store lives in WORKDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
WORK="${1:-$ROOT/target/bench-fold}"
. "$ROOT/scripts/bench/lib.sh"
need /usr/bin/time:time
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
SHM="$(mktemp -d /dev/shm/strata-fold.XXXXXX)"
cleanup() {
    mountpoint -q "$WORK/mnt" 2>/dev/null && umount -l "$WORK/mnt"
    rm -rf "$SHM"
}
trap cleanup EXIT
rm -rf "$WORK" && mkdir -p "$WORK/mnt"
RESULTS="$WORK/fold-results.md"
TREE="$SHM/tree"

echo "making 1M files..." >&2
python3 - "$TREE" <<'EOF'
import os, sys
root = sys.argv[1]
for d in range(1000):
    p = os.path.join(root, f"d{d:03d}")
    os.makedirs(p)
    for i in range(1000):
        open(os.path.join(p, f"f{d * 1000 + i:07d}"), "w").close()
EOF
S() { "$STRATA" --store "$WORK/store" "$@"; }
S init >/dev/null
S commit --set a "$TREE" >/dev/null
S commit --set b "$TREE" >/dev/null
echo "changing 100k files..." >&2
python3 - "$TREE" <<'EOF'
import os, sys
root = sys.argv[1]
for d in range(1000):
    for i in range(0, 1000, 10):
        p = os.path.join(root, f"d{d:03d}", f"f{d * 1000 + i:07d}")
        os.utime(p, ns=(1_600_000_000_000_000_000 + i, 1_600_000_000_000_000_000 + i))
EOF
S commit --set a "$TREE" >/dev/null
S commit --set b "$TREE" >/dev/null
rows=$(S log --set a --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["files"])')

# Reference: the same rows as sorted text lines, merged with sort -m.
( cd "$TREE" && find . -printf '%h\t%f\t%s\t%T@\t%m\n' | LC_ALL=C sort > "$WORK/base.txt" )
( cd "$TREE" && find . -name 'f???????' -printf '%h\t%f\t%s\t%T@\t%m\n' | awk 'NR % 10 == 1' | LC_ALL=C sort > "$WORK/delta.txt" )
sync
/usr/bin/time -f "%e %M" -o "$WORK/sort.t" env LC_ALL=C sort -m "$WORK/base.txt" "$WORK/delta.txt" > /dev/null
read -r sort_s sort_kb < "$WORK/sort.t"

# Cold walk of generation 1 through a mount, idle.
S mount --no-materialize "$WORK/mnt" >/dev/null
walk() { sync; echo 3 > /proc/sys/vm/drop_caches; /usr/bin/time -f "%e" -o "$WORK/walk.t" find "$WORK/mnt/a/gens/1" -printf '%s\n' > /dev/null; cat "$WORK/walk.t"; }
idle=$(walk)

# The fold of set a alone, in its own process (not through the daemon, so
# its time and peak RSS are its own); then the same fold of set b while a
# cold walk runs, for the walk's latency.
sync
/usr/bin/time -f "%e %M" -o "$WORK/fold.t" "$STRATA" --store "$WORK/store" materialize --in-process --set a --json > "$WORK/fold.json"
read -r fold_s fold_kb < "$WORK/fold.t"
"$STRATA" --store "$WORK/store" materialize --in-process --set b > /dev/null &
fold_pid=$!
busy=$(walk)
wait "$fold_pid"
S unmount "$WORK/mnt" >/dev/null
state=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' "$WORK/fold.json")

in_rows=$(( $(wc -l < "$WORK/base.txt") + $(wc -l < "$WORK/delta.txt") ))
{
printf '# fold benchmark, %s, %s cores, kernel %s\n\n' "$(date -u +%F)" "$(nproc)" "$(uname -r)"
printf 'base: %s files (%s rows as text), delta: %s rows; task state: %s\n\n' "$rows" "$(wc -l < "$WORK/base.txt")" "$(wc -l < "$WORK/delta.txt")" "$state"
printf '| what | seconds | input rows/s | peak RSS |\n|---|---|---|---|\n'
printf '| strata materialize (fold + verify + publish) | %s | %.0f | %s MiB |\n' "$fold_s" "$(echo "$in_rows / $fold_s" | bc -l)" "$((fold_kb / 1024))"
printf '| sort -m of the same rows as text | %s | %.0f | %s MiB |\n' "$sort_s" "$(echo "$in_rows / $sort_s" | bc -l)" "$((sort_kb / 1024))"
printf '\ncold `find -printf %%s` of a generation through the mount: idle %s s, while another set is folded %s s\n' "$idle" "$busy"
} | tee "$RESULTS"
echo "results: $RESULTS" >&2
