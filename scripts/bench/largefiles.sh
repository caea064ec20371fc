#!/usr/bin/env bash
# Large-file benchmark: strata vs restic (and mksquashfs, native reads) on big
# files, side by side in one run, one table per section:
#   1. small edits (64 KiB overwrite + 4 KiB insert) to a 256 MiB file: growth
#   2. mixed tree (30k text files 1-64 KiB, six 2-8 MiB text files, one 512 MiB
#      file: first half text, second half random): store / repo / image size
#   3. a 1 GiB sparse file holding 12 KiB: commit, growth, holes via the mount
#   4. commit throughput on 4 x 1 GiB random files, then a 64 KiB edit
#   5. cold and warm `cat` of a 512 MiB file through the mount vs native
#   6. peak commit RSS with a 16 GiB file (SKIP_16G=1 skips it)
#   scripts/bench/largefiles.sh [WORKDIR]   (default: target/bench-large)
#   SCALE=N divides every file size (default 1; SCALE=16 is a quick run).
#   STRATA_BIN_DIR=DIR uses the strata binaries in DIR and skips the build.
#   BEFORE_BIN_DIR=DIR adds rows for an earlier build's strata to sections 2
#   and 4 (the same steps, a store of its own), side by side in the run.
#   SECTIONS="1 2 3 4 5 6" runs only the sections listed.
# At SCALE=1 it needs ~36 GiB of disk (section 6; the others delete their data).
# "Random" content: a 64 MiB os.urandom block repeated, with an 8-byte counter
# every 64 KiB (below both tools' smallest chunk), so nothing deduplicates.
# Prints Markdown tables and writes them to WORKDIR/largefiles-results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
WORK="${1:-$ROOT/target/bench-large}"
SCALE="${SCALE:-1}"
. "$ROOT/scripts/bench/lib.sh"
need restic:restic mksquashfs:squashfs-tools /usr/bin/time:time
[ -n "${STRATA_BIN_DIR:-}" ] || cargo build --release --quiet --workspace
BIN="${STRATA_BIN_DIR:-$ROOT/target/release}"
STRATA="$BIN/strata"
[ -x "$STRATA" ] && [ -x "$BIN/strata-mountd" ] || { echo "no strata binaries in $BIN" >&2; exit 1; }
export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR="$WORK/restic-cache"
cleanup() {
    for m in "$WORK"/*/mnt; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
    return 0
}
trap cleanup EXIT
cleanup
rm -rf "$WORK" && mkdir -p "$WORK"
RESULTS="$WORK/largefiles-results.md"
SECTIONS="${SECTIONS:-1 2 3 4 5 6}"
want() { case " $SECTIONS " in *" $1 "*) return 0;; esac; return 1; }
BEFORE="${BEFORE_BIN_DIR:+$BEFORE_BIN_DIR/strata}"

# run CMD... : sets SECS (wall, ms resolution) and RSS (peak MiB, GNU time)
run() {
    sync
    local t0; t0=$(date +%s%N)
    /usr/bin/time -f "%M" -o "$WORK/time.out" "$@" >"$WORK/last.out" 2>"$WORK/last.err" || { cat "$WORK/last.err"; exit 1; }
    SECS=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
    RSS=$(( $(cat "$WORK/time.out") / 1024 ))
}
catf() { cat "$1" >/dev/null; }
export -f catf
size() { du -sb "$1" | cut -f1; }
mib() { awk -v a="$1" 'BEGIN { printf "%.1f", a / 1048576 }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
mbs() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f", a / b / 1e6; else print "-" }'; }
out() { printf "$@" | tee -a "$RESULTS"; }
S() { local d="$1"; shift; "$STRATA" --store "$d/store" "$@"; }
R() { local d="$1"; shift; restic --repo "$d/restic" "$@"; }
setup() { # setup DIR : a fresh strata store and restic repo in DIR
    mkdir -p "$1/mnt" && S "$1" init >/dev/null && R "$1" init >/dev/null
}
genrand() { # genrand PATH BYTES [append] : random, non-deduplicable content
    python3 - "$@" <<'PY'
import os, sys
path, n = sys.argv[1], int(sys.argv[2])
pool = memoryview(os.urandom(max(1, min(n, 64 << 20))))
with open(path, "ab" if len(sys.argv) > 3 else "wb") as f:
    off, ctr = 0, 0
    while off < n:
        a = off % len(pool)
        buf = bytearray(pool[a:a + min(1 << 20, n - off)])
        for j in range(0, len(buf) - 8, 65536):
            buf[j:j + 8] = ctr.to_bytes(8, "little"); ctr += 1
        f.write(buf); off += len(buf)
PY
}
SZ() { echo $(( ($1 << 20) / SCALE / 4096 * 4096 )); } # SZ MiB : scaled bytes

out '# large-file benchmark, %s, %s cores, %s MiB RAM, kernel %s, SCALE=%s\n' \
    "$(date -u +%F)" "$(nproc)" "$(free -m | awk '/Mem:/ {print $2}')" "$(uname -r)" "$SCALE"
out 'strata: %s; %s\n' "$BIN" "$(restic version | cut -d' ' -f1-2)"

# 1. small edits to a 256 MiB file
if want 1; then
D="$WORK/s1"; setup "$D"; F="$D/tree/big.bin"; mkdir -p "$D/tree"
echo "1. edits to a $(mib "$(SZ 256)") MiB file..." >&2
genrand "$F" "$(SZ 256)"
S "$D" commit --set b "$D/tree" >/dev/null; R "$D" backup -q "$D/tree"
s0=$(size "$D/store"); r0=$(size "$D/restic")
for i in 1 2 3 4; do
    python3 - "$F" "$i" <<'PY'
import os, random, sys
p = sys.argv[1]; rng = random.Random(int(sys.argv[2])); size = os.path.getsize(p)
with open(p, "r+b") as f:
    f.seek(rng.randrange(0, size - 65536)); f.write(os.urandom(65536))
    f.seek(size // 2); tail = f.read(); f.seek(size // 2); f.write(os.urandom(4096) + tail)
PY
    S "$D" commit --set b "$D/tree" >/dev/null; R "$D" backup -q "$D/tree"
done
s1=$(( $(size "$D/store") - s0 )); r1=$(( $(size "$D/restic") - r0 ))
out '\n### 1. %s MiB random file, 4 edits (64 KiB overwrite at a random offset + 4 KiB insert in the middle)\n\n' "$(mib "$(SZ 256)")"
out '| tool | size after first commit MiB | growth over 4 edit commits MiB |\n|---|---|---|\n'
out '| strata | %s | %s |\n| restic | %s | %s |\n' "$(mib "$s0")" "$(mib "$s1")" "$(mib "$r0")" "$(mib "$r1")"
out '| strata / restic | %s | %s |\n' "$(div "$s0" "$r0")" "$(div "$s1" "$r1")"
rm -rf "$D"
fi

# 2. mixed tree
if want 2; then
D="$WORK/s2"; setup "$D"; T="$D/tree"
echo "2. generating the mixed tree..." >&2
python3 - "$T" "$SCALE" <<'PY'
import os, random, string, sys
root, scale = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
vocab = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))).encode() for _ in range(4096)]
vocab += [w + b".\n" for w in vocab[:400]]
def text(n):
    out = b" ".join(rng.choices(vocab, k=n // 4 + 16))
    while len(out) < n:
        out += b" " + b" ".join(rng.choices(vocab, k=n // 4 + 16))
    return out[:n]
def write(rel, data):
    p = os.path.join(root, rel); os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f: f.write(data)
for i in range(30_000):
    write(f"proj{i % 40:02d}/mod{(i // 40) % 25:02d}/f{i:05d}.txt", text(max(1, rng.randint(1 << 10, 64 << 10) // scale)))
for i in range(6):
    write(f"docs/big{i}.txt", text(rng.randint(2 << 20, 8 << 20) // scale))
half = (512 << 20) // scale // 2
os.makedirs(os.path.join(root, "media"))
with open(os.path.join(root, "media", "big.bin"), "wb") as f:
    for off in range(0, half, 1 << 20): f.write(text(min(1 << 20, half - off)))
PY
genrand "$T/media/big.bin" "$(( (512 << 20) / SCALE / 2 ))" append
src=$(size "$T")
out '\n### 2. mixed tree: %s files, %s MiB (30k text files 1-64 KiB, six 2-8 MiB text files, a %s MiB file: half text, half random)\n\n' \
    "$(find "$T" -type f | wc -l)" "$(mib "$src")" "$(mib "$(stat -c %s "$T/media/big.bin")")"
out '| tool | seconds | peak RSS MiB | size MiB | size / source |\n|---|---|---|---|---|\n| source (du -sb) | - | - | %s | 1.00 |\n' "$(mib "$src")"
run "$STRATA" --store "$D/store" commit --set b "$T"; n=$(size "$D/store")
out '| strata store | %s | %s | %s | %s |\n' "$SECS" "$RSS" "$(mib "$n")" "$(div "$n" "$src")"
if [ -n "$BEFORE" ]; then
    "$BEFORE" --store "$D/before" init >/dev/null
    run "$BEFORE" --store "$D/before" commit --set b "$T"; n=$(size "$D/before")
    out '| strata before (%s) | %s | %s | %s | %s |\n' "$BEFORE_BIN_DIR" "$SECS" "$RSS" "$(mib "$n")" "$(div "$n" "$src")"
    rm -rf "$D/before"
fi
run restic --repo "$D/restic" backup -q "$T"; n=$(size "$D/restic")
out '| restic repo | %s | %s | %s | %s |\n' "$SECS" "$RSS" "$(mib "$n")" "$(div "$n" "$src")"
run mksquashfs "$T" "$D/tree.sqfs" -comp zstd -no-progress -quiet; n=$(size "$D/tree.sqfs")
out '| mksquashfs -comp zstd | %s | %s | %s | %s |\n' "$SECS" "$RSS" "$(mib "$n")" "$(div "$n" "$src")"
rm -rf "$D"
fi

# 3. sparse file
if want 3; then
D="$WORK/s3"; setup "$D"; F="$D/tree/sparse.bin"; mkdir -p "$D/tree"
n=$(SZ 1024); echo "3. sparse file of $(mib "$n") MiB..." >&2
truncate -s "$n" "$F"
for off in 0 $(( n / 2 / 4096 * 4096 )) $(( n - 4096 )); do
    dd if=/dev/urandom of="$F" bs=4096 count=1 seek=$(( off / 4096 )) conv=notrunc status=none
done
seekdata() {
    python3 -c 'import os,sys
try: fd=os.open(sys.argv[1],os.O_RDONLY); print(os.lseek(fd,4096,os.SEEK_DATA))
except OSError as e: print("error:", e)' "$1" 2>&1 | tr '|' '/'
}
s0=$(size "$D/store"); r0=$(size "$D/restic")
out '\n### 3. sparse file: %s MiB, 3 x 4 KiB of data at 0, %s MiB and the end\n\n' "$(mib "$n")" "$(mib $(( n / 2 / 4096 * 4096 )))"
out '| tool | seconds | peak RSS MiB | store growth KiB |\n|---|---|---|---|\n'
run "$STRATA" --store "$D/store" commit --set b "$D/tree"
out '| strata commit | %s | %s | %s |\n' "$SECS" "$RSS" $(( ($(size "$D/store") - s0) / 1024 ))
run restic --repo "$D/restic" backup -q "$D/tree"
out '| restic backup | %s | %s | %s |\n' "$SECS" "$RSS" $(( ($(size "$D/restic") - r0) / 1024 ))
S "$D" mount "$D/mnt" >/dev/null; M="$D/mnt/b/latest/sparse.bin"
c=$(cmp "$F" "$M" 2>&1 && echo identical || true)
out '\n| through | stat -c %%b (512 B blocks) | SEEK_DATA from 4096 | cmp with the source |\n|---|---|---|---|\n'
out '| native | %s | %s | - |\n' "$(stat -c %b "$F")" "$(seekdata "$F")"
out '| strata mount | %s | %s | %s |\n' "$(stat -c %b "$M" 2>&1)" "$(seekdata "$M")" "$(printf '%s' "$c" | tr '|\n' '/ ')"
S "$D" unmount "$D/mnt" >/dev/null
rm -rf "$D"
fi

# 4. commit throughput on four 1 GiB files
if want 4; then
D="$WORK/s4"; setup "$D"; T="$D/tree"; mkdir -p "$T"
echo "4. writing 4 x $(mib "$(SZ 1024)") MiB..." >&2
for i in 0 1 2 3; do genrand "$T/f$i.bin" "$(SZ 1024)"; done
n=$(size "$T")
out '\n### 4. commit throughput: 4 random files, %s MiB in all (page cache warm)\n\n' "$(mib "$n")"
out '| step | seconds | MB/s | peak RSS MiB |\n|---|---|---|---|\n'
run "$STRATA" --store "$D/store" commit --set b "$T"; out '| strata commit (first) | %s | %s | %s |\n' "$SECS" "$(mbs "$n" "$SECS")" "$RSS"
if [ -n "$BEFORE" ]; then
    "$BEFORE" --store "$D/before" init >/dev/null
    run "$BEFORE" --store "$D/before" commit --set b "$T"; out '| strata before (first) | %s | %s | %s |\n' "$SECS" "$(mbs "$n" "$SECS")" "$RSS"
fi
run restic --repo "$D/restic" backup -q "$T"; out '| restic backup (first) | %s | %s | %s |\n' "$SECS" "$(mbs "$n" "$SECS")" "$RSS"
dd if=/dev/urandom of="$T/f1.bin" bs=65536 count=1 seek=$(( $(SZ 1024) / 65536 / 3 )) conv=notrunc status=none
catf "$T/f1.bin"; run bash -c 'catf "$1"' _ "$T/f1.bin"
out '| floor: cat of the edited file (warm) | %s | %s | %s |\n' "$SECS" "$(mbs "$(SZ 1024)" "$SECS")" "$RSS"
run "$STRATA" --store "$D/store" commit --set b "$T"; out '| strata commit (64 KiB edited) | %s | - | %s |\n' "$SECS" "$RSS"
if [ -n "$BEFORE" ]; then
    run "$BEFORE" --store "$D/before" commit --set b "$T"; out '| strata before (64 KiB edited) | %s | - | %s |\n' "$SECS" "$RSS"
fi
run restic --repo "$D/restic" backup -q "$T"; out '| restic backup (64 KiB edited) | %s | - | %s |\n' "$SECS" "$RSS"
rm -rf "$D"
fi

# 5. cold and warm cat through the mount
if want 5; then
D="$WORK/s5"; setup "$D"; F="$D/tree/f.bin"; mkdir -p "$D/tree"
n=$(SZ 512); echo "5. cat of $(mib "$n") MiB..." >&2
genrand "$F" "$n"; S "$D" commit --set b "$D/tree" >/dev/null
M="$D/mnt/b/latest/f.bin"
out '\n### 5. cat of a %s MiB random file, 3 rounds (each strata row against the native run of its round)\n\n| round | run | seconds | MB/s | x native |\n|---|---|---|---|---|\n' "$(mib "$n")"
row() { run bash -c 'catf "$1"' _ "$3"; out '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$SECS" "$(mbs "$n" "$SECS")" "$(div "$SECS" "${4:-$SECS}")"; }
for r in 1 2 3; do
    rm -rf "$D/store/assembled"
    cold; row "$r" "native, cold" "$F"; NC=$SECS
    row "$r" "native, warm" "$F"; NW=$SECS
    S "$D" mount "$D/mnt" >/dev/null
    cold; row "$r" "strata, first open, cold (fresh mount, no copy)" "$M" "$NC"
    row "$r" "strata, warm, right after (FUSE page cache, copy being made)" "$M" "$NW"
    # Later opens are served by passthrough of the assembled copy, once made.
    for _ in $(seq 600); do
        ls "$D/store/assembled" 2>/dev/null | grep -qv '^\.' && break; sleep 0.1
    done
    row "$r" "strata, warm, passthrough of the copy" "$M" "$NW"
    cold; row "$r" "strata, later open, cold (passthrough)" "$M" "$NC"
    S "$D" unmount "$D/mnt" >/dev/null; S "$D" mount "$D/mnt" >/dev/null
    cold; row "$r" "strata, cold after remount (copy hashed at first open)" "$M" "$NC"
    S "$D" unmount "$D/mnt" >/dev/null
done
rm -rf "$D"
fi

# 6. peak commit RSS with a 16 GiB file
if want 6 && [ "${SKIP_16G:-0}" != 1 ]; then
    D="$WORK/s6"; setup "$D"; F="$D/tree/huge.bin"; mkdir -p "$D/tree"
    n=$(SZ 16384); echo "6. writing $(mib "$n") MiB..." >&2
    genrand "$F" "$n"
    run "$STRATA" --store "$D/store" commit --set b "$D/tree"
    out '\n### 6. one %s MiB random file\n\n| step | seconds | MB/s | peak RSS MiB |\n|---|---|---|---|\n' "$(mib "$n")"
    out '| strata commit | %s | %s | %s |\n' "$SECS" "$(mbs "$n" "$SECS")" "$RSS"
    rm -rf "$D"
fi
echo "results: $RESULTS" >&2
