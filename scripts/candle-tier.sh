#!/usr/bin/env bash
# The second test command (README.md): the candle tier and the two build-beside checks.
#
# candle's CUDA kernels are compiled by nvcc when candle-core's `cuda` feature builds, so this
# tier cannot be part of `cargo test --workspace` on a machine without a CUDA toolkit. This
# script installs what it needs into `.toolchain/` (scripts/cuda-toolchain.sh: pinned nvcc
# wheels and link stubs) and then:
#   1. builds ci/beside-cubecl (graph-runtime beside cudarc with cubecl-cuda's features),
#      before the toolchain is on PATH: it must build without one; runs the ui cases that
#      need graph-runtime's `nccl` (`ui-tests/tests/fail-nccl/`);
#   2. lints the workspace with the `candle` feature (`cargo clippy -D warnings`), and with
#      `candle` and `nccl` together (a candle user with several GPUs);
#   3. runs graph-runtime's tests and doc examples and the root package's tests with it
#      (`tests/candle.rs`; without a
#      GPU its GPU tests count as ignored, CUDA_GRAPH_REQUIRE_GPU=1 makes them fail);
#   4. builds the candle examples (12-candle-mlp, 13-candle-decoder, 16-candle-llama-decode,
#      the real-models tier, 17-candle-bert, 18-candle-resnet, 19-candle-llama-window, and
#      20-candle-upload-cap), then with `nccl` too: the runtime's tests, `tests/multi_gpu_candle.rs`
#      and 25-tensor-parallel-llama;
#   5. builds and runs ci/beside-candle: graph-runtime beside cudarc with candle-core `cuda`'s
#      features (dynamic linking, version from nvcc), after ci/beside-candle/check-features.py
#      has checked that its cudarc line is the locked candle-core's and that the workspace's
#      candle build (steps 2-4: the real candle-core `cuda` linked with graph-runtime) builds
#      cudarc with graph-runtime's and candle-core's features and nothing more.
# candle's kernels are compiled once per run: the workspace gives build scripts and all
# dependencies no debug info, said explicitly (left to cargo's default, a build dependency
# that is also a normal one, like glob, is built with debug info only when the normal one is
# compiled rather than checked, so clippy's check build and the test build ran nvcc twice),
# every step selects the whole workspace with the same features (see below), and
# ci/beside-candle does not depend on candle-core (resolved as a user's crate resolves it, its
# build scripts' dependencies would differ and nvcc would run again).
# Each step prints its duration and CPU time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
# CPU seconds (user + system) of this shell's finished child processes, their children included.
cpu_s() {
  local stat
  read -r stat < "/proc/$BASHPID/stat" || { CPU=0; return; }
  local f=(${stat##*) })
  CPU=$(( (f[13] + f[14]) / $(getconf CLK_TCK) ))
}
step() {
  echo "+ $*"
  local t0=$SECONDS; cpu_s; local c0=$CPU
  "$@"
  cpu_s; echo "candle tier: step took $((SECONDS - t0)) s (CPU $((CPU - c0)) s)"
}

echo "== build beside cubecl-cuda's cudarc features, no toolkit"
(cd ci/beside-cubecl && step cargo build --locked && step "$CARGO_TARGET_DIR/debug/beside-cubecl")

echo "== the compile-fail cases that need graph-runtime's nccl (no toolkit either)"
step cargo test -p ui-tests --features nccl --test ui -- ui_nccl

echo "== toolchain"
t0=$SECONDS; cpu_s; c0=$CPU
eval "$(bash scripts/cuda-toolchain.sh)"
cpu_s; echo "candle tier: toolchain took $((SECONDS - t0)) s (CPU $((CPU - c0)) s)"

echo "== the candle tier"
step cargo clippy --workspace --all-targets --features cuda-graphs/candle -- -D warnings
# `nccl` beside `candle`: cudarc with candle-core's `dynamic-linking` and graph-runtime's
# `nccl` (candle-kernels' build script does not depend on cudarc, so nvcc does not run again).
step cargo clippy --workspace --all-targets --features cuda-graphs/candle,cuda-graphs/nccl -- -D warnings
# Binaries linked against candle ask for libcuda.so.1 & co.: here, the stubs (no GPU).
export LD_LIBRARY_PATH="$CUDA_GRAPH_STUBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Every cargo command of the tier selects the whole workspace with the same features, so cargo
# resolves the same build dependencies each time and candle-kernels' build script (nvcc) runs
# once: a narrower selection (`-p graph-runtime`) unifies the build scripts' dependencies
# differently (no graph-macros dev-dependencies, no candle-transformers) and compiles the
# kernels again.
ws=(--workspace --features cuda-graphs/candle)
step cargo test "${ws[@]}" --lib
# The doc examples with candle on, the candle module's among them.
step cargo test "${ws[@]}" --doc
step cargo test "${ws[@]}" --test candle
step cargo build "${ws[@]}" --example 12-candle-mlp --example 13-candle-decoder \
  --example 16-candle-llama-decode --example 17-candle-bert --example 18-candle-resnet \
  --example 19-candle-llama-window --example 20-candle-upload-cap
# Both features, as a candle user with several GPUs builds: linked against libnccl (here its
# stub), the runtime's own tests, the collectives on candle tensors (ignored without a GPU)
# and the tensor-parallel decoder.
both=(--workspace --features cuda-graphs/candle,cuda-graphs/nccl)
step cargo test "${both[@]}" --lib
step cargo test "${both[@]}" --test multi_gpu_candle
step cargo build "${both[@]}" --example 25-tensor-parallel-llama

echo "== build beside candle-core's cuda feature"
step python3 ci/beside-candle/check-features.py
(cd ci/beside-candle && step cargo build --locked && step "$CARGO_TARGET_DIR/debug/beside-candle")
echo "candle tier: ok"
