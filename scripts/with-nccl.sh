#!/usr/bin/env bash
# Runs a command with libnccl loadable by cudarc, then execs it:
#
#   bash scripts/with-nccl.sh ./target/release/examples/10-tensor-parallel-mlp --json
#
# cudarc 0.19 loads NCCL by the names `libnccl.so`, `libnccl.so.<CUDA major>`, … but the
# NCCL runtime package and PyTorch's wheel install it only as `libnccl.so.2`. When no
# `libnccl.so` is on the loader path, this script finds a `libnccl.so.2` (NCCL_LIB if set,
# else the ldconfig cache, the usual system directories, then the installed PyTorch's
# nvidia/nccl/lib), links it as `libnccl.so` in a private directory and puts that directory
# first on LD_LIBRARY_PATH (with `libnccl.so.2` beside it, for binaries that link NCCL).
# NCCL_LIB=/path/to/libnccl.so.2 is used even where a `libnccl.so` is already found.
# Nothing else in the environment changes (NCCL_NVLS_ENABLE and
# every other NCCL_* variable are passed through as they are).
set -euo pipefail

if [[ $# -eq 0 ]]; then
  echo "usage: bash scripts/with-nccl.sh COMMAND [ARGS...]" >&2
  exit 2
fi

cache=$(ldconfig -p 2>/dev/null || true)

have_unversioned() {
  grep -q 'libnccl\.so ' <<<"$cache" && return 0
  local d
  IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
  for d in "${dirs[@]}"; do
    [[ -n $d && -e $d/libnccl.so ]] && return 0
  done
  return 1
}

find_nccl() {
  if [[ -n ${NCCL_LIB:-} ]]; then
    [[ -e $NCCL_LIB ]] && { echo "$NCCL_LIB"; return; }
    echo "with-nccl: NCCL_LIB=$NCCL_LIB does not exist" >&2
    return 1
  fi
  local p
  p=$(awk '/libnccl\.so\.2 / {print $NF; exit}' <<<"$cache")
  [[ -n $p && -e $p ]] && { echo "$p"; return; }
  for p in /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/lib64/libnccl.so.2 \
           /usr/local/cuda/lib64/libnccl.so.2 /usr/local/nccl/lib/libnccl.so.2; do
    [[ -e $p ]] && { echo "$p"; return; }
  done
  p=$(python3 - <<'EOF' 2>/dev/null || true
import os
try:
    import nvidia.nccl
    for base in list(getattr(nvidia.nccl, "__path__", [])):
        lib = os.path.join(base, "lib", "libnccl.so.2")
        if os.path.exists(lib):
            print(lib)
            break
except Exception:
    pass
EOF
)
  [[ -n $p && -e $p ]] && { echo "$p"; return; }
  echo "with-nccl: no libnccl.so.2 found (install libnccl2, or PyTorch, or set NCCL_LIB)" >&2
  return 1
}

# NCCL_LIB, when set, always wins (to compare against another build of NCCL, such as
# PyTorch's wheel's, on a machine that has its own).
if [[ -n ${NCCL_LIB:-} ]] || ! have_unversioned; then
  lib=$(find_nccl)
  dir=${TMPDIR:-/tmp}/nccl-link-$(id -u)
  mkdir -p "$dir"
  ln -sf "$lib" "$dir/libnccl.so"
  # A binary linked against NCCL (`candle` beside `nccl`: cudarc's dynamic-linking) asks the
  # loader for the soname itself.
  ln -sf "$lib" "$dir/libnccl.so.2"
  export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "with-nccl: $dir/libnccl.so -> $lib" >&2
fi
exec "$@"
