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
#   3. runs graph-runtime's tests and doc examples and the root package's tests with it
#      (`tests/candle.rs`; without a
#      GPU its GPU tests count as ignored, CUDA_GRAPH_REQUIRE_GPU=1 makes them fail);
#   4. builds the candle examples (12-candle-mlp, 13-candle-decoder, 16-candle-llama-decode and
#      the real-models tier, 17-candle-bert, 18-candle-resnet, 19-candle-llama-window);
#   5. builds and runs ci/beside-candle (graph-runtime beside candle-core `cuda`, linked).
# candle's kernels are compiled once per run: the workspace (and ci/beside-candle) say
# `[profile.dev.build-override] debug = false`, so the lint's check build, the test build and
# beside-candle give candle-kernels' build script the same dependencies and share its nvcc run
# (left to cargo's default, a build dependency that is also a normal one, like glob, is built
# with debug info only when the normal one is compiled rather than checked, and nvcc ran twice
# or three times). Each step prints its duration.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
step() { echo "+ $*"; local t0=$SECONDS; "$@"; echo "candle tier: step took $((SECONDS - t0)) s"; }

echo "== build beside cubecl-cuda's cudarc features, no toolkit"
(cd ci/beside-cubecl && step cargo build --locked && step "$CARGO_TARGET_DIR/debug/beside-cubecl")

echo "== toolchain"
t0=$SECONDS
eval "$(bash scripts/cuda-toolchain.sh)"
echo "candle tier: toolchain took $((SECONDS - t0)) s"

echo "== the candle tier"
step cargo clippy --workspace --all-targets --features cuda-graphs/candle -- -D warnings
# Binaries linked against candle ask for libcuda.so.1 & co.: here, the stubs (no GPU).
export LD_LIBRARY_PATH="$CUDA_GRAPH_STUBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step cargo test -p graph-runtime --features candle --lib
# The doc examples with candle on, the candle module's among them.
step cargo test -p graph-runtime --features candle --doc
step cargo test -p cuda-graphs --features candle --test candle
step cargo build -p cuda-graphs --features candle --example 12-candle-mlp --example 13-candle-decoder \
  --example 16-candle-llama-decode --example 17-candle-bert --example 18-candle-resnet \
  --example 19-candle-llama-window

echo "== build beside candle-core's cuda feature"
(cd ci/beside-candle && step cargo build --locked && step "$CARGO_TARGET_DIR/debug/beside-candle")
echo "candle tier: ok"
