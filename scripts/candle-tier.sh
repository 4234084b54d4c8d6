#!/usr/bin/env bash
# The second test command (README.md): the candle tier and the two build-beside checks.
#
# candle's CUDA kernels are compiled by nvcc when candle-core's `cuda` feature builds, so this
# tier cannot be part of `cargo test --workspace` on a machine without a CUDA toolkit. This
# script installs what it needs into `.toolchain/` (scripts/cuda-toolchain.sh: pinned nvcc
# wheels and link stubs) and then:
#   1. builds ci/beside-cubecl (graph-runtime beside cudarc with cubecl-cuda's features),
#      before the toolchain is on PATH: it must build without one;
#   2. lints the workspace with the `candle` feature (`cargo clippy -D warnings`);
#   3. runs graph-runtime's and the root package's tests with it (`tests/candle.rs`; without a
#      GPU its GPU tests count as ignored, CUDA_GRAPH_REQUIRE_GPU=1 makes them fail);
#   4. builds the candle examples (12-candle-mlp, 13-candle-decoder, 16-candle-llama-decode);
#   5. builds and runs ci/beside-candle (graph-runtime beside candle-core `cuda`, linked).
# A clean run took 42 minutes on 2 cores shared with other builds, most of it nvcc compiling
# candle's kernels, twice: the lint (a check build) and the test build give candle-kernels'
# build script differently built dependencies (cudaforge's), so each runs nvcc; the package
# selection makes no difference.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
step() { echo "+ $*"; "$@"; }

echo "== build beside cubecl-cuda's cudarc features, no toolkit"
(cd ci/beside-cubecl && step cargo build --locked && step "$CARGO_TARGET_DIR/debug/beside-cubecl")

echo "== toolchain"
eval "$(bash scripts/cuda-toolchain.sh)"

echo "== the candle tier"
step cargo clippy --workspace --all-targets --features cuda-graphs/candle -- -D warnings
# Binaries linked against candle ask for libcuda.so.1 & co.: here, the stubs (no GPU).
export LD_LIBRARY_PATH="$CUDA_GRAPH_STUBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step cargo test -p graph-runtime --features candle --lib
step cargo test -p cuda-graphs --features candle --test candle
step cargo build -p cuda-graphs --features candle --example 12-candle-mlp --example 13-candle-decoder \
  --example 16-candle-llama-decode

echo "== build beside candle-core's cuda feature"
(cd ci/beside-candle && step cargo build --locked && step "$CARGO_TARGET_DIR/debug/beside-candle")
echo "candle tier: ok"
