#!/usr/bin/env bash
# bench/hrm.sh — issue 23's HRM benchmarks on a GPU machine, gpukit and
# PyTorch (bench/reference/hrm.py) in the same run, within a time budget
# (BUDGET seconds, default 360: a part that would pass it is cut short or
# skipped, and says so). JSON lines (each with "part") on stdout and in
# $BENCH_OUT/hrm.jsonl; one table last.
#
#   train    `trainer run --model hrm` (bf16, batch 768, the segment step
#            one CUDA graph) for STEPS segment steps (default 60) on the
#            1k training puzzles with 1000 augmented copies each, then its
#            evaluation of the first QEVAL_N test puzzles (1000): the step
#            time (median step_ms of the loss lines after the first, which
#            holds the eager step and the capture), mfu, and accuracy
#            against wall time
#   compile  hrm.py bench --modes compile --no-eval: the median time of the
#            reference's segment step under torch.compile (CUDA events, 10
#            steps after 3 warm-up), the issue's target being ≤ 0.5× it
#   eval     `trainer eval` of the run's checkpoint on EVAL_N test puzzles
#            (10,000), with halting and with --no-halt (always 16
#            segments): each batch one launch of a captured graph whose
#            segment loop is a conditional WHILE node; then hrm.py eval of
#            the same checkpoint (the reference's host loop: a host check
#            after every segment), both modes; the seconds exclude warm-up
#            batches on both sides. Last (if the budget allows), the
#            trainer's evaluation with --graph off: the same kernels, the
#            WHILE loop driven from the host (what the conditional node
#            saves by itself)
#   quality  hrm.py train (eager) for the same STEPS on the same data and
#            settings, its evaluation of QEVAL_N puzzles with halting:
#            accuracy against wall time beside the trainer's (the issue's
#            full 1k setting is the reference's 26041 steps: see the
#            table's last line)
#
# usage: bench/hrm.sh [SUDOKU_DIR]
#   SUDOKU_DIR: train.safetensors and test.safetensors of `trainer data
#   sudoku --out DIR --n 1000 --test-n 10000 --difficulty expert` (made
#   here when not given: needs qqwing and faketime, and takes about 20 min
#   of two cores for 11,000 expert puzzles; a GPU machine without qqwing
#   needs the directory carried to it).
# Environment: STEPS (60), WARMUP (10: linear warmup steps, both sides),
#   BATCH (768), EVAL_N (10000), QEVAL_N (1000), BUDGET (360), and, to
#   check the script on a CPU, DEVICE=cpu with ARCH="--hidden 32 ..." (flags
#   of both sides' architecture).
# Runs inside the GPU bundle (bin/trainer, bench/reference/hrm.py) or a
# source tree with ./bin built.
set -euo pipefail
. "$(dirname "$0")/hrm-common.sh"
steps=${STEPS:-60} warmup=${WARMUP:-10} batch=${BATCH:-768} evaln=${EVAL_N:-10000} qevaln=${QEVAL_N:-1000}
budget=${BUDGET:-360}
start=$SECONDS
log() { echo "bench/hrm.sh: $*" >&2; }
left() { echo $((budget - (SECONDS - start))); }
# within LIMIT CMD...: runs CMD with a timeout of LIMIT seconds or what is
# left of the budget, whichever is less; skips it when under 5 s are left.
within() {
	local lim=$1 l
	shift
	l=$(left)
	((l < lim)) && lim=$l
	if ((lim < 5)); then
		log "skipped (budget of ${budget}s spent): $*"
		return 124
	fi
	timeout --signal=TERM --kill-after=5 "$lim" "$@"
}

data=${1:-}
if [ -z "$data" ]; then
	data=$work/sudoku
	log "no SUDOKU_DIR: making 1000 training and 10000 test expert puzzles with qqwing (about 20 min of two cores)"
	"$bin/trainer" data sudoku --out "$data" --n 1000 --test-n 10000 --difficulty expert --seed 1 >/dev/null
	start=$SECONDS
