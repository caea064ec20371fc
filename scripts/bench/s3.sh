#!/usr/bin/env bash
# Object-store benchmark: the same tree in a local store and in a store on a
# local S3-compatible server (SeaweedFS, scripts/s3-server.sh), side by side
# in one run: commit, then find / grep -r / cat of a 512 MiB file through
# the mount: with S3's local cache empty (once), cold (daemons restarted,
# kernel caches dropped, S3's cache warm; local then S3, COLD_RUNS times)
# and warm (both mounts primed by one untimed run, then local then S3,
# WARM_RUNS times); medians, and the median of the per-pair ratios. Remote requests per operation come from the
# daemon's request counters (`strata status --json`).
#   scripts/bench/s3.sh [mixed] [WORKDIR]   (mixed: 30k files, 1.5 GiB)
# Prints a Markdown table and writes it to WORKDIR/s3-results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
KIND="${1:-mixed}"
WORK="${2:-$ROOT/target/bench-s3-$KIND}"
. "$ROOT/scripts/bench/lib.sh"
need bc:bc /usr/bin/time:time curl:curl
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
eval "$("$ROOT/scripts/s3-server.sh" start "$WORK/server")"
cleanup() {
    for m in "$WORK"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
    "$ROOT/scripts/s3-server.sh" stop "$WORK/server"
}
trap cleanup EXIT
for m in "$WORK"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
rm -rf "$WORK/local" "$WORK/s3host" && mkdir -p "$WORK/mnt-local" "$WORK/mnt-s3"
RESULTS="$WORK/s3-results.md"
WARM_RUNS="${WARM_RUNS:-5}"
COLD_RUNS="${COLD_RUNS:-3}"
TREE="$WORK/tree"
LOCAL=(--store "$WORK/local")
S3=(--store "s3://$STRATA_TEST_S3_BUCKET/bench-$(date +%s)" --s3-endpoint "$STRATA_TEST_S3_ENDPOINT"
    --allow-http --cache-dir "$WORK/s3host" --cache-size 8G)

if [ "$(cat "$WORK/tree.done" 2>/dev/null)" != "$KIND" ]; then
    echo "generating $KIND tree..." >&2
    rm -rf "$TREE"
    python3 "$ROOT/scripts/bench/gentree.py" "$KIND" "$TREE"
    echo "$KIND" > "$WORK/tree.done"
fi

secs() { /usr/bin/time -f "%e" -o "$WORK/t.out" "$@" >/dev/null 2>"$WORK/err.out" || { cat "$WORK/err.out" >&2; exit 1; }; cat "$WORK/t.out"; }
requests() { # total remote requests of the mounted daemon
    "$STRATA" "${S3[@]}" status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["daemons"][0]["status"]["remote_requests"]
print(sum(v for k, v in d.items() if k in ("get", "get_range", "head", "put", "list", "delete")))'
}

"$STRATA" "${LOCAL[@]}" init >/dev/null
"$STRATA" "${S3[@]}" init >/dev/null
cold; commit_local=$(secs "$STRATA" "${LOCAL[@]}" commit --set b "$TREE")
cold; commit_s3=$(STRATA_REQUEST_STATS=1 secs "$STRATA" "${S3[@]}" commit --set b "$TREE")
commit_s3_req=$(grep -o 'requests: .*' "$WORK/err.out")
"$STRATA" "${LOCAL[@]}" mount "$WORK/mnt-local" >/dev/null

mount_s3() { "$STRATA" "${S3[@]}" mount "$WORK/mnt-s3" >/dev/null; }
unmount_s3() { "$STRATA" "${S3[@]}" unmount "$WORK/mnt-s3" >/dev/null; }

