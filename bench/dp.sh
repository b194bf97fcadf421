#!/usr/bin/env bash
# bench/dp.sh — issue 14's data-parallel benchmarks on a machine with two
# (or more) GPUs, gpukit and PyTorch DDP in the same run. JSON lines on
# stdout and in $BENCH_OUT/dp.jsonl, then markdown tables (for
# BENCHMARKS.md):
#
#   gpt-dp     tokens/s of trainer for each GPT at each number of GPUs in
#              NPROCS (1: `trainer run`; N: `trainer launch --nproc N --
#              run`) with the same global batch, bf16, dropout 0, no
#              clipping: the median step time over the loss lines after
#              the first (which holds kernel compilation and the graph
#              captures); scaling efficiency = tokens/s at N / (N × tokens/s
#              at 1). At N > 1 once per gradient communication dtype in
#              GRAD_COMM (--grad-comm; default "f32"; "f32 bf16" adds the
#              runs whose buckets are all-reduced in bf16)
#   torch-ddp  bench/reference/gpt.py ddp under torchrun at each N above
#              1 (same models, global batch, bf16, fused AdamW,
#              bucket_cap_mb 25) in each mode of DDP_MODES: "compile"
#              (torch.compile of the DDP module: DDPOptimizer keeps the
#              bucket all-reduces overlapping the backward) by default;
#              "reduce-overhead" (CUDA graphs) and "eager" on request
#   allreduce  the all-reduce bus bandwidth of a 256 MiB bucket at the
#              largest N, gpukit-allreduce against torch.distributed
#              (bench/reference/allreduce.sh; f32 and bf16, eager and graph)
#   losses     (LOSSES=1) the loss of each of 100 steps of the shakespeare
#              GPT in bf16 at the largest N (once per GRAD_COMM dtype)
#              against 1 GPU with the same global batch (bound 1e-2
#              relative: trainer/dp_gpu_test.go says why)
#
# The GPTs (MODELS, default both): "shakespeare" (6 layers, 6 heads, d 384,
# block 256, global batch 64: nanoGPT's shakespeare-char) and "gpt2" (12
# layers, 12 heads, d 768, block 1024, global batch $GPT2_BATCH, default
# 16), both on the characters of TEXT (vocabulary 65 for tinyshakespeare).
#
# usage: bench/dp.sh TEXT          (TEXT: tinyshakespeare.txt)
# Env: NPROCS (default "1 2"; sizes above the GPUs here are skipped),
# MODELS, GPT2_BATCH, DDP_MODES (default compile), DDP_TIMEOUT (seconds
# per torchrun, default 300), AR_ROUNDS (all-reduce rounds, default 2),
# LOSSES (default 0), GRAD_COMM (default f32), BENCH_OUT. bench/scale.sh runs it at 1, 2, 4 and 8.
# NCCL_NVLS_ENABLE=0 stays set throughout. Runs inside the GPU bundle
# (bin/trainer, bench/gpukit-allreduce) or a source tree with ./bin built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
text=${1:?usage: bench/dp.sh TEXT}
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/kernels} # one kernel cache for every run
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -gt 0 ] || gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
nprocs=()
for n in ${NPROCS:-1 2}; do
	if [ "$n" -le "$gpus" ]; then nprocs+=("$n"); else echo "bench/dp.sh: skipping $n GPUs ($gpus here)" >&2; fi
done
maxn=${nprocs[-1]}
models=${MODELS:-shakespeare gpt2}
gpt2_batch=${GPT2_BATCH:-16}
emit() { tee -a "$out/dp.jsonl"; }

# model NAME: the trainer flags, steps and loss-line interval of a GPT.
model() {
	case $1 in
	shakespeare) echo "--layers 6 --heads 6 --d-model 384 --block 256 --batch 64 300 50" ;;
	gpt2) echo "--layers 12 --heads 12 --d-model 768 --block 1024 --batch $gpt2_batch 120 20" ;;
	*) echo "bench/dp.sh: unknown model $1" >&2; exit 2 ;;
	esac
}

