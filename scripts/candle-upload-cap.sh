#!/usr/bin/env bash
# candle-core with a larger capture upload cache, for a model you cannot change.
#
#     bash scripts/candle-upload-cap.sh DIR [BYTES]
#
# candle-core 0.11 serves a host upload made inside a CUDA graph capture from a per-thread cache
# of the warmup runs' uploads, and caches only uploads of at most 4096 bytes
# (`CUDA_GRAPH_HTOD_CACHE_MAX_BYTES` in src/cuda_backend/device.rs). A model that builds a mask
# or position buckets on the host in every forward (T5, Qwen2, Phi) therefore cannot be captured
# above 32 to 64 tokens: the capture fails with `GraphError::HostUploadInCapture`.
#
# This copies candle-core from cargo's registry (the version in Cargo.lock) into DIR, raises the
# limit to BYTES (default 16 MiB), and prints the `[patch.crates-io]` lines for your workspace's
# Cargo.toml. What it changes: the cache is only consulted while a graph's warmup and capture
# run (graph_runtime holds candle's cache guard then), so eager candle work and replays are
# untouched; each distinct upload made during a warmup stays cached on the device for the
# thread's life (a 512-token f32 mask: 1 MiB), and a lookup hashes the upload's bytes.
set -euo pipefail
dir=${1:?usage: candle-upload-cap.sh DIR [BYTES]}
bytes=${2:-16777216}
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(awk '/^name = "candle-core"$/ {getline; gsub(/"/, "", $3); print $3; exit}' "$root/Cargo.lock")
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
src=$(ls -d "$registry"/*/"candle-core-$version" 2>/dev/null | head -1 || true)
if [[ -z $src ]]; then
  echo "candle-upload-cap: candle-core $version is not in $registry; run \`cargo fetch\` first" >&2
  exit 1
fi
file=src/cuda_backend/device.rs
pattern='^const CUDA_GRAPH_HTOD_CACHE_MAX_BYTES: usize = [0-9_]*;'
if ! grep -q "$pattern" "$src/$file"; then
  echo "candle-upload-cap: candle-core $version has no CUDA_GRAPH_HTOD_CACHE_MAX_BYTES constant to raise" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
cp -r "$src" "$dir"
sed -i "s/$pattern/const CUDA_GRAPH_HTOD_CACHE_MAX_BYTES: usize = $bytes;/" "$dir/$file"
grep -n "CUDA_GRAPH_HTOD_CACHE_MAX_BYTES: usize" "$dir/$file" >&2
cat <<PATCH
# candle-core $version with a capture upload cache of $bytes bytes per upload
[patch.crates-io]
candle-core = { path = "$(cd "$dir" && pwd)" }
PATCH
