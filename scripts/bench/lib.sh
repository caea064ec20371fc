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