# gpukit NAME N [COMM]: one trainer run of model NAME on N GPUs with the
# gradients all-reduced in COMM (--grad-comm, default f32); one JSON line.
gpukit() {
	local name=$1 n=$2 comm=${3:-f32} spec flags steps every
	spec=($(model "$name"))
	flags=("${spec[@]:0:10}") steps=${spec[10]} every=${spec[11]}
	local cmd=("$bin/trainer" run)
	[ "$n" -gt 1 ] && cmd=("$bin/trainer" launch --nproc "$n" -- run)
	local o="$work/$name-$n-$comm"
	"${cmd[@]}" --model gpt --data "$text" "${flags[@]}" --precision bf16 --dropout 0 --clip 0 --steps "$steps" \
		--log-every "$every" --eval-every "$steps" --eval-batches 1 --grad-comm "$comm" --out "$o" >"$o.jsonl" 2>"$o.err" ||
		{ cat "$o.err" >&2; exit 1; }
	python3 - "$o.jsonl" "$name" "$n" "$comm" "${flags[@]}" <<'PY' | emit
import json, statistics, sys
path, name, n, comm, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
f = dict(zip(flags[::2], flags[1::2]))
batch, block = int(f["--batch"]), int(f["--block"])
ls = [json.loads(l) for l in open(path) if '"step_ms"' in l][1:]
ms = statistics.median(l["step_ms"] for l in ls)
print(json.dumps({"workload": "gpt-dp", "model": name, "impl": "gpukit", "ranks": n, "grad_comm": comm, "batch": batch,
                  "block": block, "step_ms": ms, "tokens_per_s": batch * block / (ms / 1e3), "mfu_per_gpu": ls[-1].get("mfu"),
                  "loss": ls[-1]["loss"]}))
PY
}

# ddp NAME N MODE: gpt.py ddp of model NAME on N GPUs; one JSON line.
ddp() {
	local name=$1 n=$2 mode=$3 spec
	spec=($(model "$name"))
	local f=("${spec[@]:0:10}")
	timeout "${DDP_TIMEOUT:-300}" python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
		"$root/bench/reference/gpt.py" ddp --layers "${f[1]}" --heads "${f[3]}" --d-model "${f[5]}" --block "${f[7]}" \
		--batch "${f[9]}" --mode "$mode" 2>"$work/ddp-$name-$n-$mode.err" |
		python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); r["model"] = sys.argv[1]; print(json.dumps(r))' "$name" | emit ||
		{ echo "bench/dp.sh: torchrun gpt.py ddp $name $n $mode failed or timed out:" >&2; tail -5 "$work/ddp-$name-$n-$mode.err" >&2; }
}

for name in $models; do
	for n in "${nprocs[@]}"; do
		if [ "$n" -eq 1 ]; then
			echo "bench/dp.sh: $name on 1 GPU" >&2
			gpukit "$name" 1
			continue
		fi
		for comm in ${GRAD_COMM:-f32}; do
			echo "bench/dp.sh: $name on $n GPUs, gradients all-reduced in $comm" >&2
			gpukit "$name" "$n" "$comm"
		done
	done
	for n in "${nprocs[@]}"; do
		[ "$n" -gt 1 ] || continue
		for mode in ${DDP_MODES:-compile}; do
			echo "bench/dp.sh: $name, PyTorch DDP ($mode) on $n GPUs" >&2
			ddp "$name" "$n" "$mode"
		done
	done
done

if [ "$maxn" -gt 1 ]; then
	echo "bench/dp.sh: all-reduce of 256 MiB on $maxn GPUs" >&2
	if ROUNDS=${AR_ROUNDS:-2} bash "$root/bench/reference/allreduce.sh" "$maxn" 256MiB >"$work/allreduce.txt" 2>"$work/allreduce.err" && grep -q "^{" "$work/allreduce.txt"; then
		grep '^{' "$work/allreduce.txt" | emit
	else
		echo "bench/dp.sh: bench/reference/allreduce.sh failed:" >&2
		tail -40 "$work/allreduce.err" >&2
	fi
fi

