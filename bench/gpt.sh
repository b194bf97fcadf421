#!/usr/bin/env bash
# bench/gpt.sh — issue 10's GPT benchmarks on a GPU machine, gpukit and
# PyTorch (bench/reference/gpt.py) in the same run, as JSON lines on stdout
# (and in $BENCH_OUT/gpt.jsonl when set):
#
#   step      the shakespeare-char GPT (6 layers, 6 heads, d 384, block 256,
#             batch 64, vocabulary 65, bf16, dropout 0): trainer's median
#             step time (CUDA graph) against PyTorch eager, torch.compile and
#             torch.compile(mode="reduce-overhead")
#   attention causal bf16 flash attention forward and forward+backward at
#             (64,6,256,64) and (8,16,2048,128) against F.scaled_dot_product_attention
#   recipe    (RECIPE=1) nanoGPT's shakespeare-char recipe end to end (5000
#             steps, dropout 0.2, eval of 200 batches every 250 steps): wall
#             time and final validation loss, trainer against torch.compile
#
# usage: bench/gpt.sh TEXT        (TEXT: tinyshakespeare.txt)
# Runs inside the GPU bundle (bin/trainer, tests/libgpu_ops.test) or a
# source tree with ./bin built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
text=${1:?usage: bench/gpt.sh TEXT}
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
emit() { tee -a "$out/gpt.jsonl"; }
shk=(--model gpt --data "$text" --layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --precision bf16)

# Step time: 300 steps, loss lines every 50; the first interval holds
# compilation and capture, so the median of the later ones.
"$bin/trainer" run "${shk[@]}" --out "$work/step" --steps 300 --log-every 50 --eval-every 300 --eval-batches 1 \
	--dropout 0 --clip 0 >"$work/step.jsonl" 2>"$work/step.err" || { cat "$work/step.err" >&2; exit 1; }
python3 - "$work/step.jsonl" <<'PY' | emit
import json, sys, statistics
ls = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l][1:]
ms = statistics.median(l["step_ms"] for l in ls)
print(json.dumps({"workload": "gpt-step", "impl": "gpukit-graph", "ms": ms, "mfu": ls[-1].get("mfu")}))
PY
python3 "$root/bench/reference/gpt.py" bench | emit

# Attention: the Go benchmarks (CUDA events, median) and SDPA.
ops=$root/tests/libgpu_ops.test
if [ -x "$ops" ]; then
	(cd "$root/tests/libgpu_ops.d" && GPUKIT_REQUIRE_GPU=1 "$ops" -test.run '^$' -test.bench 'Attention' -test.benchtime 50x) \
		| grep -E '^Benchmark|^{' | emit
fi
python3 "$root/bench/reference/gpt.py" attention | emit

if [ "${RECIPE:-0}" = 1 ]; then
	start=$(date +%s.%N)
	"$bin/trainer" run "${shk[@]}" --out "$work/recipe" --steps 5000 --lr 1e-3 --min-lr 1e-4 --warmup 100 \
		--dropout 0.2 --beta2 0.99 --weight-decay 0.1 --clip 1 --eval-every 250 --eval-batches 200 --log-every 500 \
		>"$work/recipe.jsonl" 2>"$work/recipe.err" || { cat "$work/recipe.err" >&2; exit 1; }
	end=$(date +%s.%N)
	python3 - "$work/recipe.jsonl" "$start" "$end" <<'PY' | emit
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"val_loss"' in l]
print(json.dumps({"workload": "gpt-recipe", "impl": "gpukit", "wall_s": float(sys.argv[3]) - float(sys.argv[2]),
                  "val_loss": ev[-1]["val_loss"], "best_val_loss": min(e["val_loss"] for e in ev)}))
PY
	python3 "$root/bench/reference/gpt.py" train --data "$text" | tail -n 2 | emit
fi
echo "bench/gpt.sh: results in $out/gpt.jsonl" >&2
