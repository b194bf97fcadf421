#!/usr/bin/env bash
# Runs a kernel family's emulation test (scripts/cudaemu/<family>_test.cpp):
# the family's .cu compiled for the host with scripts/cudaemu/emu.h, its
# kernels run on the CPU with the launch geometry of libgpu/ops and checked
# against float64 references. A developer tool for writing kernels without
# a GPU (see emu.h for what it emulates and checks); slow, so shapes are
# small. CUDA_EMU_ASAN=1 builds with AddressSanitizer (out-of-bounds global
# reads and writes; ASan warns that it does not fully support swapcontext).
# Usage: scripts/cuda-emu.sh FAMILY [args...]   (e.g. attention quick)
set -euo pipefail
cd "$(dirname "$0")/.."
fam=${1:?usage: scripts/cuda-emu.sh FAMILY [args...]}
shift
cxx=$(command -v g++ || command -v clang++ || true)
[ -n "$cxx" ] || { echo "cuda-emu: no C++ compiler" >&2; exit 2; }
out=${TMPDIR:-/tmp}/gpukit-emu-$fam
flags=(-O2)
if [ "${CUDA_EMU_ASAN:-0}" = 1 ]; then
	flags=(-O1 -fsanitize=address -fno-omit-frame-pointer)
	export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=0}
fi
"$cxx" -std=c++17 "${flags[@]}" -g -Wall -Wno-unused-function -Wno-unknown-pragmas -Wno-psabi -I scripts/cudaemu -I libgpu/kernels \
	-o "$out" "scripts/cudaemu/${fam}_test.cpp"
exec "$out" "$@"
