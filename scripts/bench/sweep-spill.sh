#!/usr/bin/env bash
# Sweeps that spill: peak RSS and wall time of two sweeps (grace 0) of a
# synthetic store with OBJECTS reachable standalone blobs (default 10M) in
# base manifests of 100,000 blobs each, plus UNREACHABLE (default 200,000)
# blobs no manifest names: the first sweep condemns those, the second
# deletes them. Blobs are empty files (scripts/bench/synth_store.py): a
# sweep lists and marks names, it never reads a blob.
#   scripts/bench/sweep-spill.sh [OBJECTS] [WORKDIR]   (default: target/bench-sweep-spill)
# STRATA=PATH runs another build of strata (e.g. one from before sweeps
# spilled) instead of building this one; SWEEP_FLAGS adds flags to both
# sweeps (e.g. "--sort-memory 16M"). The store is deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OBJECTS="${1:-10000000}"
WORK="${2:-$ROOT/target/bench-sweep-spill}"
UNREACHABLE="${UNREACHABLE:-200000}"
. "$ROOT/scripts/bench/lib.sh"
need /usr/bin/time:time
if [ -z "${STRATA:-}" ]; then
    CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}" cargo build --release --quiet --bin strata
    STRATA="$ROOT/target/release/strata"
fi
trap 'rm -rf "$WORK/store" "$WORK/src"' EXIT
rm -rf "$WORK" && mkdir -p "$WORK/src"
S=(--store "$WORK/store")
echo "a synthetic file" > "$WORK/src/a"
"$STRATA" "${S[@]}" init >/dev/null
"$STRATA" "${S[@]}" commit --set b "$WORK/src" >/dev/null
python3 "$ROOT/scripts/bench/synth_store.py" "$WORK/store" b "$OBJECTS" "$UNREACHABLE"
sync
RESULTS="$WORK/sweep-spill-results.md"
echo "| sweep | objects listed | marked | condemned | deleted | wall s | peak RSS MiB |" > "$RESULTS"
echo "|---|---|---|---|---|---|---|" >> "$RESULTS"
for n in 1 2; do
    # shellcheck disable=SC2086
    /usr/bin/time -v "$STRATA" "${S[@]}" sweep --in-process --grace 0s --json ${SWEEP_FLAGS:-} \
        > "$WORK/report-$n.json" 2> "$WORK/time-$n.txt"
    python3 - "$WORK/report-$n.json" "$WORK/time-$n.txt" "$n" >> "$RESULTS" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
t = open(sys.argv[2]).read()
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1)) / 1024
w = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", t).group(1).split(":")
wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
print(f"| {sys.argv[3]} | {r['objects']:,} | {r['marked']:,} | {r['condemned']['count']:,} "
      f"| {r['deleted']['count']:,} | {wall:.1f} | {rss:.0f} |")
PY
done
cat "$RESULTS"