if [ "${LOSSES:-0}" = 1 ] && [ "$maxn" -gt 1 ]; then
	echo "bench/dp.sh: losses of 100 steps on 1 and $maxn GPUs" >&2
	l=(--model gpt --data "$text" --layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --precision bf16 --steps 100
		--log-every 1 --eval-every 100 --eval-batches 1 --seed 7)
	"$bin/trainer" run "${l[@]}" --out "$work/loss-1" >"$work/loss-1.jsonl" 2>"$work/loss-1.err" || { cat "$work/loss-1.err" >&2; exit 1; }
	for comm in ${GRAD_COMM:-f32}; do
		"$bin/trainer" launch --nproc "$maxn" -- run "${l[@]}" --grad-comm "$comm" --out "$work/loss-n-$comm" \
			>"$work/loss-n-$comm.jsonl" 2>"$work/loss-n-$comm.err" || { cat "$work/loss-n-$comm.err" >&2; exit 1; }
		python3 - "$work/loss-1.jsonl" "$work/loss-n-$comm.jsonl" "$maxn" "$comm" <<'PY' | emit
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
rel = [abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)]
print(json.dumps({"workload": "gpt-dp-losses", "ranks": int(sys.argv[3]), "grad_comm": sys.argv[4], "steps": len(rel),
                  "max_rel": max(rel), "ok": len(a) == len(b) == 100 and max(rel) <= 1e-2}))
PY
	done
fi

python3 - "$out/dp.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
g = {(r["model"], r["ranks"], r.get("grad_comm", "f32")): r for r in rows if r.get("workload") == "gpt-dp" and r["impl"] == "gpukit"}
t = [r for r in rows if r.get("workload") == "gpt-dp" and r["impl"].startswith("torch-ddp")]
print("\n| model | GPUs | gradients all-reduced in | gpukit tokens/s | step ms | scaling efficiency | PyTorch DDP tokens/s (mode) | gpukit / PyTorch |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (m, n, comm), r in sorted(g.items()):
    one = g.get((m, 1, "f32"))
    eff = f'{r["tokens_per_s"] / (n * one["tokens_per_s"]):.3f}' if one and n > 1 else ""
    ts = [x for x in t if x["model"] == m and x["ranks"] == n and "tokens_per_s" in x]
    best = max(ts, key=lambda x: x["tokens_per_s"]) if ts else None
    tc = f'{best["tokens_per_s"]:.0f} ({best["impl"].removeprefix("torch-ddp-")})' if best else ""
    ratio = f'{r["tokens_per_s"] / best["tokens_per_s"]:.3f}' if best else ""
    print(f'| {m} (batch {r["batch"]}×{r["block"]}) | {n} | {comm if n > 1 else ""} | {r["tokens_per_s"]:.0f} | {r["step_ms"]:.2f} | {eff} | {tc} | {ratio} |')
for x in t:
    if "error" in x:
        print(f'\nPyTorch DDP {x["impl"]} on {x["ranks"]} GPUs ({x["model"]}) failed: {x["error"]}')
ar = [r for r in rows if r.get("key", "").startswith("allreduce")]
if ar:
    print("\n| all-reduce 256 MiB | gpukit busbw GB/s | PyTorch busbw GB/s | ratio |")
    print("| --- | --- | --- | --- |")
    keys = sorted({r["key"] for r in ar})
    import statistics
    for k in keys:
        gb = [r["busbw_GBps"] for r in ar if r["key"] == k and r["impl"] == "gpukit"]
        tb = [r["busbw_GBps"] for r in ar if r["key"] == k and r["impl"] == "pytorch"]
        if gb and tb:
            a, b = statistics.median(gb), statistics.median(tb)
            print(f'| {k.removeprefix("allreduce ")} | {a:.1f} | {b:.1f} | {a / b:.3f} |')
for r in rows:
    if r.get("workload") == "gpt-dp-losses":
        print(f'\nlosses, 1 vs {r["ranks"]} GPUs over {r["steps"]} steps (bf16, gradients all-reduced in {r.get("grad_comm", "f32")}): largest relative difference {r["max_rel"]:.2g} ({"ok" if r["ok"] else "ABOVE 1e-2"})')
PY
echo "bench/dp.sh: results in $out/dp.jsonl" >&2
