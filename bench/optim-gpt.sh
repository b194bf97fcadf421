#!/usr/bin/env bash
# bench/optim-gpt.sh — issue 13's GPT benchmarks on a GPU machine: nanoGPT's
# shakespeare-char recipe (6 layers, 6 heads, d 384, block 256, batch 64,
# dropout 0.2, bf16, 5000 steps, warmup 100 and cosine to lr/10, clip 1,
# validation on 200 fixed batches every 250 steps) trained with AdamW (the
# baseline), Shampoo, SOAP and Muon, and:
#
#   - per optimizer, the step (and the seconds) at which its validation loss
#     first reaches AdamW's best one, and the ratio to the step (seconds)
#     at which AdamW reached it (target ≤ 0.7 for Muon and SOAP);
#   - per optimizer, the median step time over AdamW's (target ≤ 1.10 for
#     Shampoo and SOAP at update frequency 10 with asynchronous roots (Shampoo's
#     by Newton iterations, 2 steps stale; SOAP's eigenbases 5 steps stale),
#     ≤ 1.05 for Muon);
#   - optim-gpt.png: validation loss against steps and against seconds, the
#     four runs together (gpukit-optimplot).
#
# JSON lines on stdout and in $BENCH_OUT/optim-gpt.jsonl; each run's
# metrics.jsonl is kept in $BENCH_OUT/<optimizer>/.
#
# usage: bench/optim-gpt.sh TEXT            (TEXT: tinyshakespeare.txt)
#   OPTIMS="adamw shampoo soap muon"        which runs (adamw first: the baseline)
#   STEPS=5000                               steps of every run (the schedule's length)
#   EVAL_EVERY=250 EVAL_BATCHES=200          validation interval and size
#   LOG_EVERY=50                             the loss lines' interval: each line's step_ms is
#                                            its interval's mean, so at 1 the step table's
#                                            median is the per-step median (refresh steps
#                                            are then outliers, not averaged in)
#   MODEL=gpt12                              the 12-layer GPT (d 768, 12 heads, block 1024,
#                                            batch 16: GPT-2 small's shape, on characters)
#                                            instead of nanoGPT's 6-layer one
#   <NAME>_FLAGS="..."                       extra trainer flags for one run
#                                            (ADAMW_FLAGS, SHAMPOO_FLAGS, SOAP_FLAGS, MUON_FLAGS)
#   <NAME>_TIMEOUT=S, RUN_TIMEOUT=S          a wall-clock limit per run (0: none): the
#                                            trainer gets SIGINT, finishes its step,
#                                            writes its checkpoint and metrics and
#                                            exits; the run's line says how far it got
#                                            ("cut": true), and the comparison uses
#                                            what it reached. A failed run is reported
#                                            and the others go on.
#   DEADLINE=EPOCH_S                         all runs end by then: each run's limit is
#                                            also at most an equal share of the time
#                                            left (runs to go included), so time a run
#                                            leaves unused goes to the later ones
#   SMOKE=1                                  a tiny model for a few steps on any
#                                            device (checks the script, measures nothing)
#   OPTIMIZER_SOCKET=SOCK POOL=SOCK          run the second-order optimizers in
#                                            `optimizer serve` (the service's
#                                            overhead on the real step)
#   NPROC=N                                  data-parallel on N GPUs (trainer launch --nproc N),
#                                            the same global batch; the second-order runs
#                                            share their refreshes over the ranks unless
#                                            GPUKIT_SHARE_ROOTS=0 (each rank all of them).
#                                            The step lines add the mean step time and the
#                                            refreshes' GPU time per step (rank 0's side
#                                            stream: roots.refresh_gpu_ms over the steps)
#   GPUKIT_OPTIM_PHASES=0                    step Shampoo and SOAP eagerly every step
#                                            instead of replaying a CUDA graph per
#                                            phase outside refresh steps
# Needs trainer and gpukit-optimplot in $GPUKIT_BIN (default ./bin; make
# build; the plot tool: cd bench && go build -o ../bin/gpukit-optimplot
# ./cmd/gpukit-optimplot, or the GPU bundle's bench/).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
text=${1:?usage: bench/optim-gpt.sh TEXT}
bin=${GPUKIT_BIN:-$root/bin}
plot=$bin/gpukit-optimplot
[ -x "$plot" ] || plot=$here/gpukit-optimplot
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
steps=${STEPS:-5000}
optims=${OPTIMS:-adamw shampoo soap muon}
emit() { tee -a "$out/optim-gpt.jsonl"; }