fi
for f in train.safetensors test.safetensors; do
	[ -f "$data/$f" ] || { log "$data/$f missing (trainer data sudoku --out $data)"; exit 1; }
done
python3 -c 'import torch, safetensors' || { log "python3 with torch and safetensors is required"; exit 1; }
common=(--steps "$steps" --batch "$batch" --warmup "$warmup" --num-aug 1000 --eval-every "$steps" --eval-n "$qevaln" --log-every 10)

# train: the trainer's run (step time, mfu, quality after STEPS).
t0=$SECONDS
within 50 "$bin/trainer" run --model hrm --data "$data" --out "$work/go" "${gdev[@]}" "${common[@]}" --save-every 100000 \
	"${arch[@]}" 2>"$work/go.err" | tag train "$out/hrm.jsonl" || log "trainer run: exit $? ($(tail -1 "$work/go.err"))"
echo "{\"part\": \"train\", \"impl\": \"gpukit\", \"wall_s\": $((SECONDS - t0))}" | tee -a "$out/hrm.jsonl"

# compile: hrm.py's segment step under torch.compile.
if [ "$device" = cuda ]; then
	# torch.compile of the segment step took more than 70 s on an H100
	# (2026-11-28: cut at 70 s, done within 200 s).
	within 180 python3 "$ref" bench --modes compile --no-eval --batch "$batch" --warmup 3 --iters 10 "${pdev[@]}" "${arch[@]}" |
		tag compile "$out/hrm.jsonl" || log "hrm.py bench --modes compile: exit $?"
fi

# eval: the captured evaluation against hrm.py's host loop, on the run's checkpoint.
ckpt=$work/go/model.safetensors
if [ -f "$ckpt" ]; then
	for h in "" --no-halt; do
		within 30 "$bin/trainer" eval --ckpt "$ckpt" --data "$data" --n "$evaln" --batch "$batch" "${gdev[@]}" $h 2>>"$work/eval.err" |
			tag eval "$out/hrm.jsonl" || log "trainer eval $h: exit $? ($(tail -1 "$work/eval.err"))"
	done
	within 40 python3 "$ref" eval --ckpt "$ckpt" --test "$data/test.safetensors" --n "$evaln" --batch "$batch" "${pdev[@]}" |
		tag eval-torch "$out/hrm.jsonl" || log "hrm.py eval: exit $?"
else
	log "no checkpoint of the trainer's run: eval skipped"
fi

# quality: hrm.py train (eager) on the same data and settings.
t0=$SECONDS
within 60 python3 "$ref" train --data "$data" "${common[@]}" "${pdev[@]}" "${arch[@]}" | tag quality-torch "$out/hrm.jsonl" ||
	log "hrm.py train: exit $? (cut by the budget: its lines so far are kept)"
echo "{\"part\": \"quality-torch\", \"impl\": \"torch-eager\", \"wall_s\": $((SECONDS - t0))}" | tee -a "$out/hrm.jsonl"

# eval, host-driven: the trainer's evaluation with --graph off (the same
# kernels launched one by one, the WHILE loop driven from the host with a
# flag read per segment): what the conditional node saves by itself.
if [ -f "$ckpt" ] && [ "$device" = cuda ]; then
	within 25 "$bin/trainer" eval --ckpt "$ckpt" --data "$data" --n "$evaln" --batch "$batch" --device cuda --precision bf16 \
		--graph off 2>>"$work/eval.err" | tag eval-nograph "$out/hrm.jsonl" || log "trainer eval --graph off: exit $?"
fi

# The table.
python3 - "$out/hrm.jsonl" "$steps" "$batch" "$device" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps, batch = int(sys.argv[2]), int(sys.argv[3])
prec = "bf16" if sys.argv[4] == "cuda" else "f32, CPU"
P = lambda p: [r for r in rows if r.get("part") == p]
def fmt(v, f="{:.3f}"):
    return "-" if v is None else f.format(v)
