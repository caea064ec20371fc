#!/usr/bin/env bash
# How requests reach the daemon, side by side: the native tree, then one
# daemon per configuration, each in turn over the same store, with the
# page, dentry and inode caches dropped before every cold command. A
# configuration is NAME:SESSION:ARGS, where SESSION is `same` (the daemon
# runs in this script's session, as the readers do) or `own` (started
# with setsid, as `strata mount` and service managers do: with session
# autogroups on, the readers and the daemon are then scheduled as
# separate groups) and ARGS are daemon arguments, comma-separated.
# Per round and configuration: a cold `cat` of the 512 MiB file, a cold
# `ls -lR`, 8 cold greps at once over disjoint subtrees (when the lane
# holding `media/` finished it, when the other seven lanes finished, when
# all did), a warm `grep -r` and a warm `cat` of every file.
#   scripts/bench/transport.sh ROUNDS WORKDIR CONFIG...
#   e.g. scripts/bench/transport.sh 3 target/bench-transport \
#          dev:own:--no-io-uring ring:own: ring-each:own:--opens,each
# Whether FUSE over io_uring is offered and sessions are grouped is the
# host's (docs/OPERATIONS.md); the script prints both and changes neither.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
. "$ROOT/scripts/bench/lib.sh"
need bc:bc /usr/bin/time:time
ROUNDS="$1" WORK="$2"
shift 2
cargo build --release --quiet --workspace
STRATA="$ROOT/target/release/strata"
DAEMON="$ROOT/target/release/strata-mountd"
mkdir -p "$WORK/mnt"
committed_tree "$STRATA" mixed "$WORK"
PID=
cleanup() {
    mountpoint -q "$WORK/mnt" && umount -l "$WORK/mnt"
    [ -n "$PID" ] && kill "$PID" 2>/dev/null
    true
}
trap cleanup EXIT
cleanup
mapfile -t TOPS < <(cd "$WORK/tree" && ls | sort)

# serve SESSION ARGS: start a daemon, wait for its mount, make the large
# file's assembled copy (out of the timed reads)
serve() {
    local args
    IFS=, read -ra args <<< "$2"
    if [ "$1" = own ]; then
        setsid "$DAEMON" --store "$WORK/st" "${args[@]}" "$WORK/mnt" </dev/null >>"$WORK/daemon.log" 2>&1 &
    else
        "$DAEMON" --store "$WORK/st" "${args[@]}" "$WORK/mnt" 2>>"$WORK/daemon.log" &
    fi
    PID=$!
    until mountpoint -q "$WORK/mnt"; do sleep 0.05; done
    cat "$WORK/mnt/b/latest/media/big.bin" >/dev/null
}
stop() {
    umount -l "$WORK/mnt"
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
}
measure() { # NAME DIR
    local d=$2 c l p g a
    cold; c=$(elapsed "$WORK" cat "$d/media/big.bin")
    cold; l=$(elapsed "$WORK" ls -lR "$d")
    cold; p=$(par8 "$d" "$WORK")
    grep -r -q needle-not-there "$d" || true
    g=$(elapsed "$WORK" sh -c "grep -r -q needle-not-there '$d' || true")
    find "$d" -type f -exec cat {} + >/dev/null
    a=$(elapsed "$WORK" sh -c "find '$d' -type f -exec cat {} + >/dev/null")
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$r" "$1" "$c" "$l" "$p" "$g" "$a"
}

printf 'enable_uring %s, sched_autogroup_enabled %s\n\n' \
    "$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo -)" \
    "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo -)"
printf '| round | target | cold cat 512 MiB | cold ls -lR | 8 cold greps: media/ done | other 7 lanes | all | warm grep -r | warm cat all |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for r in $(seq "$ROUNDS"); do
    measure native "$WORK/tree/"
    for config in "$@"; do
        IFS=: read -r name session args <<< "$config"
        serve "$session" "$args"
        measure "$name" "$WORK/mnt/b/latest/"
        stop
    done
done
