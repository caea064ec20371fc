#!/usr/bin/env bash
# Getting data back out, side by side in one run on the mixed tree (30k
# files, 1.5 GiB with a 512 MiB file):
#   restore: `strata restore` vs `restic restore` vs `cp -a` from the native
#            tree, each into an empty directory with page, dentry and inode
#            caches dropped first; ROUNDS rounds in turn, medians.
#   export:  `strata export | cat >/dev/null` vs `tar -c | cat >/dev/null` of
#            the native tree (cold; the pipe keeps GNU tar from skipping
#            reads into /dev/null).
#   copy:    a set of 20 generations (the tree, then 19 commits each
#            rewriting 1% of its small files) copied from a local store to a
#            store on a local S3-compatible server (scripts/s3-server.sh):
#            objects, bytes and requests sent vs the source store's unique
#            bytes (every content-named object), then one more commit and an
#            incremental copy.
#   scripts/bench/restore.sh [WORKDIR]   (default target/bench-restore; ~10 GiB)
# Prints a Markdown table and writes it to WORKDIR/restore-results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
WORK="${1:-$ROOT/target/bench-restore}"
. "$ROOT/scripts/bench/lib.sh"
need bc:bc restic:restic rsync:rsync
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
ROUNDS="${ROUNDS:-3}"
export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR="$WORK/restic-cache"
eval "$("$ROOT/scripts/s3-server.sh" start "$WORK/server")"
trap '"$ROOT/scripts/s3-server.sh" stop "$WORK/server"' EXIT
TREE="$WORK/tree"
ST="$WORK/store"
RESULTS="$WORK/restore-results.md"
# The store's content-named object directories that exist.
objdirs() { for d in manifests segments packs blobs chunks chunklists; do [ -d "$ST/$d" ] && echo "$ST/$d"; done; }
count_objects() { find $(objdirs) -type f | wc -l; }
secs() { local s; s=$(date +%s.%N); "$@" >"$WORK/out" 2>"$WORK/err"; echo "$(date +%s.%N) - $s" | bc; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { echo "scale=2; $1 / $2" | bc; }

# The copy phase changes the tree: it is generated afresh each run.
rm -f "$WORK/tree.done"
if [ "$(cat "$WORK/tree.done" 2>/dev/null)" != mixed ]; then
    echo "generating the mixed tree..." >&2
    rm -rf "$TREE" && mkdir -p "$WORK"
    python3 "$ROOT/scripts/bench/gentree.py" mixed "$TREE"
    echo mixed > "$WORK/tree.done"
fi
rm -rf "$ST" "$WORK/restic" "$WORK"/out-* "$WORK/s3host"
"$STRATA" --store "$ST" init >/dev/null
"$STRATA" --store "$ST" commit --set b "$TREE" >/dev/null
restic init --repo "$WORK/restic" >/dev/null
restic --repo "$WORK/restic" backup -q "$TREE"

declare -A T=([strata]="" [restic]="" [cp]="")
for round in $(seq "$ROUNDS"); do
    echo "restore round $round..." >&2
    rm -rf "$WORK"/out-*; cold
    T[strata]+=" $(secs "$STRATA" --store "$ST" restore --set b "$WORK/out-strata")"
    cold
    T[restic]+=" $(secs restic --repo "$WORK/restic" restore latest --target "$WORK/out-restic")"
    cold
    T[cp]+=" $(secs cp -a "$TREE" "$WORK/out-cp")"
done
# The last round's restore is the committed tree, attribute for attribute.
diffs=$(rsync -aHAXn --delete --itemize-changes "$TREE/" "$WORK/out-strata/" | wc -l)
rm -rf "$WORK"/out-*
s=$(median ${T[strata]}); r=$(median ${T[restic]}); c=$(median ${T[cp]})

echo "export..." >&2
cold; ex=$(secs bash -c "'$STRATA' --store '$ST' export --set b | cat >/dev/null")
cold; tc=$(secs bash -c "tar -C '$TREE' -cf - . | cat >/dev/null")
tree_bytes=$(du -sb --apparent-size "$TREE" | cut -f1)

# rewrite_1pct SEED: rewrite 64 bytes of 1% of the tree's small files.
rewrite_1pct() {
    python3 - "$TREE" "$1" <<'PY'
import os, random, sys
root, g = sys.argv[1], int(sys.argv[2])
files = sorted(os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns)
rng = random.Random(g)
small = [f for f in files if os.path.getsize(f) < (1 << 20)]
for f in rng.sample(small, len(small) // 100):
    with open(f, "r+b") as fh:
        fh.write(rng.randbytes(64))
PY
}
echo "20 generations..." >&2
for g in $(seq 2 20); do
    rewrite_1pct "$g"
    "$STRATA" --store "$ST" commit --set b "$TREE" >/dev/null
done
unique=$(du -sbc --apparent-size $(objdirs) | tail -1 | cut -f1)
objects=$(count_objects)
TO="s3://$STRATA_TEST_S3_BUCKET/bench-copy-$(date +%s)"
S3=(--s3-endpoint "$STRATA_TEST_S3_ENDPOINT" --allow-http)
copy() {
    XDG_CACHE_HOME="$WORK/s3host" STRATA_REQUEST_STATS=1 \
        "$STRATA" --store "$ST" "${S3[@]}" copy --to "$TO" --json
}
copy_s=$(secs copy)
sent=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["objects_sent"], d["bytes_sent"])' "$WORK/out")
requests=$(grep -o 'requests: .*' "$WORK/err" | tr ' ' '\n' | awk -F= '$1 ~ /^(get|get_range|head|put|list|delete)$/ {s += $2} END {print s + 0}')
read -r sent_objects sent_bytes <<<"$sent"
rewrite_1pct 21
before=$(count_objects)
"$STRATA" --store "$ST" commit --set b "$TREE" >/dev/null
added=$(( $(count_objects) - before ))
inc_s=$(secs copy)
inc=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["objects_sent"], d["bytes_sent"])' "$WORK/out")
inc_requests=$(grep -o 'requests: .*' "$WORK/err" | tr ' ' '\n' | awk -F= '$1 ~ /^(get|get_range|head|put|list|delete)$/ {s += $2} END {print s + 0}')

