#!/usr/bin/env bash
# bench/hrm-quality.sh — issue 23's quality comparison on a GPU machine:
# exact-puzzle accuracy against wall time of `trainer run --model hrm` and
# of bench/reference/hrm.py (torch.compile, as sapientinc/HRM's
# pretrain.py), trained for the same STEPS segment steps on the same 1k
# puzzles with 1000 augmented copies each, both evaluated on the first
# QEVAL_N test puzzles every EVAL_EVERY steps. With two GPUs the two
# trainings run side by side (GPU_GO and GPU_TORCH; the same kind of GPU in
# one host, one process each); with one they run one after the other.
# Then, on the trainer's final checkpoint: `trainer eval` of EVAL_N test
# puzzles with halting and with --no-halt (always --halt-max-steps
# segments): the mean segments that halting saves, at the accuracy each
# reaches, and hrm.py's host-loop evaluation of the same checkpoint.
# JSON lines (each with "part") in $BENCH_OUT/hrm-quality.jsonl; the table
# last.
#
# usage: bench/hrm-quality.sh SUDOKU_DIR
#   SUDOKU_DIR: train.safetensors and test.safetensors of `trainer data
#   sudoku --out DIR --n 1000 --test-n 10000 --difficulty expert`.
# Environment: STEPS (4500), WARMUP (a tenth of STEPS, both sides), BATCH
#   (768), EVAL_EVERY (500), QEVAL_N (1000), EVAL_N (10000), LIMIT (seconds
#   each training may take, 480), GPU_GO (0), GPU_TORCH (1; empty: the
#   trainings run one after the other on GPU_GO), and, to check the script
#   on a CPU, DEVICE=cpu with ARCH="--hidden 32 ..." (both sides' flags).
set -euo pipefail
. "$(dirname "$0")/hrm-common.sh"
steps=${STEPS:-4500} batch=${BATCH:-768} every=${EVAL_EVERY:-500} qevaln=${QEVAL_N:-1000} evaln=${EVAL_N:-10000}
warmup=${WARMUP:-$((steps / 10))} limit=${LIMIT:-480}
ggo=${GPU_GO:-0} gto=${GPU_TORCH-1}
pcomp=(--compile)
[ "$device" = cpu ] && pcomp=()
log() { echo "bench/hrm-quality.sh: $*" >&2; }
data=${1:?usage: bench/hrm-quality.sh SUDOKU_DIR}
for f in train.safetensors test.safetensors; do
	[ -f "$data/$f" ] || { log "$data/$f missing (trainer data sudoku --out $data --n 1000 --test-n 10000)"; exit 2; }
done
python3 -c 'import torch, safetensors' || { log "python3 with torch and safetensors is required"; exit 1; }
: >"$out/hrm-quality.jsonl"
common=(--steps "$steps" --batch "$batch" --warmup "$warmup" --num-aug 1000 --eval-every "$every" --eval-n "$qevaln" --log-every 100)
log "STEPS=$steps WARMUP=$warmup BATCH=$batch EVAL_EVERY=$every QEVAL_N=$qevaln LIMIT=${limit}s GPU_GO=$ggo GPU_TORCH=${gto:-(sequential)}"

go_train() {
	CUDA_VISIBLE_DEVICES=$ggo timeout --kill-after=5 "$limit" "$bin/trainer" run --model hrm --data "$data" --out "$work/go" \
		"${gdev[@]}" "${common[@]}" --save-every 100000 "${arch[@]}" 2>"$work/go.err" | tag train-gpukit "$out/hrm-quality.jsonl" >/dev/null ||
		log "trainer run: exit $? ($(tail -1 "$work/go.err"))"
}
torch_train() {
	CUDA_VISIBLE_DEVICES=${gto:-$ggo} timeout --kill-after=5 "$limit" python3 "$ref" train --data "$data" "${common[@]}" \
		"${pdev[@]}" "${pcomp[@]}" "${arch[@]}" --out "$work/torch.safetensors" 2>"$work/torch.err" | tag train-torch "$out/hrm-quality.jsonl" >/dev/null ||
		log "hrm.py train: exit $? ($(tail -1 "$work/torch.err"))"
}
ckpt=$work/go/model.safetensors
evals() {
	if [ ! -f "$ckpt" ]; then
		log "no checkpoint of the trainer's run (cut by LIMIT?): evaluation skipped"
		return
	fi
	for h in "" --no-halt; do
		CUDA_VISIBLE_DEVICES=$ggo timeout 60 "$bin/trainer" eval --ckpt "$ckpt" --data "$data" --n "$evaln" --batch "$batch" \
			"${gdev[@]}" $h 2>>"$work/eval.err" | tag eval-gpukit "$out/hrm-quality.jsonl" >/dev/null || log "trainer eval $h: exit $? ($(tail -1 "$work/eval.err"))"
	done
	CUDA_VISIBLE_DEVICES=$ggo timeout 90 python3 "$ref" eval --ckpt "$ckpt" --test "$data/test.safetensors" --n "$evaln" \
		--batch "$batch" "${pdev[@]}" | tag eval-torch "$out/hrm-quality.jsonl" >/dev/null || log "hrm.py eval: exit $?"
}
if [ -n "$gto" ]; then
	# Two GPUs: the evaluations run on GPU_GO while hrm.py still trains.
	torch_train &
	tp=$!
	go_train
	evals
	wait "$tp" || true
else
	go_train
	torch_train
	evals
fi

python3 - "$out/hrm-quality.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
P = lambda p: [r for r in rows if r.get("part") == p]
go = [(r["step"], r["elapsed_s"], r["test_exact_accuracy"], r["test_cell_accuracy"], r.get("test_mean_segments"))
      for r in P("train-gpukit") if "test_exact_accuracy" in r]
to = [(r["step"], r["elapsed_s"], r["exact_accuracy"], r["cell_accuracy"], r.get("mean_segments"))
      for r in P("train-torch") if r.get("halting") is True and "exact_accuracy" in r]
print("accuracy against wall time (first test puzzles, halting; seconds from the first step, compilation and evaluations included)")
print("  step | gpukit s  exact   cell   segs | hrm.py s  exact   cell   segs")
tt = {s: (e, x, c, m) for s, e, x, c, m in to}
for s, e, x, c, m in go:
    t = tt.pop(s, None)
    right = f"{t[0]:8.1f} {t[1]:.4f} {t[2]:.4f} {t[3] or 0:6.2f}" if t else "        -"
    print(f"{s:6d} | {e:8.1f} {x:.4f} {c:.4f} {m or 0:6.2f} | {right}")
for s, (e, x, c, m) in sorted(tt.items()):
    print(f"{s:6d} |        - | {e:8.1f} {x:.4f} {c:.4f} {m or 0:6.2f}")
ev = [r for p in ("eval-gpukit", "eval-torch") for r in P(p) if "seconds" in r]
if ev:
    print("evaluation of the trainer's final checkpoint")
    print("  impl                 halting  puzzles  seconds  mean_segments  exact   cell")
    for r in ev:
        impl = "gpukit (one graph)" if r["part"] == "eval-gpukit" else "hrm.py (host loop)"
        print(f"  {impl:20} {str(r['halting']):8} {r['puzzles']:7d}  {r['seconds']:7.2f}  {r['mean_segments']:13.2f}  {r['exact_accuracy']:.4f}  {r['cell_accuracy']:.4f}")
PY
log "lines in $out/hrm-quality.jsonl"
