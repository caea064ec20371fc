#!/usr/bin/env bash
# Background work against mount latency: p50/p99 of stat and cat on a strata
# mount of a 300,000-file generation, in 10 s phases alternated three times:
# idle, a busy loop at SCHED_IDLE, a busy loop at nice 19, and dry-run
# sweeps back to back in the mount daemon. Shows which scheduling class a
# background thread (the sweeper) should use on this machine.
#   scripts/bench/background-latency.sh [WORKDIR]   (default: target/bench-bg)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/bench/lib.sh
cargo build --release --quiet --workspace
S="$PWD/target/release/strata"
W="$(realpath -m "${1:-target/bench-bg}")"
rm -rf "$W"; mkdir -p "$W/mnt"
python3 scripts/bench/gentree.py wide "$W/tree" >/dev/null
$S --store $W/st init >/dev/null
$S --store $W/st commit --set b "$W/tree" >/dev/null
$S --store $W/st mount --sweep-every 0s --no-materialize $W/mnt >/dev/null
(cd "$W/tree" && find . -type f | shuf -n 20000 --random-source=<(yes)) > $W/paths
probe() {
    probe_latency "$W/mnt/b/latest" "$W/paths" "$1"
}
sweeps() {
python3 - $W/st $1 <<'PY'
import glob, json, socket, sys, time
store, secs = sys.argv[1], float(sys.argv[2])
sock = glob.glob(f"{store}/run/mountd-*.sock")[0]
end = time.time() + secs
n = 0
while time.time() < end:
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall(b'{"version":1,"command":"sweep","grace_ms":0,"dry_run":true}\n')
    json.loads(s.makefile().readline()); s.close(); n += 1
PY
}
probe 5 >/dev/null  # warm
echo "phase ops stat_p50 stat_p99 cat_p50 cat_p99"
for r in 1 2 3; do
  echo "idle $(probe 10)"
  chrt -i 0 sh -c 'while :; do :; done' & SP=$!
  echo "spinner-idle $(probe 10)"
  kill $SP; wait $SP 2>/dev/null || true
  nice -n 19 sh -c 'while :; do :; done' & SP=$!
  echo "spinner-nice19 $(probe 10)"
  kill $SP; wait $SP 2>/dev/null || true
  sweeps 11 & SW=$!
  echo "sweeps $(probe 10)"
  wait $SW
done
$S --store $W/st unmount $W/mnt >/dev/null