# nanoGPT's shakespeare-char recipe (config/train_shakespeare_char.py).
recipe=(--model gpt --data "$text" --layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --precision bf16
	--dropout 0.2 --steps "$steps" --warmup 100 --weight-decay 0.1 --clip 1
	--eval-every "${EVAL_EVERY:-250}" --eval-batches "${EVAL_BATCHES:-200}" --log-every "${LOG_EVERY:-50}")
if [ "${MODEL:-}" = gpt12 ]; then
	recipe+=(--layers 12 --heads 12 --d-model 768 --block 1024 --batch 16)
elif [ -n "${MODEL:-}" ]; then
	echo "optim-gpt.sh: MODEL=$MODEL: want gpt12 or nothing" >&2
	exit 2
fi
if [ "${SMOKE:-0}" = 1 ]; then
	recipe=(--model gpt --data "$text" --layers 1 --heads 2 --d-model 32 --block 16 --batch 4 --dropout 0.2
		--steps "${STEPS:-30}" --warmup 3 --weight-decay 0.1 --clip 1 --eval-every 10 --eval-batches 2 --log-every 5
		--max-block 64)
fi

# Each optimizer's learning rate (and what differs from AdamW's recipe),
# from its paper's or reference code's small-model settings; override with
# <NAME>_FLAGS.
flags_for() {
	case $1 in
	adamw) echo "--optim adamw --lr 1e-3 --min-lr 1e-4 --beta2 0.99" ;;
	# Adam-grafted Shampoo: AdamW's step size; statistics every step, roots
	# by the batched Newton iteration (tensor cores) every 10 steps on the
	# side stream, put in use 2 steps later.
	shampoo) echo "--optim shampoo --lr 1e-3 --min-lr 1e-4 --beta2 0.99 --update-freq 10 --root newton --async-roots --max-staleness 2" ;;
	# SOAP's reference setting: lr 3e-3, betas (0.95, 0.95), weight decay
	# 0.01; eigenbases (cuSOLVER, batched per block order) every 10 steps on
	# the side stream, given 5 steps to finish.
	soap) echo "--optim soap --lr 3e-3 --min-lr 3e-4 --beta1 0.95 --beta2 0.95 --weight-decay 0.01 --update-freq 10 --async-roots --max-staleness 5" ;;
	# Muon: lr 0.02 for the hidden matrices, AdamW (lr 1e-3) for embeddings,
	# head and vectors; the schedule scales both.
	muon) echo "--optim muon --lr 0.02 --min-lr 0.002 --adam-lr 1e-3 --beta2 0.99 --weight-decay 0" ;;
	*) echo "optim-gpt.sh: unknown optimizer $1" >&2; return 1 ;;
	esac
}

