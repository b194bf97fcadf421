#!/usr/bin/env bash
# bench/optim-mlp.sh — issue 13's K-FAC benchmark: the Fashion-MNIST MLP
# (trainer's default, 784-256-256-10 ReLU, batch 128) trained for EPOCHS
# epochs with AdamW (the baseline: lr 1e-3) and with K-FAC (factors every
# step, π-damped inverses every 10, KL clipping; lr 0.05, momentum 0.9,
# damping 0.1, no weight decay: at damping 1e-3 and AdamW's weight decay
# 0.01 it stalled at 83% test accuracy),
# and the epochs K-FAC needs to reach AdamW's final test accuracy (with the
# wall time per epoch of each). One JSON line per run and a summary line on
# stdout and in $BENCH_OUT/optim-mlp.jsonl.
#
# usage: bench/optim-mlp.sh [DATA_DIR]     (default: the Debian package's)
#   EPOCHS=5  ADAMW_FLAGS="..."  KFAC_FLAGS="..." (e.g. "... --cov-every 10")  DEVICE=auto
#   LOG_EVERY=100: the loss lines' interval; each line's step_ms is its
#   interval's mean, and the summary gives their median after the first
#   (compilation, capture) over AdamW's: at 1, the per-step median
#   GPUKIT_OPTIM_PHASES=0: K-FAC's step and the MLP's forward and backward
#   eager every step instead of replayed from CUDA graphs per phase
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=${GPUKIT_BIN:-$root/bin}
data=${1:-/usr/share/datasets/fashion-mnist}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
epochs=${EPOCHS:-5}
emit() { tee -a "$out/optim-mlp.jsonl"; }
read -r -a adamw <<<"${ADAMW_FLAGS:---optim adamw --lr 1e-3}"
read -r -a kfac <<<"${KFAC_FLAGS:---optim kfac --lr 0.05 --momentum 0.9 --update-freq 10 --damping 0.1 --weight-decay 0}"
for run in adamw kfac; do
	declare -n f=$run
	start=$(date +%s.%N)
	"$bin/trainer" run --data "$data" --epochs "$epochs" --device "${DEVICE:-auto}" --log-every "${LOG_EVERY:-100}" "${f[@]}" \
		--out "$out/$run" --force >"$out/$run.jsonl" 2>"$out/$run.err" || { cat "$out/$run.err" >&2; exit 1; }
	end=$(date +%s.%N)
	python3 - "$run" "$out/$run.jsonl" "$start" "$end" <<'PY' | emit
import json, sys
acc = [json.loads(l)["test_accuracy"] for l in open(sys.argv[2]) if '"test_accuracy"' in l]
print(json.dumps({"workload": "optim-mlp", "optimizer": sys.argv[1], "test_accuracy": acc,
                  "wall_s": round(float(sys.argv[4]) - float(sys.argv[3]), 2)}))
PY
done
python3 - "$out/adamw.jsonl" "$out/kfac.jsonl" <<'PY' | emit
import json, statistics, sys
acc = lambda p: [json.loads(l)["test_accuracy"] for l in open(p) if '"test_accuracy"' in l]
a, k = acc(sys.argv[1]), acc(sys.argv[2])
target = a[-1]
hit = next((i + 1 for i, x in enumerate(k) if x >= target), None)
def med(p):
    ms = [json.loads(l)["step_ms"] for l in open(p) if '"step_ms"' in l][1:]
    return statistics.median(ms) if ms else None
ma, mk = med(sys.argv[1]), med(sys.argv[2])
print(json.dumps({"workload": "optim-mlp-summary", "adamw_final_accuracy": target, "adamw_epochs": len(a),
                  "kfac_epochs_to_adamw": hit, "ratio": None if hit is None else hit / len(a),
                  "adamw_step_ms": ma, "kfac_step_ms": mk,
                  "kfac_over_adamw": round(mk / ma, 4) if ma and mk else None}))
PY
echo "optim-mlp.sh: results in $out/optim-mlp.jsonl" >&2
