#!/usr/bin/env bash
# Mount benchmark: the same tree read through the native filesystem, a strata
# mount, squashfuse_ll on a squashfs image of it, and `restic mount` of a
# restic snapshot of it, side by side in one run, cold (page, dentry and
# inode caches dropped before each command) and warm (each command run once
# untimed, then timed).
#   scripts/bench/mount.sh [mixed|wide1m] [WORKDIR]
#     mixed:  30k files, 1.5 GiB with a 512 MiB file (default; ~6 GiB of disk)
#     wide1m: 1M small files in 1,000 directories (~3 GiB of disk)
#   WORKDIR defaults to target/bench-mount-<tree>.
#   TARGETS="native strata" measures only those (default: all four; the
#   documented runs use all four).
# Prints a Markdown table and writes it to WORKDIR/mount-results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
KIND="${1:-mixed}"
case "$KIND" in mixed|wide1m) ;; *) echo "usage: $0 [mixed|wide1m] [WORKDIR]" >&2; exit 2 ;; esac
WORK="${2:-$ROOT/target/bench-mount-$KIND}"
. "$ROOT/scripts/bench/lib.sh"
ORDER="${TARGETS:-native strata squashfuse_ll restic}"
has() { [[ " $ORDER " == *" $1 "* ]]; }
need bc:bc /usr/bin/time:time
if has squashfuse_ll; then need mksquashfs:squashfs-tools squashfuse_ll:squashfuse fusermount3:fuse3; fi
if has restic; then need restic:restic; fi
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR="$WORK/restic-cache"
cleanup() {
    for m in "$WORK"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
    [ -n "${RESTIC_PID:-}" ] && kill "$RESTIC_PID" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
rm -rf "$WORK" && mkdir -p "$WORK"/mnt-strata "$WORK"/mnt-squash "$WORK"/mnt-restic
RESULTS="$WORK/mount-results.md"
TREE="$WORK/$KIND"

echo "generating $KIND tree..." >&2
python3 "$ROOT/scripts/bench/gentree.py" "$KIND" "$TREE"
"$STRATA" --store "$WORK/store" init >/dev/null
"$STRATA" --store "$WORK/store" commit --set b "$TREE" >/dev/null
if has squashfuse_ll; then
    mksquashfs "$TREE" "$WORK/tree.sqfs" -comp zstd -no-progress -quiet >/dev/null
fi
if has restic; then
    restic init --repo "$WORK/restic" >/dev/null
    restic --repo "$WORK/restic" backup -q "$TREE"
fi

start=$(date +%s.%N)
"$STRATA" --store "$WORK/store" mount "$WORK/mnt-strata" >/dev/null
ready_strata=$(echo "$(date +%s.%N) - $start" | bc)
if has squashfuse_ll; then squashfuse_ll "$WORK/tree.sqfs" "$WORK/mnt-squash"; fi
ready_restic=0
if has restic; then
    start=$(date +%s.%N)
    restic --repo "$WORK/restic" mount "$WORK/mnt-restic" >/dev/null 2>&1 &
    RESTIC_PID=$!
    until [ -d "$WORK/mnt-restic/snapshots/latest" ]; do sleep 0.05; done
    ready_restic=$(echo "$(date +%s.%N) - $start" | bc)
fi

declare -A DIRS=(
    [native]="$TREE"
    [strata]="$WORK/mnt-strata/b/latest/"
    [squashfuse_ll]="$WORK/mnt-squash"
    [restic]="$WORK/mnt-restic/snapshots/latest$TREE"
)

# t CMD... : wall seconds (">LIMIT s" when a command runs over the limit)
LIMIT="${LIMIT:-900}"
t() {
    local rc=0
    timeout "$LIMIT" /usr/bin/time -f "%e" -o "$WORK/t.out" "$@" >/dev/null 2>&1 || rc=$?
    if [ "$rc" = 124 ]; then echo ">$LIMIT s"; return; fi
    [ "$rc" = 0 ] || echo "failed: $*" >&2
    cat "$WORK/t.out"
}
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# m MODE CMD... : cold = drop caches first; warm = run once untimed first
m() {
    local mode="$1"; shift
    if [ "$mode" = cold ]; then cold; else timeout "$LIMIT" "$@" >/dev/null 2>&1 || true; fi
    t "$@"
}

printf '# mount benchmark, %s, %s cores, kernel %s\n\n' "$(date -u +%F)" "$(nproc)" "$(uname -r)" | tee "$RESULTS"
printf 'tree: %s files, %s bytes; mount ready: strata %.2f s, restic %.2f s\n\n' "$(find "$TREE" -type f | wc -l)" "$(du -sb "$TREE" | cut -f1)" "$ready_strata" "$ready_restic" | tee -a "$RESULTS"
printf '| target | cache | find \\| wc -l | ls -lR | grep -r | cat 512 MiB file |\n|---|---|---|---|---|---|\n' | tee -a "$RESULTS"
for name in $ORDER; do
    d="${DIRS[$name]}"
    for cache in cold warm; do
        f=$(m "$cache" bash -c "find '$d' | wc -l")
        l=$(m "$cache" ls -lR "$d")
        g=$(m "$cache" bash -c "grep -r -q needle-that-is-not-there '$d' || true")
        c=-
        [ -f "$d/media/big.bin" ] && c=$(m "$cache" cat "$d/media/big.bin")
        printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$cache" "$f" "$l" "$g" "$c" | tee -a "$RESULTS"
    done
done
pid=$(pgrep -f "strata-mountd --store $WORK/store" | head -1)
printf '\nstrata-mountd RSS after the walks: %s\n' "$(grep VmRSS /proc/"$pid"/status | awk '{print $2 " " $3}')" | tee -a "$RESULTS"
"$STRATA" --store "$WORK/store" unmount "$WORK/mnt-strata" >/dev/null
echo "results: $RESULTS" >&2
