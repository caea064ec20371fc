#!/usr/bin/env bash
# Builds strata and runs the main job on the embedded default store:
# commit a directory twice (a base, then a delta), list, read back, verify.
#   scripts/quickstart.sh [DIR]     (DIR defaults to this repository's src/)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-src}"
cargo build --release --quiet
export PATH="$PWD/target/release:$PATH"
export STRATA_STORE="${STRATA_STORE:-${XDG_DATA_HOME:-$HOME/.local/share}/strata}"
set -x
strata init
strata commit --set quickstart -m "first look" "$DIR"
strata commit --set quickstart -m "nothing changed" "$DIR"
strata log --set quickstart
strata ls --set quickstart
strata verify --set quickstart --all
