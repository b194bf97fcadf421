#!/usr/bin/env bash
# Side-by-side benchmarks on a GPU machine: gpukit's driver and PyTorch's
# reference run the same workloads (workloads.json), alternating, for ROUNDS
# rounds (default 5); each round times every workload once with CUDA events
# after warm-up. report.py takes the median per workload, the ratio and the
# physical floor, prints a table and writes results/<date>-<gpu>.json
# (to $BENCH_OUT when set, else results/).
#   usage: bench/run.sh [FILTER]   (FILTER: substring of a workload key)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-5}
filter=${1:-}
work=$(mktemp -d)
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/cache}
export PYTHONUNBUFFERED=1
for r in $(seq "$rounds"); do
	echo "round $r/$rounds" >&2
	"$here/gpukit-bench" --spec "$here/workloads.json" ${filter:+--filter "$filter"} >>"$work/gpukit.jsonl"
	python3 "$here/reference/bench.py" $filter >>"$work/ref.jsonl"
done
dest=${BENCH_OUT:-$here/results}
mkdir -p "$dest"
python3 "$here/report.py" --out "$dest" "$work/gpukit.jsonl" "$work/ref.jsonl"
