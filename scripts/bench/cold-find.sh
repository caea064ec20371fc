#!/usr/bin/env bash
# Cold `find | wc -l` of a strata mount and of squashfuse_ll, alternated
# ROUNDS times (default 5) on the store and squashfs image that
# `scripts/bench/mount.sh` left in WORKDIR: a single cold run of a walk that
# takes half a second moves by a tenth of one with the machine's noise.
# Each strata round mounts afresh (no daemon cache), each round drops the
# kernel's caches first. Prints one line per run (seconds; for strata also
# the daemon's CPU time in the walk).
#   scripts/bench/cold-find.sh WORKDIR [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK="${1:?usage: $0 WORKDIR [ROUNDS]}"
ROUNDS="${2:-5}"
STRATA="$PWD/target/release/strata"
MNT="$WORK/mnt-cold-find"
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && umount -l "$MNT"; true' EXIT
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
walk() { /usr/bin/time -f %e bash -c "find '$1' | wc -l" 2>&1 >/dev/null; }
cpu() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$1/stat"; }
for _ in $(seq "$ROUNDS"); do
    "$STRATA" --store "$WORK/store" mount "$MNT" >/dev/null
    pid=$(pgrep -f "strata-mountd --store $WORK/store" | head -1)
    cold
    before=$(cpu "$pid")
    t=$(walk "$MNT/b/latest/")
    echo "strata $t s (daemon cpu $(echo "$(cpu "$pid") - $before" | bc) s)"
    "$STRATA" --store "$WORK/store" unmount "$MNT" >/dev/null
    squashfuse_ll "$WORK/tree.sqfs" "$MNT"
    cold
    echo "squashfuse_ll $(walk "$MNT") s"
    umount "$MNT"
done
