#!/usr/bin/env bash
# Compares libgpu/kernels/attention.cu with scripts/cudaemu/attention_old.cu
# (the file before the rewrite into shared tile templates, kept only for this
# comparison) under the CPU emulator: attention_test.cpp is built once with
# each, run with ATTN_EMU_DIGEST=1, and every checked output (o, lse, δ, dQ,
# dK, dV, decode, kv_write of every kernel and shape in the test) must be
# the same bit for bit. Usage: scripts/cudaemu/attention_compare.sh [quick|wg|drop]
set -euo pipefail
cd "$(dirname "$0")/../.."
cxx=$(command -v g++ || command -v clang++ || true)
[ -n "$cxx" ] || { echo "attention_compare: no C++ compiler" >&2; exit 2; }
out=${TMPDIR:-/tmp}/gpukit-emu-attn-compare
mkdir -p "$out"
flags=(-std=c++17 -O2 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -I scripts/cudaemu -I libgpu/kernels)
"$cxx" "${flags[@]}" -o "$out/new" scripts/cudaemu/attention_test.cpp &
c1=$!
"$cxx" "${flags[@]}" -DATTN_CU_FILE='"attention_old.cu"' -o "$out/old" scripts/cudaemu/attention_test.cpp
wait $c1
rm -f "$out/old.txt" "$out/new.txt"
ATTN_EMU_DIGEST=1 "$out/old" "$@" >"$out/old.txt" &
r1=$!
ATTN_EMU_DIGEST=1 "$out/new" "$@" >"$out/new.txt" || true
wait $r1 || true
n=$(grep -c digest "$out/new.txt" || true)
if diff "$out/old.txt" "$out/new.txt"; then
	echo "attention_compare: $n checked outputs identical bit for bit ($(tail -1 "$out/new.txt"))"
else
	echo "attention_compare: outputs differ (above: < old, > new)" >&2
	exit 1
fi
