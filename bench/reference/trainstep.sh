#!/usr/bin/env bash
# Training-step benchmark on a GPU machine: gpukit-trainbench (graph, eager,
# GEMM floor) and trainstep.py (PyTorch eager, whole-step CUDA graph,
# torch.compile) alternate for ROUNDS rounds (default 3) on the same GPU;
# each line is already a median of 7 timed repeats. Prints the JSON lines
# and then a markdown table of medians (for BENCHMARKS.md).
#   usage: trainstep.sh [PRECISIONS]   (default tf32; e.g. tf32,bf16,f32)
# GPUKIT_TRAINBENCH names the driver (default: ../gpukit-trainbench beside
# this directory in the GPU bundle, else gpukit-trainbench on PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prec=${1:-tf32}
rounds=${ROUNDS:-3}
drv=${GPUKIT_TRAINBENCH:-$here/../gpukit-trainbench}
[ -x "$drv" ] || drv=$(command -v gpukit-trainbench)
work=$(mktemp -d)
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/cache} PYTHONUNBUFFERED=1
for r in $(seq "$rounds"); do
	echo "round $r/$rounds" >&2
	"$drv" --precision "$prec" | tee -a "$work/gpukit.jsonl"
	python3 "$here/trainstep.py" --precision "$prec" | tee -a "$work/torch.jsonl"
done
python3 "$here/trainstep.py" --report "$work/gpukit.jsonl" "$work/torch.jsonl"
