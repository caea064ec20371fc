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
