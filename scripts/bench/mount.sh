#!/usr/bin/env bash
# Mount benchmark: the same tree read through the native filesystem, a strata
# mount (files opened by the kernel: `--opens none`, the default; requests
# over io_uring where the daemon takes it, docs/OPERATIONS.md), a second
# strata mount whose opens reach the daemon
# (`--opens each`: large files by passthrough), optionally a third with
# `--no-acl` (target strata-noacl: no ACL round trip per file in a cold
# ls -lR) and a fourth taking requests through /dev/fuse even where the
# kernel offers FUSE over io_uring (target strata-dev: `--no-io-uring`),
# squashfuse_ll on a squashfs image of it, and `restic mount` of a restic
# snapshot of it, side by side
# in one run, cold (page, dentry and inode caches dropped before each
# command) and warm (each command run once untimed, then timed). Phases:
# find, ls -lR, grep -r, cat of every file, 8 greps in parallel over
# disjoint subtrees, cat of the 512 MiB file (mixed tree); the RSS of each
# strata daemon after each row.
#   scripts/bench/mount.sh [mixed|tiny100k|wide1m] [WORKDIR]
#     mixed:    30k files, 1.5 GiB with a 512 MiB file (default; ~6 GiB of disk)
#     tiny100k: 100k files of 50-2,000 bytes in 100 directories
#     wide1m:   1M small files in 1,000 directories (~3 GiB of disk)
#   WORKDIR defaults to target/bench-mount-<tree>.
#   TARGETS="native strata" measures only those (default: all but
#   strata-noacl and strata-dev; the documented runs name theirs). ROUNDS=N measures
#   every target N times, the targets alternating within each round
#   (default 1): on a shared machine cold figures drift, so compare medians.
# Prints a Markdown table and writes it to WORKDIR/mount-results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
KIND="${1:-mixed}"
case "$KIND" in mixed|tiny100k|wide1m) ;; *) echo "usage: $0 [mixed|tiny100k|wide1m] [WORKDIR]" >&2; exit 2 ;; esac
WORK="${2:-$ROOT/target/bench-mount-$KIND}"
. "$ROOT/scripts/bench/lib.sh"
ORDER="${TARGETS:-native strata strata-each squashfuse_ll restic}"
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
rm -rf "$WORK" && mkdir -p "$WORK"/mnt-strata "$WORK"/mnt-strata-each "$WORK"/mnt-strata-noacl "$WORK"/mnt-strata-dev "$WORK"/mnt-squash "$WORK"/mnt-restic
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
if has strata-each; then "$STRATA" --store "$WORK/store" mount --opens each "$WORK/mnt-strata-each" >/dev/null; fi
if has strata-noacl; then "$STRATA" --store "$WORK/store" mount --no-acl "$WORK/mnt-strata-noacl" >/dev/null; fi
if has strata-dev; then "$STRATA" --store "$WORK/store" mount --no-io-uring "$WORK/mnt-strata-dev" >/dev/null; fi
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
    [strata-each]="$WORK/mnt-strata-each/b/latest/"
    [strata-noacl]="$WORK/mnt-strata-noacl/b/latest/"
    [strata-dev]="$WORK/mnt-strata-dev/b/latest/"
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
# m MODE CMD... : cold = drop caches first; warm = run once untimed first
m() {
    local mode="$1"; shift
    if [ "$mode" = cold ]; then cold; else timeout "$LIMIT" "$@" >/dev/null 2>&1 || true; fi
    t "$@"
}

printf '# mount benchmark, %s, %s cores, kernel %s\n\n' "$(date -u +%F)" "$(nproc)" "$(uname -r)" | tee "$RESULTS"
printf 'tree: %s files, %s bytes; mount ready: strata %.2f s, restic %.2f s\n\n' "$(find "$TREE" -type f | wc -l)" "$(du -sb "$TREE" | cut -f1)" "$ready_strata" "$ready_restic" | tee -a "$RESULTS"
# the RSS of target $1's daemon, or -
rss() {
    local pid
    pid=$(pgrep -f "strata-mountd .*$WORK/mnt-$1( |\$)" | head -1 || true)
    [ -n "$pid" ] && grep VmRSS /proc/"$pid"/status | awk '{printf "%d MiB", $2 / 1024}' || echo -
}
# 8 greps in parallel, each over every 8th top-level directory of $1
par8() {
    local d="$1" i
    mapfile -t tops < <(cd "$TREE" && ls | sort)
    for i in 0 1 2 3 4 5 6 7; do
        (for ((j = i; j < ${#tops[@]}; j += 8)); do grep -r -q needle-that-is-not-there "$d/${tops[j]}" || true; done) &
    done
    wait
}
export -f par8
export TREE
printf '| target | cache | find \\| wc -l | ls -lR | grep -r | cat all files | 8 greps | cat 512 MiB file | daemon RSS |\n|---|---|---|---|---|---|---|---|---|\n' | tee -a "$RESULTS"
for round in $(seq "${ROUNDS:-1}"); do
    [ "${ROUNDS:-1}" = 1 ] || echo "round $round" >&2
    for name in $ORDER; do
        d="${DIRS[$name]}"
        for cache in cold warm; do
            f=$(m "$cache" bash -c "find '$d' | wc -l")
            l=$(m "$cache" ls -lR "$d")
            g=$(m "$cache" bash -c "grep -r -q needle-that-is-not-there '$d' || true")
            a=$(m "$cache" bash -c "find '$d' -type f -exec cat {} + >/dev/null")
            p=$(m "$cache" bash -c "par8 '$d'")
            c=-
            [ -f "$d/media/big.bin" ] && c=$(m "$cache" cat "$d/media/big.bin")
            r=-
            case "$name" in strata*) r=$(rss "$name") ;; esac
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$cache" "$f" "$l" "$g" "$a" "$p" "$c" "$r" | tee -a "$RESULTS"
        done
    done
done
sleep 60
for name in strata strata-each strata-noacl strata-dev; do
    if has "$name"; then
        printf 'strata-mountd (%s) RSS idle a minute after the walks: %s\n' "$name" "$(rss "$name")" | tee -a "$RESULTS"
    fi
done
if has strata-each; then "$STRATA" --store "$WORK/store" unmount "$WORK/mnt-strata-each" >/dev/null; fi
if has strata-noacl; then "$STRATA" --store "$WORK/store" unmount "$WORK/mnt-strata-noacl" >/dev/null; fi
if has strata-dev; then "$STRATA" --store "$WORK/store" unmount "$WORK/mnt-strata-dev" >/dev/null; fi
"$STRATA" --store "$WORK/store" unmount "$WORK/mnt-strata" >/dev/null
echo "results: $RESULTS" >&2