runs=()
done_optims=()
read -r -a all <<<"$optims"
togo=${#all[@]}
for o in $optims; do
	dir=$out/$o
	rm -rf "$dir"
	up=$(echo "$o" | tr '[:lower:]' '[:upper:]')
	extra_var=${up}_FLAGS
	read -r -a extra <<<"${!extra_var:-}"
	read -r -a base <<<"$(flags_for "$o")" || continue
	service=()
	if [ -n "${OPTIMIZER_SOCKET:-}" ] && [ "$o" != adamw ]; then
		service=(--pool "${POOL:?POOL=SOCK with OPTIMIZER_SOCKET}" --optimizer-socket "$OPTIMIZER_SOCKET" --run "optim-gpt-$o")
	fi
	limit_var=${up}_TIMEOUT
	limit=${!limit_var:-${RUN_TIMEOUT:-0}}
	if [ -n "${DEADLINE:-}" ]; then
		fair=$(((DEADLINE - $(date +%s)) / togo))
		if [ "$limit" = 0 ] || [ "$fair" -lt "$limit" ]; then limit=$fair; fi
		if [ "$limit" -lt 10 ]; then
			echo "{\"workload\": \"optim-gpt-run\", \"optimizer\": \"$o\", \"exit\": null, \"error\": \"not run: no time left\"}" | emit
			togo=$((togo - 1))
			continue
		fi
	fi
	togo=$((togo - 1))
	lim=()
	[ "$limit" != 0 ] && lim=(timeout -s INT -k 30 "$limit")
	echo "optim-gpt.sh: $o: trainer run ${base[*]} ${extra[*]:-} (limit ${limit}s)" >&2
	t0=$(date +%s.%N)
	cmd=(run)
	[ "${NPROC:-1}" -gt 1 ] && cmd=(launch --nproc "$NPROC" -- run)
	"${lim[@]}" "$bin/trainer" "${cmd[@]}" "${recipe[@]}" "${base[@]}" "${extra[@]}" "${service[@]}" --out "$dir" \
		>"$dir.jsonl" 2>"$dir.err"
	rc=$?
	t1=$(date +%s.%N)
	python3 - "$o" "$dir.jsonl" "$rc" "$t0" "$t1" "$steps" <<'PY' | emit
import json, sys
name, path, rc, t0, t1, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
last, val, roots = 0, None, None
for l in open(path):
    try:
        d = json.loads(l)
    except ValueError:
        continue
    last = max(last, d.get("step", 0))
    if "val_loss" in d:
        val, roots = d["val_loss"], d.get("roots")
print(json.dumps({"workload": "optim-gpt-run", "optimizer": name, "exit": rc, "steps_done": last, "steps": steps,
                  "cut": last < steps, "final_val_loss": val, "roots": roots, "wall_s": round(t1 - t0, 1)}))
PY
	if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then
		echo "optim-gpt.sh: $o failed (exit $rc):" >&2
		tail -5 "$dir.err" >&2
	fi
	if [ -s "$dir/metrics.jsonl" ]; then
		runs+=("$o=$dir/metrics.jsonl")
		done_optims+=("$o")
	fi
done
[ ${#runs[@]} -gt 0 ] || { echo "optim-gpt.sh: no run produced metrics" >&2; exit 1; }

# Steps and seconds to AdamW's best validation loss (the first run's, over
# what it evaluated: if its line above says "cut", up to there), and the
# plot.
"$plot" -o "$out/optim-gpt.png" "${runs[@]}" | emit

# Median step time (the loss lines' step_ms, after the first interval:
# compilation, capture and the first roots) against AdamW's.
python3 - "$out" "${done_optims[@]}" <<'PY' | emit
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
med, mean, refresh = {}, {}, {}
for n in names:
    lines = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl")]
    ls = [l for l in lines if "step_ms" in l][1:]
    if ls:
        med[n] = statistics.median(l["step_ms"] for l in ls)
        mean[n] = statistics.mean(l["step_ms"] for l in ls)
    roots = [l["roots"] for l in lines if l.get("roots")]
    if roots and roots[-1].get("refreshes_gpu_timed"):
        r = roots[-1]
        refresh[n] = {"refresh_gpu_ms": round(r["refresh_gpu_ms"] / r["refreshes_gpu_timed"], 3),
                      "refresh_gpu_ms_per_step": round(r["refresh_gpu_ms"] / max(1, lines[-1].get("step", 1)), 3),
                      "refresh_blocks": r.get("refresh_blocks")}
base = med.get(names[0])
for n in names:
    if n in med:
        print(json.dumps({"workload": "optim-gpt-step", "optimizer": n, "nproc": int(__import__("os").environ.get("NPROC", "1")),
                          "step_ms": round(med[n], 3), "mean_step_ms": round(mean[n], 3),
                          "over_adamw": round(med[n] / base, 4) if base else None, **refresh.get(n, {})}))
PY
echo "optim-gpt.sh: results in $out (optim-gpt.jsonl, optim-gpt.png)" >&2
