#!/usr/bin/env bash
# bench/dp-sweep.sh — where the 12-layer GPT's data-parallel step loses
# time: the step on 1 GPU, then on N GPUs (`trainer launch --nproc N`) for
# each bucket size in BUCKETS (MiB, default "25 100") and each NCCL channel
# limit in CHANNELS (NCCL_MAX_NCHANNELS, default "default 8 4": fewer
# channels, fewer SMs taken from the overlapped backward) and each gradient
# communication dtype in COMM (--grad-comm, default "f32"; "f32 bf16" adds
# the runs whose buckets are all-reduced in bf16, half the bytes). One JSON
# line per run: median step ms over the loss lines after the first,
# tokens/s, the last loss line's loss and the scaling efficiency against
# the 1-GPU run of the same invocation.
#   usage: bench/dp-sweep.sh TEXT      Env: NPROC (default 2), STEPS (120),
#   BATCH (global, 16), BUCKETS, CHANNELS, COMM, BENCH_OUT.
#   NCCL_NVLS_ENABLE=0 stays set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
text=${1:?usage: bench/dp-sweep.sh TEXT}
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/kernels}
n=${NPROC:-2} steps=${STEPS:-120} batch=${BATCH:-16}
flags=(--model gpt --data "$text" --layers 12 --heads 12 --d-model 768 --block 1024 --batch "$batch"
	--precision bf16 --dropout 0 --clip 0 --steps "$steps" --log-every 20 --eval-every "$steps" --eval-batches 1)
one_ms=
run() { # NAME BUCKET CHANNELS COMM CMD...
	local name=$1 bucket=$2 ch=$3 comm=$4
	shift 4
	local o=$work/$name
	if ! env ${ch:+NCCL_MAX_NCHANNELS=$ch} "$@" "${flags[@]}" --bucket-mb "$bucket" --grad-comm "$comm" --out "$o" >"$o.jsonl" 2>"$o.err"; then
		echo "{\"workload\": \"dp-sweep\", \"run\": \"$name\", \"error\": $(tail -1 "$o.err" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}" | tee -a "$out/dp-sweep.jsonl"
		return
	fi
	python3 - "$o.jsonl" "$name" "$bucket" "${ch:-default}" "$batch" "${one_ms:-0}" "$n" "$comm" <<'PY' | tee -a "$out/dp-sweep.jsonl"
import json, statistics, sys
path, name, bucket, ch, batch, one, n, comm = sys.argv[1:9]
ls = [json.loads(l) for l in open(path) if '"step_ms"' in l][1:]
ms = statistics.median(l["step_ms"] for l in ls)
r = {"workload": "dp-sweep", "run": name, "bucket_mb": float(bucket), "channels": ch, "grad_comm": comm, "step_ms": ms,
     "tokens_per_s": int(batch) * 1024 / (ms / 1e3), "loss": ls[-1]["loss"]}
if float(one) > 0 and name != "1gpu":
    r["efficiency"] = round(float(one) / (int(n) * ms), 4)
print(json.dumps(r))
PY
	if [ "$name" = 1gpu ]; then
		one_ms=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["step_ms"])' "$out/dp-sweep.jsonl")
	fi
}
run 1gpu 25 "" f32 "$bin/trainer" run
for g in ${COMM:-f32}; do
	for b in ${BUCKETS:-25 100}; do
		for c in ${CHANNELS:-default 8 4}; do
			[ "$c" = default ] && c=
			run "n$n-b$b-c${c:-default}-$g" "$b" "$c" "$g" "$bin/trainer" launch --nproc "$n" -- run
		done
	done
done