go = P("train")
loss = [r for r in go if "loss" in r]
go_ms = statistics.median(r["step_ms"] for r in loss[1:]) if len(loss) > 1 else None
mfu = statistics.median(r["mfu"] for r in loss[1:] if "mfu" in r) if len(loss) > 1 and "mfu" in loss[-1] else None
comp = [r for r in P("compile") if "ms" in r]
t_ms = comp[0]["ms"] if comp else None
tq = P("quality-torch")
tl = [r for r in tq if "loss" in r and "elapsed_s" in r]
eager_ms = (statistics.median((b["elapsed_s"] - a["elapsed_s"]) * 1e3 / (b["step"] - a["step"]) for a, b in zip(tl[1:], tl[2:]))
            if len(tl) > 2 else None)
print()
print(f"HRM (batch {batch}, {prec}): segment step")
print(f"  gpukit trainer (CUDA graph)  {fmt(go_ms, '{:.2f}')} ms" + (f"  (mfu {mfu:.3f})" if mfu else ""))
print(f"  hrm.py torch.compile         {fmt(t_ms, '{:.2f}')} ms" + (f"  -> gpukit/compile = {go_ms / t_ms:.2f} (target <= 0.5)" if go_ms and t_ms else ""))
print(f"  hrm.py eager                 {fmt(eager_ms, '{:.2f}')} ms (train loop, host syncs per step)")
ev = {("gpukit", r["halting"]): r for r in P("eval") if "seconds" in r}
ev.update({("torch", r["halting"]): r for r in P("eval-torch") if "seconds" in r})
ev.update({("gpukit-eager", r["halting"]): r for r in P("eval-nograph") if "seconds" in r})
print("evaluation (the trainer's checkpoint after %d steps)" % steps)
print("  impl          halting  puzzles  seconds  mean_segments  exact   cell")
for (impl, h), r in sorted(ev.items()):
    print(f"  {impl:13} {str(h):8} {r['puzzles']:7d}  {r['seconds']:7.2f}  {r['mean_segments']:13.2f}  {r['exact_accuracy']:.4f}  {r['cell_accuracy']:.4f}")
for h in (True, False):
    if ("gpukit", h) in ev and ("torch", h) in ev:
        print(f"  halting {h}: gpukit/hrm.py time = {ev[('gpukit', h)]['seconds'] / ev[('torch', h)]['seconds']:.2f}")
print(f"quality after {steps} segment steps (first test puzzles, halting)")
ge = [r for r in go if "test_cell_accuracy" in r]
gw = [r for r in go if "wall_s" in r]
if ge:
    r = ge[-1]
    print(f"  gpukit  step {r['step']}: exact {r['test_exact_accuracy']:.4f} cell {r['test_cell_accuracy']:.4f} at {r['elapsed_s']:.1f} s of training ({gw[0]['wall_s'] if gw else '-'} s wall)")
te = [r for r in tq if r.get("halting") is True]
tw = [r for r in tq if "wall_s" in r]
if te:
    r = te[-1]
    print(f"  hrm.py  step {r['step']}: exact {r['exact_accuracy']:.4f} cell {r['cell_accuracy']:.4f} at {r['elapsed_s']:.1f} s ({tw[0]['wall_s'] if tw else '-'} s wall)")
elif tl:
    print(f"  hrm.py  cut at step {tl[-1]['step']} ({tl[-1]['elapsed_s']:.1f} s) by the budget")
if go_ms:
    print(f"a full 1k run (26041 segment steps) at this step time: gpukit {26041 * go_ms / 3.6e6:.2f} h" +
          (f", hrm.py torch.compile {26041 * t_ms / 3.6e6:.2f} h" if t_ms else ""))
PY
log "done in $((SECONDS - start))s; lines in $out/hrm.jsonl"
