#!/usr/bin/env bash
# Sweep benchmark: reclaim the dead third of a 1M-file store with strata
# (retain + two sweeps, grace 0) and with restic (forget + prune) on the same
# data, side by side in one run; wall time, peak RSS, bytes before/after, and
# the p50/p99 latency of stat and cat on a strata mount of the store, idle
# and while sweeps run (phases alternated ROUNDS times, PHASE seconds each;
# defaults 4 and 5).
#   scripts/bench/sweep.sh [WORKDIR]     (default: target/bench-sweep)
# Data: 1,000,000 files of 50-400 random bytes in 1,000 directories; then
# directories d000-d299 are rewritten with new content (30% of the files), so
# the first snapshot's versions of those files are dead once it is forgotten.
# strata folds generation 2 into a base first (so generation 1's base is
# unreferenced), like `restic backup` writing a self-contained snapshot.
# restic prune runs twice on hard-linked copies of one repository: with
# `--max-unused unlimited` (delete unused packs only: what a strata sweep
# does) and with its default (also repacks partly used packs).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
WORK="${1:-$ROOT/target/bench-sweep}"
. "$ROOT/scripts/bench/lib.sh"
need restic:restic bc:bc /usr/bin/time:time
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR="$WORK/restic-cache"
SHM="$(mktemp -d /dev/shm/strata-sweep.XXXXXX)"
cleanup() {
    mountpoint -q "$WORK/mnt" 2>/dev/null && umount -l "$WORK/mnt"
    rm -rf "$SHM"
}
trap cleanup EXIT
rm -rf "$WORK" && mkdir -p "$WORK/mnt"
RESULTS="$WORK/sweep-results.md"
TREE="$SHM/tree"
S=(--store "$WORK/store")

echo "making 1M files..." >&2
python3 - "$TREE" 0 <<'EOF'
import os, random, sys
root, phase = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
for d in range(1000):
    os.makedirs(f"{root}/d{d:03d}", exist_ok=True)
for i in range(1_000_000):
    with open(f"{root}/d{i % 1000:03d}/f{i:07d}", "wb") as f:
        f.write(rng.randbytes(rng.randint(50, 400)))
EOF
"$STRATA" "${S[@]}" init >/dev/null
"$STRATA" "${S[@]}" commit --set b "$TREE" >/dev/null
restic init --repo "$WORK/restic" >/dev/null
restic --repo "$WORK/restic" backup -q "$TREE"

echo "rewriting 30% of the files..." >&2
python3 - "$TREE" <<'EOF'
import random, sys
root = sys.argv[1]
rng = random.Random(8)
for i in range(1_000_000):
    if i % 1000 < 300:
        with open(f"{root}/d{i % 1000:03d}/f{i:07d}", "wb") as f:
            f.write(rng.randbytes(rng.randint(50, 400)))
EOF
"$STRATA" "${S[@]}" commit --set b "$TREE" >/dev/null
"$STRATA" "${S[@]}" materialize --set b --in-process >/dev/null
restic --repo "$WORK/restic" backup -q "$TREE"
"$STRATA" "${S[@]}" retain --set b --keep-last 1 >/dev/null
restic --repo "$WORK/restic" forget -q --keep-last 1 >/dev/null
cp -al "$WORK/restic" "$WORK/restic-default"
(cd "$TREE" && find . -type f | shuf -n 200000 --random-source=<(yes)) > "$WORK/paths"

# timed NAME CMD...: wall seconds and peak RSS (KiB) of CMD into $WORK/NAME.time
timed() {
    local name="$1"; shift
    /usr/bin/time -f "%e %M" -o "$WORK/$name.time" "$@"
}

# daemon_sweeps SECONDS [--recount]: sweep back to back through the mount
# daemon (its control socket; it runs each sweep as its schedule does, in
# its kept helper process `strata sweep --in-process --serve`), printing the
# count.
# --recount makes each one a full sweep of this store (every reachable
# row read again for pack live ratios); without it they are the quiet
# sweeps of a daemon whose store did not change.
daemon_sweeps() {
    python3 - "$WORK/store" "$1" "${2:-}" <<'EOF'
import glob, json, socket, sys, time
store, secs, recount = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "--recount"
sock = glob.glob(f"{store}/run/mountd-*.sock")[0]
req = json.dumps({"version": 1, "command": "sweep", "grace_ms": 0, "recount": recount})
n, end = 0, time.time() + secs
while time.time() < end:
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall(req.encode() + b"\n")
    reply = json.loads(s.makefile().readline()); s.close()
    assert reply["ok"], reply
    n += 1
print(n)
EOF
}

