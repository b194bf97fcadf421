#!/usr/bin/env bash
# bench/moe.sh — issue 20's Mixture-of-Experts benchmarks on a GPU machine,
# gpukit and PyTorch in the same run, as JSON lines (Go benchmark lines as
# they print) on stdout and in $BENCH_OUT/moe.jsonl when set:
#
#   grouped  the grouped GEMM in bf16 (BenchmarkGroupedGEMM: forward, dx and
#            dw at 8 experts × 4096 tokens 768 → 3072, balanced and skewed
#            1.64×, and 64 experts 65536 × 768 → 512 skewed 3.72×, on both
#            wgmma tile widths) against torch._grouped_mm (moe.py grouped)
#   step     a training step of nanoMoE's shape (6 layers, d 384, 8 experts,
#            top-2, batch 64 × 256, bf16): BenchmarkMoEGPTStep (CUDA graph,
#            with the dense GPT beside it) against moe.py bench (eager and
#            torch.compile)
#
# usage: bench/moe.sh [grouped|step|all]   (default all)
# Runs inside the GPU bundle (tests/libgpu_ops.test, tests/libgpu_nn.test).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
what=${1:-all}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
emit() { tee -a "$out/moe.jsonl"; }
gobench() { # package, benchmark regex, benchtime
	local t=$root/tests/$1.test
	[ -x "$t" ] || { echo "moe.sh: $t missing (build the bundle with $1)" >&2; return 1; }
	(cd "$root/tests/$1.d" && GPUKIT_REQUIRE_GPU=1 "$t" -test.run '^$' -test.bench "$2" -test.benchtime "$3") |
		grep -E '^Benchmark|busiest|parameters|^(ok|PASS|FAIL)' | emit
}
if [ "$what" = grouped ] || [ "$what" = all ]; then
	gobench libgpu_ops 'GroupedGEMM' 30x
	python3 "$root/bench/reference/moe.py" grouped | emit
fi
if [ "$what" = step ] || [ "$what" = all ]; then
	gobench libgpu_nn 'MoEGPTStep' 30x
	python3 "$root/bench/reference/moe.py" bench | emit
fi
