#!/usr/bin/env bash
# A GPU bundle (scripts/gpu-bundle) built against candle-core with a raised capture upload
# limit, without touching this checkout's Cargo.toml or Cargo.lock:
#
#     bash scripts/candle-upload-cap-bundle.sh [--bytes N] GPU_BUNDLE_ARGS...
#
# e.g. bash scripts/candle-upload-cap-bundle.sh --out .upcap-bundle --no-tests --no-examples \
#        -- --features candle --example 20-candle-upload-cap --test candle
#
# It copies the working tree (tracked and untracked files git does not ignore) into a
# temporary folder, patches candle-core there with scripts/candle-upload-cap.sh (N bytes per
# upload, 16 MiB by default) through `[patch.crates-io]`, sets CUDA_GRAPH_CANDLE_UPLOAD_CAP=N
# for the build (what example 20 and tests/candle.rs read, with option_env!, as the limit
# the build was made against), and runs scripts/gpu-bundle there. A relative --out is taken
# from this checkout's root, so the bundle lands here. Set CARGO_TARGET_DIR to reuse a target
# folder (candle's kernels are then not compiled again: only candle-core and what depends on
# it are rebuilt); without it the copy builds into a target folder of its own, deleted
# afterwards. The copy and the patched candle-core stay in $CARGO_TARGET_DIR/candle-upload-cap.
# The CUDA toolchain comes from scripts/cuda-toolchain.sh, as for the candle tier.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bytes=16777216
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --bytes) bytes=${2:?--bytes needs a number}; shift 2 ;;
    --bytes=*) bytes=${1#--bytes=}; shift ;;
    --out) args+=("--out" "$(cd "$root" && realpath -m -- "${2:?--out needs a folder}")"); shift 2 ;;
    --) args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ $bytes =~ ^[0-9]+$ ]] || { echo "candle-upload-cap-bundle: --bytes $bytes is not a number" >&2; exit 2; }
has_out=0
for a in "${args[@]}"; do [[ $a == --out ]] && has_out=1; done
if [[ $has_out -eq 0 ]]; then
  args=("--out" "$root/.upcap-bundle" "${args[@]}")
fi

eval "$(bash "$root/scripts/cuda-toolchain.sh")"
# The copy lives at a fixed place next to the target folder, its files keeping their times,
# so that a second run rebuilds only what changed.
if [[ -n ${CARGO_TARGET_DIR:-} ]]; then
  work="$CARGO_TARGET_DIR/candle-upload-cap"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/upcap-bundle.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  export CARGO_TARGET_DIR="$work/target"
fi
mkdir -p "$work"

# The working tree, without what git ignores (target folders, bundles, .toolchain); files
# git lists but the tree no longer has (deleted, not committed) are left out.
rm -rf "$work/ws"
mkdir "$work/ws"
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
  while IFS= read -r -d '' f; do
    if [[ -e "$root/$f" ]]; then
      (cd "$root" && cp --parents --preserve=timestamps -- "$f" "$work/ws/")
    fi
  done

# candle-core with the limit raised, outside the copy's workspace folder (a path dependency
# inside it would become a workspace member); kept as it is when the patch is unchanged.
rm -rf "$work/candle-core.new"
patch=$(bash "$work/ws/scripts/candle-upload-cap.sh" "$work/candle-core.new" "$bytes")
if [[ -d "$work/candle-core" ]] && diff -rq "$work/candle-core" "$work/candle-core.new" >/dev/null; then
  rm -rf "$work/candle-core.new"
else
  rm -rf "$work/candle-core"
  mv "$work/candle-core.new" "$work/candle-core"
fi
printf '%s\n' "${patch//candle-core.new/candle-core}" >>"$work/ws/Cargo.toml"
echo "candle-upload-cap-bundle: candle-core patched to $bytes bytes per upload; CUDA_GRAPH_CANDLE_UPLOAD_CAP=$bytes" >&2

export CUDA_GRAPH_CANDLE_UPLOAD_CAP=$bytes
cd "$work/ws"
python3 scripts/gpu-bundle "${args[@]}"