# The mount's latency: one probe stats and cats random files of the mount
# from start to end, logging every operation, while the phases alternate
# ROUNDS times (idle, back-to-back full sweeps, back-to-back quiet sweeps,
# PHASE seconds each), so the machine's drift falls on every phase alike.
ROUNDS="${ROUNDS:-4}"
PHASE="${PHASE:-5}"
"$STRATA" "${S[@]}" mount --sweep-every 0s --no-materialize "$WORK/mnt" >/dev/null
strata_before=$(du -sb "$WORK/store" | cut -f1)
sync; echo 3 > /proc/sys/vm/drop_caches
probe_log "$WORK/mnt/b/latest" "$WORK/paths" "$WORK/stop" > "$WORK/probe.log" &
PROBE=$!
phase() { echo "$1 $(date +%s.%N)" >> "$WORK/phases"; }
echo "probing the mount, idle and under sweeps..." >&2
# The first seconds after drop_caches are not counted (nor any phase).
phase warmup; sleep 3
phase full
timed sweep1 "$STRATA" "${S[@]}" sweep --grace 0s --in-process --json > "$WORK/sweep1.json"
timed sweep2 "$STRATA" "${S[@]}" sweep --grace 0s --in-process --json > "$WORK/sweep2.json"
full=2 quiet=0
for _ in $(seq "$ROUNDS"); do
    phase idle; sleep "$PHASE"
    phase full; full=$(( full + $(daemon_sweeps "$PHASE" --recount) ))
    phase quiet; quiet=$(( quiet + $(daemon_sweeps "$PHASE") ))
done
phase end
touch "$WORK/stop"; wait "$PROBE"
latency_by_phase "$WORK/probe.log" "$WORK/phases" > "$WORK/latency"
strata_after=$(du -sb "$WORK/store" | cut -f1)
"$STRATA" "${S[@]}" unmount "$WORK/mnt" >/dev/null
"$STRATA" "${S[@]}" verify >/dev/null

sync; echo 3 > /proc/sys/vm/drop_caches
restic_before=$(du -sb "$WORK/restic" | cut -f1)
timed prune-unused restic --repo "$WORK/restic" prune -q --max-unused unlimited
restic_after=$(du -sb "$WORK/restic" | cut -f1)
sync; echo 3 > /proc/sys/vm/drop_caches
timed prune-default restic --repo "$WORK/restic-default" prune -q
restic_default_after=$(du -sb "$WORK/restic-default" | cut -f1)

read -r s1_wall s1_rss < "$WORK/sweep1.time"
read -r s2_wall s2_rss < "$WORK/sweep2.time"
read -r pu_wall pu_rss < "$WORK/prune-unused.time"
read -r pd_wall pd_rss < "$WORK/prune-default.time"
read -r idle_n idle_s50 idle_s99 idle_c50 idle_c99 < <(grep '^idle ' "$WORK/latency" | cut -d' ' -f2-)
read -r sw_n sw_s50 sw_s99 sw_c50 sw_c99 < <(grep '^full ' "$WORK/latency" | cut -d' ' -f2-)
read -r q_n q_s50 q_s99 q_c50 q_c99 < <(grep '^quiet ' "$WORK/latency" | cut -d' ' -f2-)
mark_ms=$(python3 -c "import json;print(json.load(open('$WORK/sweep1.json'))['mark_ms'])")
mark_rows=$(python3 -c "import json;print(json.load(open('$WORK/sweep1.json'))['mark_rows'])")
objects=$(python3 -c "import json;print(json.load(open('$WORK/sweep1.json'))['objects'])")
deleted=$(python3 -c "import json;r=json.load(open('$WORK/sweep2.json'));print(r['deleted']['count'], r['deleted']['bytes'])")
mib() { echo "scale=1; $1 / 1048576" | bc; }
{
    echo "| tool | what | wall s | peak RSS MiB | store MiB before → after |"
    echo "|---|---|---|---|---|"
    echo "| strata | sweep 1 (mark, condemn) | $s1_wall | $(( s1_rss / 1024 )) | $(mib "$strata_before") → |"
    echo "| strata | sweep 2 (mark, delete $deleted B) | $s2_wall | $(( s2_rss / 1024 )) | → $(mib "$strata_after") |"
    echo "| restic | prune --max-unused unlimited | $pu_wall | $(( pu_rss / 1024 )) | $(mib "$restic_before") → $(mib "$restic_after") |"
    echo "| restic | prune (default: repacks) | $pd_wall | $(( pd_rss / 1024 )) | $(mib "$restic_before") → $(mib "$restic_default_after") |"
    echo
    echo "strata mark: $mark_rows rows and $objects stored objects in $mark_ms ms"
    echo
    echo "| mount latency (ms) | ops | stat p50 | stat p99 | cat p50 | cat p99 |"
    echo "|---|---|---|---|---|---|"
    echo "| idle ($ROUNDS x $PHASE s) | $idle_n | $idle_s50 | $idle_s99 | $idle_c50 | $idle_c99 |"
    echo "| during $full full sweeps (2 timed, then back to back through the daemon with --recount, $ROUNDS x $PHASE s) | $sw_n | $sw_s50 | $sw_s99 | $sw_c50 | $sw_c99 |"
    echo "| during $quiet quiet sweeps (back to back through the daemon, $ROUNDS x $PHASE s) | $q_n | $q_s50 | $q_s99 | $q_c50 | $q_c99 |"
} | tee "$RESULTS"
