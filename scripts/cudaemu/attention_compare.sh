#!/usr/bin/env bash
# Compares libgpu/kernels/attention.cu in the working tree with the same
# file at git revision ATTN_BASE (default HEAD: a rewrite against the last
# commit), each compiled with its own revision's kernel headers, under the
# CPU emulator: attention_test.cpp is built once with each, run with
# ATTN_EMU_DIGEST=1, and every checked output (o, lse, δ, dQ, dK, dV,
# decode, kv_write of every kernel and shape in the test) must be the same
# bit for bit. Written for rewriting attention.cu's kernels over shared tile
# templates (ATTN_BASE=120e4cb^ is the file before that rewrite).
# Usage: [ATTN_BASE=REV] scripts/cudaemu/attention_compare.sh [quick|wg|drop]
set -euo pipefail
cd "$(dirname "$0")/../.."
cxx=$(command -v g++ || command -v clang++ || true)
[ -n "$cxx" ] || { echo "attention_compare: no C++ compiler" >&2; exit 2; }
out=${TMPDIR:-/tmp}/gpukit-emu-attn-compare
base=${ATTN_BASE:-HEAD}
rm -rf "$out/base" && mkdir -p "$out/base"
git archive "$base" libgpu/kernels | tar -x -C "$out/base" ||
	{ echo "attention_compare: no libgpu/kernels at revision $base" >&2; exit 2; }
flags=(-std=c++17 -O2 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -I scripts/cudaemu)
"$cxx" "${flags[@]}" -I libgpu/kernels -o "$out/new" scripts/cudaemu/attention_test.cpp &
c1=$!
# attention_test.cpp includes ATTN_CU_FILE: the base's, which finds its
# own revision's headers beside it.
"$cxx" "${flags[@]}" -I "$out/base/libgpu/kernels" -DATTN_CU_FILE="\"$out/base/libgpu/kernels/attention.cu\"" \
	-o "$out/old" scripts/cudaemu/attention_test.cpp
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
