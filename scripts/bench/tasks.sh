#!/usr/bin/env bash
# Task records on an object store: what 10,000 finished tasks cost before
# and after the recovery scanner compacts them (issue 24). On a local
# S3-compatible server (scripts/s3-server.sh):
#   1. one real materialization, then N-1 copies of its PUBLISHED record
#      under fresh ids (uploaded with curl);
#   2. requests of one task listing (`strata tasks`) with N finished tasks
#      uncompacted: what every scanner pass or policy pass that lists tasks
#      would cost without compaction;
#   3. a daemon started on the store: requests and time of its first scan
#      (which compacts every task), and requests per minute after that;
#   4. the same daemon's requests per minute on a store with no finished
#      task (same set, same polling), and one listing after compaction.
# Request counts do not depend on the build, so the debug binaries serve.
#   scripts/bench/tasks.sh [N] [WORKDIR]   (N: 10000)
# Prints a Markdown table and writes it to WORKDIR/tasks-results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
N="${1:-10000}"
WORK="${2:-$ROOT/target/bench-tasks}"
WINDOW="${WINDOW:-60}"
. "$ROOT/scripts/bench/lib.sh"
need curl:curl
cargo build --quiet --workspace
STRATA="$ROOT/target/debug/strata"
eval "$("$ROOT/scripts/s3-server.sh" start "$WORK/server")"
cleanup() {
    for m in "$WORK"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
    "$ROOT/scripts/s3-server.sh" stop "$WORK/server"
}
trap cleanup EXIT
for m in "$WORK"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
rm -rf "$WORK/host-"* "$WORK/src" && mkdir -p "$WORK/mnt-a" "$WORK/mnt-b" "$WORK/src"
RESULTS="$WORK/tasks-results.md"
stamp=$(date +%s)
store() { # STORE_ARGS for store $1
    echo --store "s3://$STRATA_TEST_S3_BUCKET/bench-tasks-$stamp-$1" --s3-endpoint "$STRATA_TEST_S3_ENDPOINT" \
        --allow-http --cache-dir "$WORK/host-$1"
}
A=($(store a)) B=($(store b))
requests_of() { # total remote requests printed by a CLI run's STRATA_REQUEST_STATS line
    grep -o 'requests: .*' "$1" | tr ' ' '\n' \
        | awk -F= '$1 ~ /^(get|get_range|head|put|list|delete)$/ {s += $2} END {print s + 0}'
}
daemon_requests() { # total remote requests of the daemon serving store $1
    local args=($(store "$1"))
    "$STRATA" "${args[@]}" status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["daemons"][0]["status"]["remote_requests"]
print(sum(v for k, v in d.items() if k in ("get", "get_range", "head", "put", "list", "delete")))'
}

for s in a b; do
    args=($(store $s))
    "$STRATA" "${args[@]}" init >/dev/null
    for g in 1 2; do
        for i in $(seq 1 50); do echo "$g $i" > "$WORK/src/f$i"; done
        "$STRATA" "${args[@]}" commit --set s "$WORK/src" >/dev/null
    done
    "$STRATA" "${args[@]}" materialize --set s --in-process >/dev/null
done

echo "uploading $((N - 1)) copies of a finished task record..." >&2
"$STRATA" "${A[@]}" tasks --json > "$WORK/task.json"
python3 - "$WORK/task.json" "$N" "$WORK/records" <<'EOF'
import json, os, sys
t = json.load(open(sys.argv[1]))[0]
out = sys.argv[3]
os.makedirs(out, exist_ok=True)
for i in range(1, int(sys.argv[2])):
    t["id"] = f"materialize-s-1-{i:016x}"
    t["record"] = 1
    with open(os.path.join(out, t["id"]), "w") as f:
        json.dump(t, f, indent=1)
EOF
prefix="bench-tasks-$stamp-a"
ls "$WORK/records" | xargs -P 16 -I{} curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    -T "$WORK/records/{}" "$STRATA_TEST_S3_ENDPOINT/$STRATA_TEST_S3_BUCKET/$prefix/tasks/{}/000001.json"
listed=$("$STRATA" "${A[@]}" tasks --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$listed" = "$N" ] || { echo "expected $N tasks, listed $listed" >&2; exit 1; }

STRATA_REQUEST_STATS=1 "$STRATA" "${A[@]}" tasks >/dev/null 2>"$WORK/list-before.err"
list_before=$(requests_of "$WORK/list-before.err")

per_minute() { # requests of the daemon of store $1 over WINDOW seconds, per minute
    local r0 r1
    r0=$(daemon_requests "$1"); sleep "$WINDOW"; r1=$(daemon_requests "$1")
    echo $(( (r1 - r0) * 60 / WINDOW ))
}
count() { "$STRATA" "${A[@]}" tasks "$@" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }
"$STRATA" "${A[@]}" mount --no-materialize --sweep-every 0s "$WORK/mnt-a" >/dev/null
t0=$(date +%s); r0=$(daemon_requests a)
while [ "$(count)" -gt 0 ]; do sleep 5; done
t1=$(date +%s); r1=$(daemon_requests a)
compaction_s=$((t1 - t0)); compaction_req=$((r1 - r0))
compacted=$(count --all)
live=$(count)
after=$(per_minute a)
sleep "${SETTLE:-120}"
later=$(per_minute a)
STRATA_REQUEST_STATS=1 "$STRATA" "${A[@]}" tasks >/dev/null 2>"$WORK/list-after.err"
list_after=$(requests_of "$WORK/list-after.err")
"$STRATA" "${A[@]}" unmount --lazy "$WORK/mnt-a" >/dev/null

"$STRATA" "${B[@]}" mount --no-materialize --sweep-every 0s "$WORK/mnt-b" >/dev/null
sleep 5
baseline=$(per_minute b)
"$STRATA" "${B[@]}" unmount --lazy "$WORK/mnt-b" >/dev/null

{
    echo "| store | requests |"
    echo "|---|---|"
    echo "| one \`strata tasks\` listing, $N finished tasks uncompacted | $list_before |"
    echo "| daemon's first scan: compacting them ($compaction_s s, polled every 5 s) | $compaction_req |"
    echo "| daemon after compaction ($live live, $compacted compacted), per minute | $after |"
    echo "| the same daemon ${SETTLE:-120} s later, per minute | $later |"
    echo "| daemon, store with 1 finished task, per minute | $baseline |"
    echo "| one \`strata tasks\` listing after compaction | $list_after |"
} | tee "$RESULTS"
