#!/usr/bin/env bash
# bench/moe.sh — issue 20's Mixture-of-Experts benchmarks on a GPU machine,
# gpukit and PyTorch in the same run, as JSON lines (Go benchmark lines as
# they print) on stdout and in $BENCH_OUT/moe.jsonl when set:
#
#   grouped  the grouped GEMM in bf16 (BenchmarkGroupedGEMM: forward, dx and
#            dw at 8 experts × 4096 tokens 768 → 3072, balanced and skewed
#            1.64×, and 64 experts 65536 × 768 → 512 skewed 3.72×, on both
#            wgmma tile widths) against torch._grouped_mm (moe.py grouped)
#   step     a training step of nanoMoE's shape (6 layers, d 384, 8 experts,
#            top-2, batch 64 × 256, bf16): BenchmarkMoEGPTStep (CUDA graph,
#            with the dense GPT beside it) against moe.py bench (eager and
#            torch.compile)
#
#   trainer  (with TEXT, tinyshakespeare.txt; STEPS, default 5000) the
#            trainer's MoE GPT: trainer-step, then trainer-quality, then one
#            short table of both
#   trainer-step     `trainer run --model moe` at the step's shape (bf16,
#            dropout 0, no clipping; 300 steps, median step_ms after the
#            first 50, mfu on active parameters) against moe.py bench
#            eager and torch.compile in the same run. Bounded: the whole
#            part ends within MOE_STEP_BUDGET seconds (150); compilation
#            gets what is left after the trainer and eager (about 100 s).
#            MOE_COMPILE_MODES: torch.compile modes to time, in order
#            (default "compile"; e.g. "compile compile-max-autotune-no-cudagraphs");
#            a mode that does not finish in time prints an error line.
#   trainer-quality  nanoGPT's shakespeare-char recipe (lr 1e-3 → 1e-4,
#            100 warmup steps, dropout 0.2, β2 0.99, weight decay 0.1, clip
#            1, 200 validation batches every 250 steps; 6 layers, 6 heads,
#            d 384, block 256, batch 64, bf16) for STEPS steps, the MoE GPT
#            then (DENSE=1, the default) the dense GPT with the same flags:
#            best validation loss, its step, the run's elapsed_s at it and
#            the wall time. Each run is stopped with SIGTERM (the trainer
#            checkpoints and exits 0; the line says interrupted) after
#            MOE_QUALITY_S (110) and DENSE_QUALITY_S (70) seconds.
#
# usage: bench/moe.sh [grouped|step|all]   (default all)
#        bench/moe.sh trainer|trainer-step|trainer-quality TEXT [STEPS]
# Runs inside the GPU bundle (tests/libgpu_ops.test, tests/libgpu_nn.test,
# bin/trainer).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
what=${1:-all}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
emit() { tee -a "$out/moe.jsonl"; }
gobench() { # package, benchmark regex, benchtime
	local t=$root/tests/$1.test
	[ -x "$t" ] || { echo "moe.sh: $t missing (build the bundle with $1)" >&2; return 1; }
	(cd "$root/tests/$1.d" && GPUKIT_REQUIRE_GPU=1 "$t" -test.run '^$' -test.bench "$2" -test.benchtime "$3") |
		grep -E '^Benchmark|busiest|parameters|^(ok|PASS|FAIL)' | emit
}
bin=${GPUKIT_BIN:-$root/bin}
case $what in
trainer | trainer-step | trainer-quality)
	text=${2:?usage: bench/moe.sh $what TEXT [STEPS]}
	steps=${3:-5000}
	[ -f "$text" ] || { echo "moe.sh: $text: no such file" >&2; exit 2; }
	[ -x "$bin/trainer" ] || { echo "moe.sh: $bin/trainer missing (the GPU bundle has it)" >&2; exit 1; }
	;;
esac
work=$(mktemp -d) # run directories (the recipes' checkpoints: about 1 GB), removed at the end unless KEEP=1
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
runlog=$work/trainer.jsonl # this run's lines, for the table
temit() { tee -a "$out/moe.jsonl" "$runlog"; }
shape=(--data "${text:-}" --layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --precision bf16)

trainer_step() {
	local t0 budget left
	t0=$(date +%s)
	budget=${MOE_STEP_BUDGET:-150}
	left() { echo $((budget - ($(date +%s) - t0))); }
	# 300 steps, loss lines every 50: the first interval holds compilation
	# and capture, so the median of the later ones.
	if timeout -s KILL 60 "$bin/trainer" run --model moe "${shape[@]}" --out "$work/step" --steps 300 --log-every 50 \
		--eval-every 300 --eval-batches 1 --dropout 0 --clip 0 >"$work/step.jsonl" 2>"$work/step.err"; then
		python3 - "$work/step.jsonl" <<'PY' | temit
import json, statistics, sys
ls = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l][1:]
print(json.dumps({"workload": "moe-step", "impl": "gpukit-trainer", "ms": statistics.median(l["step_ms"] for l in ls),
                  "mfu": ls[-1].get("mfu"), "aux_loss": ls[-1].get("aux_loss"), "z_loss": ls[-1].get("z_loss")}))
PY
	else
		tail -3 "$work/step.err" >&2
		echo '{"workload": "moe-step", "impl": "gpukit-trainer", "error": "trainer run failed or ran past 60 s"}' | temit
	fi
	bounded 45 torch-eager python3 "$root/bench/reference/moe.py" bench --modes eager
	for mode in ${MOE_COMPILE_MODES:-compile}; do
		local l
		l=$(($(left) - 3))
		if [ "$l" -lt 20 ]; then
			echo "{\"workload\": \"moe-step\", \"impl\": \"torch-$mode\", \"error\": \"not run: $l s left of MOE_STEP_BUDGET\"}" | temit
			continue
		fi
		bounded "$l" "torch-$mode" python3 "$root/bench/reference/moe.py" bench --modes "$mode"
	done
}

