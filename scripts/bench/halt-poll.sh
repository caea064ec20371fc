#!/usr/bin/env bash
# What a KVM guest's halt polling does to FUSE round trips: cold `ls -lR`
# (one GETXATTR round trip per inode, for its ACL) and 8 cold greps at once
# (every 8th top-level directory each) on the mixed tree (gentree.py),
# native and through one strata-mountd, with the guest's
# `guest_halt_poll_ns` at each of POLLS in turn, the order alternating each
# round; the setting is restored on exit. Needs the `haltpoll` cpuidle
# driver (a KVM guest) and root. Caches are dropped before every command.
#   scripts/bench/halt-poll.sh [ROUNDS] [WORKDIR]
#   POLLS defaults to "0 200000"; ROUNDS to 4; WORKDIR to
#   target/bench-halt-poll (~3 GiB of disk).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
. "$ROOT/scripts/bench/lib.sh"
need bc:bc /usr/bin/time:time
ROUNDS="${1:-4}"
WORK="${2:-$ROOT/target/bench-halt-poll}"
POLLS="${POLLS:-0 200000}"
PARAM=/sys/module/haltpoll/parameters/guest_halt_poll_ns
[ -w "$PARAM" ] || { echo "no writable $PARAM: not a KVM guest with the haltpoll driver, or not root" >&2; exit 1; }
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
mkdir -p "$WORK/mnt"
committed_tree "$STRATA" mixed "$WORK"
ORIGINAL=$(cat "$PARAM")
PID=
cleanup() {
    echo "$ORIGINAL" > "$PARAM"
    mountpoint -q "$WORK/mnt" && umount -l "$WORK/mnt"
    [ -z "$PID" ] || kill "$PID" 2>/dev/null || true
}
trap cleanup EXIT
"$ROOT/target/release/strata-mountd" --store "$WORK/st" "$WORK/mnt" 2>/dev/null &
PID=$!
until mountpoint -q "$WORK/mnt"; do sleep 0.05; done
# The first open ever makes the 512 MiB file's assembled copy: not timed.
cat "$WORK/mnt/b/latest/media/big.bin" >/dev/null
mapfile -t TOPS < <(cd "$WORK/tree" && ls | sort)
declare -A DIR=([native]="$WORK/tree" [strata]="$WORK/mnt/b/latest")

cpu() { awk '{print ($14 + $15) / 100}' "/proc/$PID/stat"; }
printf '| round | guest_halt_poll_ns | target | ls -lR | daemon CPU | 8 greps | daemon CPU |\n|---|---|---|---|---|---|---|\n'
for r in $(seq "$ROUNDS"); do
    order="$POLLS"
    [ $((r % 2)) = 0 ] && order=$(echo "$POLLS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for poll in $order; do
        echo "$poll" > "$PARAM"
        for t in native strata; do
            d=${DIR[$t]}
            cold; c0=$(cpu); s=$(now); ls -lR "$d/" >/dev/null; l=$(since "$s"); c1=$(cpu)
            cold; g=$(par8 "$d" "$WORK" | awk -F" [|] " '{print $3}'); c2=$(cpu)
            if [ "$t" = native ]; then
                printf '| %s | %s | %s | %s | - | %s | - |\n' "$r" "$poll" "$t" "$l" "$g"
            else
                printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$r" "$poll" "$t" "$l" \
                    "$(echo "$c1 - $c0" | bc)" "$g" "$(echo "$c2 - $c1" | bc)"
            fi
        done
    done
done
