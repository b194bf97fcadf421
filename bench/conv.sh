#!/usr/bin/env bash
# bench/conv.sh — issue 24's convolution table on a GPU machine: gpukit's
# bf16 3×3 convolutions (Go benchmark BenchmarkConv2D in libgpu/ops: the
# mma.sync implicit GEMM, the wgmma kernels of conv2d_wg.cu on sm_90a,
# the same warp-specialised (ws), ws with TMA loads (tma: conv2d_tma.cu,
# the default) and im2col + cuBLASLt; forward with bias, and
# backward: input and weight gradients)
# beside PyTorch's cuDNN at the same shapes (bench/reference/conv.py,
# channels-last, cudnn.benchmark) in the same run. JSON lines on stdout
# (and $BENCH_OUT/conv.jsonl when set), then a Markdown table on stderr:
# TFLOP/s per path and the mma, wg, ws and tma paths over cuDNN (target ≥ 0.9).
#
# usage: bench/conv.sh   (inside the GPU bundle: tests/libgpu_ops.test;
#        GPUKIT_BENCH_TIME sets -test.benchtime, default 20x)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
: >"$out/conv.jsonl"
t=$root/tests/libgpu_ops.test
[ -x "$t" ] || { echo "bench/conv.sh: $t not found (build the GPU bundle)" >&2; exit 2; }
(cd "$root/tests/libgpu_ops.d" && GPUKIT_REQUIRE_GPU=1 "$t" -test.run '^$' -test.bench '^BenchmarkConv2D$' \
	-test.benchtime "${GPUKIT_BENCH_TIME:-20x}") | python3 "$here/conv_table.py" go | tee -a "$out/conv.jsonl"
python3 "$here/reference/conv.py" | tee -a "$out/conv.jsonl"
python3 "$here/conv_table.py" table <"$out/conv.jsonl" >&2
