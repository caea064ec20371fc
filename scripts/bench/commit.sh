#!/usr/bin/env bash
# Commit benchmark: strata vs restic backup vs the bare floor (find + b3sum of
# the changed bytes), side by side in one run on generated trees.
#   scripts/bench/commit.sh [WORKDIR]      (default: target/bench; needs ~8 GiB)
# Prints a Markdown table and writes it to WORKDIR/commit-results.md.
# Caches are warm for every tool alike (trees were just written; `sync` first).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
WORK="${1:-$ROOT/target/bench}"
. "$ROOT/scripts/bench/lib.sh"
need restic:restic b3sum:b3sum /usr/bin/time:time
cargo build --release --quiet
STRATA="$ROOT/target/release/strata"
export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR="$WORK/restic-cache"
rm -rf "$WORK" && mkdir -p "$WORK"
RESULTS="$WORK/commit-results.md"

# run LABEL CMD... : wall seconds and peak RSS (MiB) via GNU time
run() {
    local label="$1"; shift
    sync
    /usr/bin/time -f "%e %M" -o "$WORK/time.out" "$@" >"$WORK/last.out" 2>"$WORK/last.err" || { cat "$WORK/last.err"; exit 1; }
    read -r secs kib <"$WORK/time.out"
    printf '| %s | %s | %d |\n' "$label" "$secs" $((kib / 1024)) | tee -a "$RESULTS"
    eval "T_$(echo "$label" | tr -c 'a-zA-Z0-9\n' '_')=$secs"
}

floor() { # floor TREE LIST : find over the tree + b3sum of the listed files
    find "$1" -printf '%s %T@\n' >/dev/null
    (cd "$1" && tr '\n' '\0' <"$2" | xargs -0 -r b3sum >/dev/null)
}
export -f floor

bench_tree() {
    local kind="$1" tree="$WORK/$1"
    echo "generating $kind tree..." >&2
    python3 "$ROOT/scripts/bench/gentree.py" "$kind" "$tree"
    local files bytes
    files=$(find "$tree" -type f | wc -l); bytes=$(du -sb "$tree" | cut -f1)
    printf '\n### %s tree: %s files, %s bytes\n\n| step | seconds | peak RSS MiB |\n|---|---|---|\n' "$kind" "$files" "$bytes" | tee -a "$RESULTS"
    "$STRATA" --store "$WORK/store-$kind" init >/dev/null
    restic init --repo "$WORK/restic-$kind" >/dev/null
    sleep 0.2
    run "$kind strata commit (first)" "$STRATA" --store "$WORK/store-$kind" commit --set b "$tree"
    run "$kind restic backup (first)" restic --repo "$WORK/restic-$kind" backup -q "$tree"
    local changed
    changed=$(python3 "$ROOT/scripts/bench/gentree.py" change "$tree" 1 "$WORK/changed-$kind.txt")
    echo "changed $changed files" >&2
    sleep 0.2
    run "$kind floor: find + b3sum changed" bash -c "floor '$tree' '$WORK/changed-$kind.txt'"
    run "$kind strata commit (1% changed)" "$STRATA" --store "$WORK/store-$kind" commit --set b "$tree"
    run "$kind restic backup (1% changed)" restic --repo "$WORK/restic-$kind" backup -q "$tree"
    head -n 10 "$WORK/changed-$kind.txt" > "$WORK/ten-$kind.txt"
    python3 - "$tree" "$WORK/ten-$kind.txt" <<'PY'
import sys, os
root, lst = sys.argv[1], sys.argv[2]
for rel in open(lst).read().split():
    with open(os.path.join(root, rel), "ab") as f:
        f.write(b"ten-path change\n")
PY
    run "$kind strata commit --paths-from (10 paths)" "$STRATA" --store "$WORK/store-$kind" commit --set b --paths-from "$WORK/ten-$kind.txt" "$tree"
    printf '\nstore sizes: strata %s, restic %s\n' "$(du -sh "$WORK/store-$kind" | cut -f1)" "$(du -sh "$WORK/restic-$kind" | cut -f1)" | tee -a "$RESULTS"
    "$STRATA" --store "$WORK/store-$kind" verify --set b --all | tail -1
    rm -rf "$tree"
}

printf '# commit benchmark, %s, %s cores, kernel %s\n' "$(date -u +%F)" "$(nproc)" "$(uname -r)" | tee "$RESULTS"
bench_tree mixed
bench_tree wide
echo "results: $RESULTS" >&2
