#!/usr/bin/env bash
# Cold reads through two strata-mountd binaries side by side, against the
# native tree, on the mixed tree (gentree.py): both daemons serve the same
# store at once, the targets alternate their order each round (native
# first), and the page, dentry and inode caches are dropped before every
# command. Per target and round: a cold `cat` of the 512 MiB file and the
# daemon CPU seconds it took; 8 cold greps at once over disjoint subtrees
# (every 8th top-level directory each), with when the lane holding
# `media/` (the 512 MiB file) finished its `media/` part, when the other
# seven lanes finished, and when all did; and a cold `ls -lR`.
#   scripts/bench/read-ab.sh DAEMON_A DAEMON_B [ROUNDS] [WORKDIR]
#   ARGS_A / ARGS_B: extra daemon arguments (e.g. ARGS_B=--no-acl).
#   ROUNDS defaults to 4; WORKDIR to target/bench-read-ab (~3 GiB of disk).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
. "$ROOT/scripts/bench/lib.sh"
need bc:bc /usr/bin/time:time
A="$1" B="$2" ROUNDS="${3:-4}"
WORK="${4:-$ROOT/target/bench-read-ab}"
cargo build --release --quiet
STRATA="$ROOT/target/release/strata"
mkdir -p "$WORK/mnt-A" "$WORK/mnt-B"
committed_tree "$STRATA" mixed "$WORK"
declare -A DIR=([native]="$WORK/tree/" [A]="$WORK/mnt-A/b/latest/" [B]="$WORK/mnt-B/b/latest/") PID=()
cleanup() {
    for t in A B; do mountpoint -q "$WORK/mnt-$t" && umount -l "$WORK/mnt-$t"; done
    for t in A B; do [ -n "${PID[$t]:-}" ] && kill "${PID[$t]}" 2>/dev/null; done
    true
}
trap cleanup EXIT
cleanup
# shellcheck disable=SC2086 # ARGS_* are word lists
"$A" --store "$WORK/st" ${ARGS_A:-} "$WORK/mnt-A" 2>/dev/null &
PID[A]=$!
# shellcheck disable=SC2086
"$B" --store "$WORK/st" ${ARGS_B:-} "$WORK/mnt-B" 2>/dev/null &
PID[B]=$!
until mountpoint -q "$WORK/mnt-A" && mountpoint -q "$WORK/mnt-B"; do sleep 0.05; done
# A daemon hashes an assembled copy it did not make at its first open, and
# the first open ever makes the copy: keep both out of the timed reads.
for t in A B; do cat "${DIR[$t]}/media/big.bin" >/dev/null; done
mapfile -t TOPS < <(cd "$WORK/tree" && ls | sort)

# cpu TARGET: the daemon's CPU seconds so far (0 for native)
cpu() {
    [ "$1" = native ] && { echo 0; return; }
    awk '{print ($14 + $15) / 100}' "/proc/${PID[$1]}/stat"
}
printf '| round | target | cat 512 MiB | daemon CPU | 8 greps: media/ done | other 7 lanes done | all done | ls -lR |\n|---|---|---|---|---|---|---|---|\n'
for r in $(seq "$ROUNDS"); do
    order="native A B"
    [ $((r % 2)) = 0 ] && order="native B A"
    for t in $order; do
        d=${DIR[$t]}
        cold; c0=$(cpu "$t"); c=$(elapsed "$WORK" cat "$d/media/big.bin"); c1=$(cpu "$t")
        cold; p=$(par8 "$d" "$WORK")
        cold; l=$(elapsed "$WORK" ls -lR "$d")
        printf '| %s | %s | %s | %s | %s | %s |\n' "$r" "$t" "$c" "$(echo "$c1 - $c0" | bc)" "$p" "$l"
    done
done