{
    echo "### Restore, export and copy of the mixed tree ($(date -u +%F), $ROUNDS rounds, medians)"
    echo
    echo "| operation | seconds | vs cp -a / tar -c |"
    echo "|---|---|---|"
    echo "| cp -a from native | $c | 1.00 |"
    echo "| strata restore | $s | $(ratio "$s" "$c") |"
    echo "| restic restore | $r | $(ratio "$r" "$c") |"
    echo "| tar -c of native | $tc | 1.00 |"
    echo "| strata export | $ex | $(ratio "$ex" "$tc") |"
    echo
    echo "rsync -aHAXn lines between the tree and strata's restore: $diffs."
    echo "Export throughput: $(echo "scale=0; $tree_bytes / $ex / 1048576" | bc) MiB/s (tar -c $(echo "scale=0; $tree_bytes / $tc / 1048576" | bc) MiB/s)."
    echo
    echo "| copy local -> S3, 20 generations | value |"
    echo "|---|---|"
    echo "| source objects / unique bytes | $objects / $unique |"
    echo "| objects / bytes sent | $sent_objects / $sent_bytes |"
    echo "| bytes sent / unique bytes | $(echo "scale=4; $sent_bytes / $unique" | bc) |"
    echo "| requests | $requests |"
    echo "| seconds | $copy_s |"
    echo "| after one more commit: objects added / sent | $added / ${inc% *} |"
    echo "| incremental bytes sent, requests, seconds | ${inc#* }, $inc_requests, $inc_s |"
} | tee "$RESULTS"
