#!/usr/bin/env bash
# bench/regress.sh — a change against its baseline on one GPU machine, in one
# run: two unpacked GPU bundles (the baseline's and the change's) time the
# same workloads in alternating rounds, and each line says which side it is.
#
#   gemm      gpukit-bench's GEMM and Linear workloads (key) (workloads.json,
#             CUDA events after warm-up, median of the bench's repeats)
#   gpt-step  the shakespeare-char GPT step (bench/gpt.sh's shape, bf16,
#             one CUDA graph): median step_ms of 300 steps after the first
#             50 (compilation and capture)
#   unet-step the U-Net training step at batch 128, bf16 (bench/unet.sh's)
#   pool      gpukit-poolbench: alloc/free and open round trips (p50, p99)
#
# usage: bench/regress.sh BASE_DIR NEW_DIR TEXT FMNIST_DIR
#   BASE_DIR, NEW_DIR  unpacked bundles (bin/, bench/); TEXT: tinyshakespeare;
#   FMNIST_DIR: Fashion-MNIST (the U-Net's data). ROUNDS (default 3).
# JSON lines on stdout: {"side": "base"|"new", "round": r, "workload": ..., ...}.
set -euo pipefail
base=${1:?usage: bench/regress.sh BASE_DIR NEW_DIR TEXT FMNIST_DIR}
new=${2:?usage: bench/regress.sh BASE_DIR NEW_DIR TEXT FMNIST_DIR}
text=${3:?usage: bench/regress.sh BASE_DIR NEW_DIR TEXT FMNIST_DIR}
fmnist=${4:?usage: bench/regress.sh BASE_DIR NEW_DIR TEXT FMNIST_DIR}
rounds=${ROUNDS:-3}
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

median_steps() { # FILE SIDE ROUND WORKLOAD
	python3 - "$@" <<'PY'
import json, sys, statistics
f, side, rnd, wl = sys.argv[1:]
ls = [json.loads(l) for l in open(f) if '"step_ms"' in l][1:]
print(json.dumps({"side": side, "round": int(rnd), "workload": wl, "ms": statistics.median(l["step_ms"] for l in ls)}))
PY
}

one() { # SIDE DIR ROUND
	local side=$1 dir=$2 r=$3 w=$work/$1-$3
	mkdir -p "$w"
	export GPUKIT_CACHE_DIR=$work/cache-$side GPUKIT_BIN=$dir/bin
	{ "$dir/bench/gpukit-bench" --spec "$dir/bench/workloads.json" --filter gemm
	  "$dir/bench/gpukit-bench" --spec "$dir/bench/workloads.json" --filter linear; } \
		| python3 -c 'import json,sys
for l in sys.stdin:
    d=json.loads(l); d.update(side=sys.argv[1], round=int(sys.argv[2])); print(json.dumps(d))' "$side" "$r"
	"$dir/bin/trainer" run --model gpt --data "$text" --layers 6 --heads 6 --d-model 384 --block 256 --batch 64 \
		--precision bf16 --out "$w/gpt" --steps 300 --log-every 50 --eval-every 300 --eval-batches 1 --dropout 0 --clip 0 \
		>"$w/gpt.jsonl" 2>"$w/gpt.err" || { cat "$w/gpt.err" >&2; return 1; }
	median_steps "$w/gpt.jsonl" "$side" "$r" gpt-step
	"$dir/bin/trainer" run --model unet --data "$fmnist" --out "$w/unet" --steps 300 --batch 128 --precision bf16 \
		--log-every 50 --save-every 100000 >"$w/unet.jsonl" 2>"$w/unet.err" || { cat "$w/unet.err" >&2; return 1; }
	median_steps "$w/unet.jsonl" "$side" "$r" unet-step
	"$dir/bench/gpukit-poolbench" --iters 5000 --clients 4 --bytes $((256 << 20)) 2>/dev/null \
		| python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if not l.startswith("{"): continue
    d=json.loads(l); d.update(side=sys.argv[1], round=int(sys.argv[2]), workload="pool:"+d["bench"]); print(json.dumps(d))' "$side" "$r"
}

for r in $(seq "$rounds"); do
	echo "round $r/$rounds" >&2
	if [ $((r % 2)) = 1 ]; then one base "$base" "$r"; one new "$new" "$r"; else one new "$new" "$r"; one base "$base" "$r"; fi
done