# bounded SECONDS IMPL CMD...: CMD's JSON lines, or an error line for IMPL
# when it fails or runs past SECONDS (killed with its process group).
bounded() {
	local secs=$1 impl=$2 rc=0 msg
	shift 2
	timeout -s KILL "$secs" "$@" >"$work/bounded.out" || rc=$?
	temit <"$work/bounded.out"
	case $rc in
	0) return 0 ;;
	137) msg="did not finish within $secs s (compilation included)" ;;
	*) msg="failed with exit status $rc (its stderr above)" ;;
	esac
	echo "{\"workload\": \"moe-step\", \"impl\": \"$impl\", \"error\": \"$msg\"}" | temit
}

# recipe MODEL SECONDS: nanoGPT's recipe for $steps steps, stopped by
# SIGTERM after SECONDS.
recipe() {
	local model=$1 secs=$2 start end
	start=$(date +%s.%N)
	timeout -s TERM "$secs" "$bin/trainer" run --model "$model" "${shape[@]}" --out "$work/recipe-$model" --steps "$steps" \
		--lr 1e-3 --min-lr 1e-4 --warmup 100 --dropout 0.2 --beta2 0.99 --weight-decay 0.1 --clip 1 --eval-every 250 \
		--eval-batches 200 --log-every 250 >"$work/recipe-$model.jsonl" 2>"$work/recipe-$model.err" ||
		{ tail -3 "$work/recipe-$model.err" >&2; }
	end=$(date +%s.%N)
	python3 - "$work/recipe-$model.jsonl" "$work/recipe-$model.err" "$model" "$steps" "$start" "$end" <<'PY' | temit
import json, statistics, sys
path, err, model, steps, start, end = sys.argv[1:]
ls = [json.loads(l) for l in open(path)]
ev = [l for l in ls if "val_loss" in l]
tr = [l for l in ls if "step_ms" in l][1:]
line = {"workload": "moe-quality", "model": model, "steps": int(steps), "wall_s": round(float(end) - float(start), 1),
        "interrupted": "interrupted after step" in open(err).read()}
if ev:
    b = min(ev, key=lambda e: e["val_loss"])
    line.update(best_val_loss=b["val_loss"], best_step=b["step"], elapsed_s_at_best=b["elapsed_s"],
                final_val_loss=ev[-1]["val_loss"], last_step=ev[-1]["step"])
if tr:
    line["step_ms"] = statistics.median(l["step_ms"] for l in tr)
print(json.dumps(line))
PY
}

trainer_quality() {
	recipe moe "${MOE_QUALITY_S:-110}"
	if [ "${DENSE:-1}" = 1 ]; then
		recipe gpt "${DENSE_QUALITY_S:-70}"
	fi
}

# table: the short summary of this run's trainer lines.
table() {
	python3 - "$runlog" <<'PY'
import json, sys
ls = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
step = [l for l in ls if l.get("workload") == "moe-step"]
qual = [l for l in ls if l.get("workload") == "moe-quality"]
def f(v, fmt):
    return fmt.format(v) if isinstance(v, (int, float)) else "-"
if step:
    print("MoE GPT step, bf16, 6 x 384, 8 experts top-2, 64 x 256 tokens")
    print(f"{'impl':<40} {'ms':>8} {'MFU':>7}  first step s / note")
    ours = next((l["ms"] for l in step if l["impl"] == "gpukit-trainer" and "ms" in l), None)
    for l in step:
        note = l.get("error") or (f"{l['first_step_s']} s" if "first_step_s" in l else "")
        print(f"{l['impl']:<40} {f(l.get('ms'), '{:.3f}'):>8} {f(l.get('mfu'), '{:.1%}'):>7}  {note}")
    for l in step:
        if l["impl"].startswith("torch-compile") and "ms" in l and ours:
            print(f"gpukit / {l['impl']}: {ours / l['ms']:.2f}x (target <= 0.6x)")
if qual:
    print("Quality, tinyshakespeare, nanoGPT's recipe")
    print(f"{'model':<6} {'steps':>6} {'best val (step)':>16} {'s to best':>9} {'final val':>9} {'wall s':>7} {'step ms':>8}")
    for l in qual:
        bv = f"{f(l.get('best_val_loss'), '{:.4f}')} ({l.get('best_step', '-')})"
        print(f"{l['model']:<6} {l.get('last_step', 0):>6} {bv:>16} {f(l.get('elapsed_s_at_best'), '{:.1f}'):>9} "
              f"{f(l.get('final_val_loss'), '{:.4f}'):>9} {l['wall_s']:>7} {f(l.get('step_ms'), '{:.2f}'):>8}"
              + ("  interrupted" if l["interrupted"] else ""))
PY
}

case $what in
trainer-step) trainer_step ;;
trainer-quality) trainer_quality ;;
trainer) trainer_step; trainer_quality ;;
esac
case $what in
trainer*)
	echo "bench/moe.sh: lines in $out/moe.jsonl" >&2
	table
	exit 0
	;;
esac

if [ "$what" = grouped ] || [ "$what" = all ]; then
	gobench libgpu_ops 'GroupedGEMM' 30x
	python3 "$root/bench/reference/moe.py" grouped | emit
fi
if [ "$what" = step ] || [ "$what" = all ]; then
	gobench libgpu_nn 'MoEGPTStep' 30x
	python3 "$root/bench/reference/moe.py" bench | emit
fi
