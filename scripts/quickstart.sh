#!/usr/bin/env bash
# Builds strata and runs the main job on the embedded default store: commit a
# directory, mount the store, browse the generation with ordinary tools,
# commit again and watch `latest` follow, verify, plan a sweep, unmount.
#   scripts/quickstart.sh [DIR]     (DIR defaults to this repository's src/)
# Mounting needs /dev/fuse and root (or a user allowed to mount FUSE).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="$(realpath "${1:-src}")"
cargo build --release --quiet --workspace
export PATH="$PWD/target/release:$PATH"
export STRATA_STORE="${STRATA_STORE:-${XDG_DATA_HOME:-$HOME/.local/share}/strata}"
MNT="$(mktemp -d "${TMPDIR:-/tmp}/strata-mount.XXXXXX")"
trap 'strata unmount --lazy "$MNT" >/dev/null 2>&1 || true; rmdir "$MNT" 2>/dev/null || true' EXIT
set -x
strata init
strata commit --set quickstart -m "first look" "$DIR"
strata mount "$MNT"
ls -l "$MNT/quickstart/"
find "$MNT/quickstart/latest/" | head -20
diff -r --no-dereference "$DIR" "$MNT/quickstart/latest/" && echo "mounted generation matches $DIR"
strata commit --set quickstart -m "nothing changed" "$DIR"
strata log --set quickstart
strata verify --set quickstart --all
strata sweep --dry-run
strata unmount "$MNT"