declare -A CMD=(
    [find]="find DIR/b/latest/ -printf '%s\n' | wc -l"
    [grep]="grep -r -q needle-that-is-not-there DIR/b/latest/ || true"
    [cat]="cat DIR/b/latest/media/big.bin"
)
OPS="find grep cat"
RUN_LOG=""
run() { secs bash -c "${CMD[$1]//DIR/$2}"; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
prime() { bash -c "${CMD[$1]//DIR/$2}" >/dev/null; }

printf '# object-store benchmark, %s, %s cores, kernel %s\n\n' "$(date -u +%F)" "$(nproc)" "$(uname -r)" | tee "$RESULTS"
printf 'tree: %s files, %s bytes; commit (page cache dropped first): local %s s, S3 %s s\n\n' \
    "$(find "$TREE" -type f | wc -l)" "$(du -sb "$TREE" | cut -f1)" "$commit_local" "$commit_s3" | tee -a "$RESULTS"
printf '| op | local cold | S3 empty cache | requests | S3 warm cache, cold kernel | requests | S3/local cold | local warm | S3 warm | S3/local warm |\n|---|---|---|---|---|---|---|---|---|---|\n' | tee -a "$RESULTS"
ratio() { awk -v s="$1" -v l="$2" 'BEGIN { if (l > 0) printf "%.2f", s / l; else print "inf" }'; }
restart_local() {
    "$STRATA" "${LOCAL[@]}" unmount "$WORK/mnt-local" >/dev/null
    "$STRATA" "${LOCAL[@]}" mount "$WORK/mnt-local" >/dev/null
}
for op in $OPS; do
    rm -rf "$WORK/s3host/cache"; mount_s3; cold
    r0=$(requests); se=$(run "$op" "$WORK/mnt-s3"); re=$(( $(requests) - r0 ))
    unmount_s3
    # Cold kernel, daemons restarted, alternating; S3 with its cache warm.
    lcs=(); scs=(); rcs=(); cratios=()
    for _ in $(seq "$COLD_RUNS"); do
        restart_local; cold; l=$(run "$op" "$WORK/mnt-local")
        mount_s3; cold
        r0=$(requests); s=$(run "$op" "$WORK/mnt-s3"); rcs+=($(( $(requests) - r0 )))
        unmount_s3
        lcs+=("$l"); scs+=("$s"); cratios+=("$(ratio "$s" "$l")")
    done
    mount_s3
    prime "$op" "$WORK/mnt-local"; prime "$op" "$WORK/mnt-s3"
    lws=(); sws=(); wratios=()
    for _ in $(seq "$WARM_RUNS"); do
        l=$(run "$op" "$WORK/mnt-local"); s=$(run "$op" "$WORK/mnt-s3")
        lws+=("$l"); sws+=("$s"); wratios+=("$(ratio "$s" "$l")")
    done
    unmount_s3
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$op" "$(median "${lcs[@]}")" "$se" "$re" \
        "$(median "${scs[@]}")" "$(median "${rcs[@]}")" "$(median "${cratios[@]}")" \
        "$(median "${lws[@]}")" "$(median "${sws[@]}")" "$(median "${wratios[@]}")" | tee -a "$RESULTS"
    RUN_LOG+="$op cold, alternating: local ${lcs[*]}; S3 ${scs[*]}"$'\n'
    RUN_LOG+="$op warm, alternating: local ${lws[*]}; S3 ${sws[*]}"$'\n'
done
printf '\n%s' "$RUN_LOG" | tee -a "$RESULTS"
printf '\nS3 commit %s\n' "$commit_s3_req" | tee -a "$RESULTS"
# The server's own throughput for the big blob: one plain GET, and the same
# 8 MiB ranges 8 at a time (what the cache fill does), by curl.
blob=$(find "$WORK/s3host/cache/objects/blobs" -type f -size +100M | head -1)
key=${blob#"$WORK/s3host/cache/objects/"}
url="$STRATA_TEST_S3_ENDPOINT/$STRATA_TEST_S3_BUCKET/${S3[1]#s3://$STRATA_TEST_S3_BUCKET/}/$key"
sig=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
size=$(stat -c %s "$blob")
one=$(curl -s -o /dev/null -w '%{time_total}' "${sig[@]}" "$url")
start=$(date +%s.%N)
seq 0 $(( (size - 1) / 8388608 )) | xargs -P 8 -I{} sh -c \
    "curl -s -o /dev/null --aws-sigv4 aws:amz:us-east-1:s3 --user '$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY' -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -r \$(( {} * 8388608 ))-\$(( {} * 8388608 + 8388607 )) '$url'"
par=$(echo "$(date +%s.%N) - $start" | bc)
printf 'big blob %s bytes straight from the server by curl: one GET %.2f s, 8 MiB ranges 8 in flight %.2f s\n' "$size" "$one" "$par" | tee -a "$RESULTS"
"$STRATA" "${LOCAL[@]}" unmount "$WORK/mnt-local" >/dev/null
echo "results: $RESULTS" >&2
