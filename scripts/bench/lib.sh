# Shared by the benchmark scripts: source it, then call `need`.

# need COMMAND:PACKAGE... — install each Debian PACKAGE whose COMMAND is missing.
need() {
    local pkg
    for pkg in "$@"; do
        command -v "${pkg%%:*}" >/dev/null || {
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg##*:}"
        }
    done
}

# cold — drop the page, dentry and inode caches.
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
# since START — seconds since START (a `now`), two decimals.
since() { printf '%.2f' "$(echo "$(now) - $1" | bc)"; }

# elapsed WORK CMD... — CMD's wall seconds (`time`'s %e; its output and
# failure ignored), through the scratch file WORK/t.out.
elapsed() {
    local work=$1
    shift
    /usr/bin/time -f %e -o "$work/t.out" "$@" >/dev/null 2>&1 || true
    cat "$work/t.out"
}

# par8 DIR WORK — 8 `grep -r` at once over DIR's top-level entries listed
# in the array TOPS (every 8th each, from the mixed tree); prints
# "media_s | others_s | all_s": when the lane holding `media/` finished its
# `media/` part, when the other seven lanes finished, and when all did.
par8() {
    local d=$1 work=$2 i j pids=() start media_lane
    start=$(now)
    for i in 0 1 2 3 4 5 6 7; do
        (for ((j = i; j < ${#TOPS[@]}; j += 8)); do
            grep -r -q needle-not-there "$d/${TOPS[j]}" || true
            [ "${TOPS[j]}" = media ] && echo "media $(since "$start")" >> "$work/lanes"
        done
        echo "lane$i $(since "$start")" >> "$work/lanes") &
        pids+=($!)
    done
    wait "${pids[@]}"
    media_lane=$(grep -n '^media$' <(printf '%s\n' "${TOPS[@]}") | cut -d: -f1)
    media_lane=$(((media_lane - 1) % 8))
    awk -v m="lane$media_lane" '$1 == "media" {media = $2} $1 ~ /^lane/ {if ($2 > all) all = $2; if ($1 != m && $2 > others) others = $2}
        END {printf "%.2f | %.2f | %.2f", media, others, all}' "$work/lanes"
    rm -f "$work/lanes"
}

# committed_tree STRATA KIND WORK — generate the KIND tree (gentree.py) in
# WORK/tree and commit it as set `b` of the store WORK/st, unless WORK
# already holds that tree (marked by WORK/tree.done).
committed_tree() {
    local strata="$1" kind="$2" work="$3"
    [ "$(cat "$work/tree.done" 2>/dev/null)" = "$kind" ] && return
    echo "generating $kind tree..." >&2
    rm -rf "$work/tree" "$work/st"
    python3 "$(dirname "${BASH_SOURCE[0]}")/gentree.py" "$kind" "$work/tree"
    "$strata" --store "$work/st" init >/dev/null
    "$strata" --store "$work/st" commit --set b "$work/tree" >/dev/null
    echo "$kind" > "$work/tree.done"
}

# probe_latency ROOT PATHS SECONDS|STOPFILE — stat then cat the files listed
# in PATHS (relative to ROOT) in turn, for SECONDS or until STOPFILE exists;
# prints "ops stat_p50 stat_p99 cat_p50 cat_p99" (milliseconds).
probe_latency() {
    python3 - "$1" "$2" "$3" <<'PY'
import os, sys, time
root, paths, until = sys.argv[1:4]
paths = [p.strip() for p in open(paths)]
stat, cat, i = [], [], 0
t_end = time.time() + float(until) if until.replace('.', '').isdigit() else None
while (time.time() < t_end) if t_end else not os.path.exists(until):
    p = os.path.join(root, paths[i % len(paths)]); i += 1
    t = time.perf_counter(); os.stat(p); stat.append(time.perf_counter() - t)
    t = time.perf_counter()
    with open(p, "rb") as f: f.read()
    cat.append(time.perf_counter() - t)
def q(v, x):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * x))] * 1000 if v else float("nan")
print(f"{len(stat)} {q(stat, .5):.3f} {q(stat, .99):.3f} {q(cat, .5):.3f} {q(cat, .99):.3f}")
PY
}

# probe_log ROOT PATHS STOPFILE — stat then cat the files listed in PATHS
# (relative to ROOT) in turn until STOPFILE exists; prints one line per file:
# "unix_time stat_seconds cat_seconds".
probe_log() {
    python3 - "$1" "$2" "$3" <<'PY'
import os, sys, time
root, paths, stop = sys.argv[1:4]
paths = [p.strip() for p in open(paths)]
out, i = [], 0
while not os.path.exists(stop):
    p = os.path.join(root, paths[i % len(paths)]); i += 1
    t = time.perf_counter(); os.stat(p); s = time.perf_counter() - t
    t = time.perf_counter()
    with open(p, "rb") as f: f.read()
    out.append(f"{time.time():.6f} {s:.7f} {time.perf_counter() - t:.7f}")
print("\n".join(out))
PY
}

# latency_by_phase LOG PHASES — pool probe_log's lines by the phase they fell
# in (PHASES: "label unix_time" per phase start, the last one ending them);
# prints "label ops stat_p50 stat_p99 cat_p50 cat_p99" (milliseconds).
latency_by_phase() {
    python3 - "$1" "$2" <<'PY'
import bisect, sys
log, phases = sys.argv[1:3]
marks = [(float(t), label) for label, t in (l.split() for l in open(phases))]
starts = [t for t, _ in marks]
pooled = {}
for line in open(log):
    if not line.strip():
        continue
    t, s, c = map(float, line.split())
    i = bisect.bisect_right(starts, t) - 1
    if 0 <= i < len(marks) - 1:
        pooled.setdefault(marks[i][1], ([], []))
        pooled[marks[i][1]][0].append(s); pooled[marks[i][1]][1].append(c)
def q(v, x):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * x))] * 1000 if v else float("nan")
for label, (s, c) in pooled.items():
    print(f"{label} {len(s)} {q(s, .5):.3f} {q(s, .99):.3f} {q(c, .5):.3f} {q(c, .99):.3f}")
PY
}
