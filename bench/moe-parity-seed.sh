#!/usr/bin/env bash
# bench/moe-parity-seed.sh — one seed of TestGPUMoEParityBF16 taken apart on
# a GPU machine: the trainer's MoE GPT (the test's model and schedule) with
# its step as one CUDA graph in bf16, then eagerly in bf16, in TF32 and in
# f32, and bench/reference/moe.py parity in bf16, its twin (router input
# rounded to bf16) and f32 on the trainer's batches; one line per step with
# every run's cross-entropy, load-balancing and z-loss, and the trainer's
# gradient norm. A step where only the trainer's bf16 runs move away says
# a kernel's bf16 case; one where graph and eager part says the capture.
#
# usage: bench/moe-parity-seed.sh SEED [STEPS]   (STEPS: 200)
# Runs inside the GPU bundle (bin/trainer, bench/reference/moe.py) or a
# source tree with ./bin built; the text is $GPUKIT_TEXT (the bundle's
# data/Isaac.Newton-Opticks.txt by default, as the test's). Output: the
# table on stdout; every run's lines under $BENCH_OUT (a temp dir if unset).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
seed=${1:?usage: bench/moe-parity-seed.sh SEED [STEPS]}
steps=${2:-200}
bin=${GPUKIT_BIN:-$root/bin}
text=${GPUKIT_TEXT:-$root/data/Isaac.Newton-Opticks.txt}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
m=(--model moe --data "$text" --seed "$seed" --layers 4 --heads 4 --d-model 128 --block 64 --batch 16 --experts 8 --top-k 2 --moe-every 2)
"$bin/trainer" init --force --out "$out/init.safetensors" "${m[@]}" >/dev/null
run() { # TAG FLAGS...
	local tag=$1
	shift
	"$bin/trainer" run --force --out "$out/$tag" --steps "$steps" --warmup 10 --lr 1e-3 --log-every 1 --eval-every "$steps" \
		"$@" "${m[@]}" >"$out/$tag.jsonl" 2>"$out/$tag.err" || { echo "trainer $tag failed:" >&2; cat "$out/$tag.err" >&2; exit 1; }
}
run bf16-graph --precision bf16 --batches-out "$out/batches.safetensors"
run bf16-eager --precision bf16 --graph off &
run tf32 --precision tf32 &
run f32 --precision f32 &
ref=$root/bench/reference/moe.py
py() { python3 "$ref" parity --init "$out/init.safetensors" --batches "$out/batches.safetensors" "$@"; }
py --dtype bf16 >"$out/torch-bf16.jsonl" &
py --dtype bf16 --router-input compute >"$out/torch-twin.jsonl" &
py --dtype f32 >"$out/torch-f32.jsonl" &
wait
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
runs = ["bf16-graph", "bf16-eager", "tf32", "f32", "torch-bf16", "torch-twin", "torch-f32"]
lines = {}
for r in runs:
    lines[r] = {}
    for l in open(os.path.join(d, r + ".jsonl")):
        l = l.strip()
        if l.startswith("{"):
            x = json.loads(l)
            if "step" in x and "z_loss" in x:
                lines[r][x["step"]] = x
print("step " + " ".join(f"{r:>22s}" for r in runs) + "  grad_norm(bf16-graph)")
for s in sorted(lines["bf16-graph"]):
    cells = []
    for r in runs:
        x = lines[r].get(s)
        cells.append(f"{x['loss']:7.4f} {x['aux_loss']:6.3f} {x['z_loss']:6.3f}" if x else " " * 22)
    print(f"{s:4d} " + " ".join(cells) + f"  {lines['bf16-graph'][s].get('grad_norm', float('nan')):.3f}")
PY
echo "bench/moe-parity-seed.sh: runs in $out" >&2
