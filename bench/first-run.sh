#!/usr/bin/env bash
# bench/first-run.sh — issue 21's first-run figure on a GPU machine: the
# wall time of `trainer run` for one step of the shakespeare-char GPT (6
# layers, 6 heads, d 384, block 256, batch 64, bf16, dropout 0.2, one
# evaluation batch) as JSON lines on stdout (and in $BENCH_OUT/first-run.jsonl
# when set), each case in a fresh process:
#
#   empty   a new, empty GPUKIT_CACHE_DIR (kernels compile in parallel, only
#           those the run launches; target: within 10 s)
#   serial  the same with GPUKIT_COMPILE_JOBS=1 (only what the run launches,
#           one compilation at a time)
#   warm    again on the cache the empty run filled
#   libgpu  kernelc build --libgpu (what `make install` warms) into an empty
#           cache: its own time, then the run on that cache
#   before  (BEFORE=PATH, a trainer built from the commit before issue 21)
#           that binary on an empty cache
#
# usage: bench/first-run.sh [TEXT]   (default $GPUKIT_TEXT, which the GPU
# bundle's run.sh sets to Newton's Opticks)
# Runs inside the GPU bundle (bin/) or a source tree with ./bin built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
text=${1:-${GPUKIT_TEXT:-$root/data/Isaac.Newton-Opticks.txt}}
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpt=(--model gpt --data "$text" --layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --precision bf16
	--dropout 0.2 --steps 1 --eval-every 1 --eval-batches 1)
n=0

# run CASE TRAINER CACHE [VAR=VALUE...]: one timed run, one JSON line.
run() {
	local case=$1 trainer=$2 cache=$3
	shift 3
	n=$((n + 1))
	local start end
	start=$(date +%s.%N)
	env GPUKIT_CACHE_DIR="$cache" "$@" "$trainer" run "${gpt[@]}" --out "$work/run$n" >"$work/run$n.jsonl" 2>"$work/run$n.err" ||
		{ echo "first-run: $case failed:" >&2; tail -20 "$work/run$n.err" >&2; exit 1; }
	end=$(date +%s.%N)
	printf '{"workload":"first-run","case":"%s","wall_s":%.2f,"cache_entries":%d,"cpus":%d}\n' \
		"$case" "$(awk "BEGIN { print $end - $start }")" "$(find "$cache" -maxdepth 1 -type f 2>/dev/null | wc -l)" "$(nproc)" | tee -a "$out/first-run.jsonl"
}

if [ -n "${BEFORE:-}" ]; then
	run before "$BEFORE" "$work/cache-before"
fi
run empty "$bin/trainer" "$work/cache-empty"
run warm "$bin/trainer" "$work/cache-empty"
run serial "$bin/trainer" "$work/cache-serial" GPUKIT_COMPILE_JOBS=1
start=$(date +%s.%N)
GPUKIT_CACHE_DIR="$work/cache-libgpu" "$bin/kernelc" build --libgpu >/dev/null
end=$(date +%s.%N)
printf '{"workload":"first-run","case":"kernelc build --libgpu","wall_s":%.2f,"cpus":%d}\n' \
	"$(awk "BEGIN { print $end - $start }")" "$(nproc)" | tee -a "$out/first-run.jsonl"
run libgpu "$bin/trainer" "$work/cache-libgpu"
