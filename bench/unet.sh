#!/usr/bin/env bash
# bench/unet.sh — issue 12's diffusion benchmarks on a GPU machine, gpukit and
# PyTorch (bench/reference/unet.py) in the same run, as JSON lines on stdout
# (and in $BENCH_OUT/unet.jsonl when set). The model is the U-Net of unet.py:
# channels 64-128-256, attention at 8×8, 5.3 M parameters, 32×32×1.
#
#   step      one guided DPM-Solver++ step at batch 256 (512 images through
#             the U-Net), bf16: gpukit's sampling loop captured as one CUDA
#             graph (Go benchmark BenchmarkGuidedStep256: GPU time of a
#             20-step run / 20, and images/s of that run) against PyTorch
#             eager, CUDA graph and torch.compile
#   video     batch-1 video frame (re-noise to 0.5, 4 guided steps with
#             temporal blending): BenchmarkVideoFrame against PyTorch's modes
#   train     the U-Net training step at batch 128, bf16: `trainer run
#             --model unet` (whole step one CUDA graph; median step_ms of
#             300 steps) against PyTorch eager and torch.compile
#   ops       the heaviest convolutions and the fused GroupNorm+SiLU
#             (BenchmarkConv2D/512x*/fwd/*, BenchmarkGroupNormSiLU_*; bench/conv.sh
#             has the whole convolution table beside cuDNN)
#   quality   (QUALITY=1, or =train then =score) trains the U-Net (STEPS,
#             default 20000) and the Fashion-MNIST MLP classifier, then
#             `sampler score` of 10,000 samples: class accuracy at guidance
#             3 with 20 DPM-Solver++ steps; FD-MLP of 20-step DPM-Solver++
#             and of 1000-step DDPM; FD-MLP against steps 5, 10, 20, 50 for
#             DDIM and DPM-Solver++; DDIM with eta 1 at 20, 50, 100 steps
#             and DDPM at 250. BENCH=0 skips the timings.
#
# usage: bench/unet.sh [DATA]   (DATA: Fashion-MNIST IDX directory; default
#        $GPUKIT_DATA_DIR or /usr/share/datasets/fashion-mnist)
# Runs inside the GPU bundle (bin/, tests/libgpu_diffusion.test,
# tests/libgpu_ops.test) or a source tree with ./bin built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
data=${1:-${GPUKIT_DATA_DIR:-/usr/share/datasets/fashion-mnist}}
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
emit() { tee -a "$out/unet.jsonl"; }
ref=$root/bench/reference/unet.py

# Go benchmarks: sampling loop and video frame, then the op timings.
gobench() { # BINARY PATTERN
	local t=$root/tests/$1.test
	[ -x "$t" ] || { echo "bench/unet.sh: $t not found (build the GPU bundle)" >&2; return; }
	(cd "$root/tests/$1.d" && GPUKIT_REQUIRE_GPU=1 "$t" -test.run '^$' -test.bench "$2" -test.benchtime 20x) \
		| grep -E '^Benchmark' | python3 -c '
import json, sys
for l in sys.stdin:
    f = l.split()
    d = {"workload": f[0], "impl": "gpukit", "runs": int(f[1])}
    for v, u in zip(f[2::2], f[3::2]):
        d[u] = float(v)
    print(json.dumps(d))' | emit
}
if [ "${BENCH:-1}" = 1 ]; then
gobench libgpu_diffusion 'GuidedStep256|VideoFrame'
python3 "$ref" bench --batch 256 --steps 20 | emit
python3 "$ref" video --steps 4 | emit

# Training step: 300 steps, loss lines every 50; the first interval holds
# compilation and capture, so the median of the later ones.
"$bin/trainer" run --model unet --data "$data" --out "$work/step" --steps 300 --batch 128 --precision bf16 \
	--log-every 50 --save-every 100000 >"$work/step.jsonl" 2>"$work/step.err" || { cat "$work/step.err" >&2; exit 1; }
python3 - "$work/step.jsonl" <<'PY' | emit
import json, sys, statistics
ls = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l][1:]
print(json.dumps({"workload": "unet-train-step", "impl": "gpukit-graph", "ms": statistics.median(l["step_ms"] for l in ls), "batch": 128}))
PY
python3 "$ref" train-bench --batch 128 | emit

gobench libgpu_ops 'Conv2D/^512x/fwd'
gobench libgpu_ops 'GroupNormSiLU'
fi

# Quality, in two phases that fit separate runs of a GPU machine (a phase
# per call when calls are limited to minutes): QUALITY=train trains the
# U-Net (STEPS, default 20000) and the MLP classifier into QUALITY_DIR
# (default $BENCH_OUT/quality; kept between the phases), QUALITY=score
# scores QN samples (default 10000) per line; QUALITY=1 does both.
# SKIP_DDPM=1 leaves out the 1000-step DDPM line (1000 evaluations per batch).
q=${QUALITY:-0}
qdir=${QUALITY_DIR:-$out/quality}
if [ "$q" = 1 ] || [ "$q" = train ]; then
	steps=${STEPS:-20000}
	mkdir -p "$qdir"
	"$bin/trainer" run --model unet --data "$data" --out "$qdir/unet" --force --steps "$steps" --batch 128 --precision bf16 \
		--log-every 1000 >"$qdir/unet.jsonl" 2>"$qdir/unet.err" || { cat "$qdir/unet.err" >&2; exit 1; }
	tail -n1 "$qdir/unet.jsonl" | sed 's/^{/{"workload":"unet-quality-train",/' | emit
	"$bin/trainer" run --data "$data" --out "$qdir/mlp" --force --epochs 10 --log-every 10000 >/dev/null 2>"$qdir/mlp.err" \
		|| { cat "$qdir/mlp.err" >&2; exit 1; }
fi
if [ "$q" = 1 ] || [ "$q" = score ]; then
	n=${QN:-10000}
	score() { # SCHEDULER STEPS [flags]
		local s=$1 k=$2
		shift 2
		"$bin/sampler" score --ckpt "$qdir/unet/model.safetensors" --classifier "$qdir/mlp/model.safetensors" --data "$data" \
			--n "$n" --batch 256 --scheduler "$s" --steps "$k" --guidance-scale 3 --seed 1 "$@" \
			| sed 's/^{/{"workload":"unet-quality",/' | emit
	}
	score dpmsolver++ 20
	[ "${SKIP_DDPM:-0}" = 1 ] || score ddpm 1000
	for k in 5 10 20 50; do
		score ddim "$k"
		[ "$k" = 20 ] || score dpmsolver++ "$k"
	done
	# The stochastic samplers against the ODE ones: DDIM with η = 1 and a
	# shorter DDPM (STOCHASTIC=0 leaves them out).
	if [ "${STOCHASTIC:-1}" = 1 ]; then
		for k in 20 50 100; do score ddim "$k" --eta 1; done
		score ddpm 250
	fi
	"$bin/sampler" sample --ckpt "$qdir/unet/model.safetensors" --n 100 --class all --out "$out/unet-grid.png" --force >/dev/null
	"$bin/sampler" video --ckpt "$qdir/unet/model.safetensors" --frames 40 --out "$out/unet-video.gif" --force | tail -n1 | emit
fi
echo "bench/unet.sh: results in $out/unet.jsonl" >&2
