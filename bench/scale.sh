#!/usr/bin/env bash
# bench/scale.sh — issue 27's scaling run of the 12-layer GPT (12 heads,
# d 768, block 1024, bf16, dropout 0, no clipping, the characters of TEXT)
# on 1, 2, 4 and 8 GPUs (sizes above the GPUs here are skipped), in one
# call that ends within BUDGET_S seconds (default 500: under 9 minutes on 4
# H100s with start-up; what does not fit is skipped and said so). JSON lines
# on stdout and in $BENCH_OUT/scale.jsonl, then a short table:
#
#   strong  global batch BATCH (32) at every size: tokens/s, efficiency =
#           tokens/s at N / (N × tokens/s at 1)
#   weak    PER_GPU (8) sequences per GPU: the same, against 1 GPU at
#           PER_GPU (at N = BATCH/PER_GPU it is the strong run)
#   zero1   the strong runs with --shard-optimizer (ZeRO-1: buckets
#           reduce-scattered, AdamW state split, parameters all-gathered),
#           when the trainer has the flag
#   memory  each run's peak GPU memory per GPU (nvidia-smi, sampled every
#           200 ms; the largest over the run's GPUs, CUDA context and NCCL
#           buffers included)
#   exposed the communication the step waits for: traced runs (tracer
#           record, --graph off so every phase has a GPU span) at every N >
#           1, the median GPU time of the "all-reduce" phase (from the end
#           of the backward on the main stream to the join of the
#           communication stream: the buckets still in flight), and of
#           "optimizer" with --shard-optimizer (it holds the all-gather);
#           also overhead = step ms at N − step ms on 1 GPU at the same
#           per-GPU batch (graph runs: exposed communication and the
#           backward's slowdown by NCCL's SMs together)
#   torch   PyTorch DDP with torch.compile (bench/reference/gpt.py ddp,
#           bucket_cap_mb 25, fused AdamW) and PyTorch's
#           ZeroRedundancyOptimizer on the same compiled module, in one
#           torchrun per N, at the strong batch; rank 0's peak memory
#           (max_memory_reserved: without the CUDA context, ~0.5 GiB)
#   busbw   the 256 MiB all-reduce, reduce-scatter and all-gather (f32,
#           graph mode) at the largest N, gpukit-allreduce next to
#           torch.distributed (bench/reference/allreduce.sh)
#   loss    the largest relative difference of each run's logged losses
#           (every 10th step) from the 1-GPU strong run's at the same
#           steps (same global batch and seed: the strong runs, with and
#           without --shard-optimizer)
#
# Order, so that a short budget keeps what matters most: the gpukit runs
# (strong, weak, ZeRO-1), PyTorch (largest size first), the traced runs,
# the collectives. Each command runs under min(its limit, the budget
# left), so the call ends within BUDGET_S plus a few seconds.
#
# Knobs to sweep (each run's JSON line records them): BUCKET_MB (25;
# --bucket-mb), LAST_BUCKET_MB (--last-bucket-mb: a small last bucket,
# dist.BucketConfig.LastBytes), COMM_PRIORITY (normal|high,
# --comm-priority: high puts NCCL's stream ahead of the backward's blocks,
# ops.Options.HighPriorityComm), NCCL_MAX_CTAS / NCCL_MIN_CTAS (NCCL's own
# environment: its CTAs, i.e. SMs, per collective; the trainer's
# --nccl-max-ctas and --nccl-min-ctas set the same, and the environment
# wins), GRAD_COMM (f32|bf16), TRAINER_FLAGS (any other flags). The
# trainer's flags are looked up in `trainer run --model gpt --help`: a
# trainer without one says so and the knob (or the ZeRO-1 runs) is
# skipped.
#
# usage: bench/scale.sh TEXT        (TEXT: tinyshakespeare.txt)
#        bench/scale.sh --table FILE (the table of a scale.jsonl already
#                                     written, e.g. by a call cut short)
# Env: NPROCS ("1 2 4 8"), BATCH (32), PER_GPU (8), STEPS (60), BUDGET_S
# (500), RUN_TIMEOUT (150 s per trainer run), DDP_TIMEOUT (200 s per
# torchrun), TORCH (1; 0 skips PyTorch), TORCH_NPROCS (the sizes PyTorch
# runs at; default NPROCS), TRACE (1), TRACE_NPROCS (the sizes traced;
# default NPROCS, 1 excluded; a 1 named here traces one GPU at PER_GPU, the
# phases' GPU times without NCCL beside them), SHARD (auto; 0 skips), BENCH_OUT (its
# raw/ keeps each run's stdout and stderr). NCCL_NVLS_ENABLE=0 stays set
# throughout. Runs inside the GPU
# bundle (bin/trainer, bin/tracer, bench/gpukit-allreduce) or a source tree
# with ./bin built.
# DRY_RUN=1 runs nothing: it prints every command the call would run, one
# line each ("+ CMD", with its environment where it has one of its own),
# for GPUS GPUs (default 8; any machine, no GPU needed), and checks the
# arguments as a real call does (trainer's flags included: it needs
# bin/trainer); the trainer's host test TestScaleScriptCommands runs the
# printed trainer commands on the CPU with a tiny model.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# table FILE: the markdown tables of a scale.jsonl (BATCH and PER_GPU as
# the call that wrote it had them).
table() {
	python3 - "$1" "${BATCH:-32}" "${PER_GPU:-8}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
batch, per = int(sys.argv[2]), int(sys.argv[3])
ok = lambda r: "tokens_per_s" in r
g = {(r["batch"], r["ranks"], r["shard_optimizer"]): r for r in rows
     if r.get("workload") == "gpt-scale" and r.get("impl") == "gpukit"}
for r in rows:
    if "error" in r:
        print(f'note: {r.get("impl", r.get("workload"))} {r.get("ranks")} GPUs batch {r.get("batch")}: {r["error"]}')
tr = {(r["ranks"], r["shard_optimizer"]): r for r in rows if r.get("workload") == "gpt-scale-trace" and "error" not in r}
th = {(r["ranks"], r.get("optim")): r for r in rows if r.get("impl", "").startswith("torch-ddp") and ok(r)}
def lossdiff(k):  # largest relative difference from the 1-GPU strong run's losses at the same steps
    a, b = g.get(k, {}).get("losses"), g.get((batch, 1, False), {}).get("losses")
    if not a or not b or k == (batch, 1, False):
        return None
    d = [abs(a[s] - b[s]) / abs(b[s]) for s in a if s in b]
    return max(d) if d else None
ns = sorted({k[1] for k in g})
def f(x, fmt="{:.0f}"):
    return fmt.format(x) if x is not None else ""
def tps(k):
    r = g.get(k)
    return r["tokens_per_s"] if r and ok(r) else None
def gib(mib):
    return f"{mib / 1024:.1f}" if mib else ""
print(f"\n12-layer GPT (d 768, block 1024, bf16), strong: global batch {batch}, weak: {per} per GPU; memory GiB per GPU (nvidia-smi peak; PyTorch: reserved)")
print("| GPUs | strong tok/s | eff | weak tok/s | eff | exposed ms | overhead ms | ZeRO-1 tok/s | mem | mem ZeRO-1 | DDP tok/s | ZeRO tok/s | DDP mem | ZeRO mem | gpukit/DDP | loss Δ | loss Δ ZeRO-1 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for n in ns:
    s, s1 = tps((batch, n, False)), tps((batch, 1, False))
    w, w1 = tps((per * n, n, False)), tps((per, 1, False))
    t = tr.get((n, False), {})
    ov = None
    if w and w1:
        ov = g[(per * n, n, False)]["step_ms"] - g[(per, 1, False)]["step_ms"]
    z = g.get((batch, n, True), {})
    d, zt = th.get((n, "adamw"), {}), th.get((n, "zero"), {})
    print("| " + " | ".join([
        str(n), f(s), f(s / (n * s1) if s and s1 else None, "{:.3f}"), f(w), f(w / (n * w1) if w and w1 else None, "{:.3f}"),
        f(t.get("all_reduce_ms"), "{:.2f}"), f(ov if n > 1 else None, "{:.2f}"), f(z.get("tokens_per_s")),
        gib(g.get((batch, n, False), {}).get("mem_MiB")), gib(z.get("mem_MiB")),
        f(d.get("tokens_per_s")), f(zt.get("tokens_per_s")),
        f(d.get("max_mem_reserved_GiB"), "{:.1f}"), f(zt.get("max_mem_reserved_GiB"), "{:.1f}"),
        f(s / d["tokens_per_s"] if s and d else None, "{:.2f}"),
        f(lossdiff((batch, n, False)), "{:.1e}"), f(lossdiff((batch, n, True)), "{:.1e}")]) + " |")
tn = sorted(k[0] for k in tr if not k[1])
if tn:
    print(f"\nTraced (--graph off), {per} sequences per GPU: GPU ms per step (median over ranks of each rank's median)")
    print("| GPUs | forward | backward | all-reduce tail | optimizer |")
    print("| --- | --- | --- | --- | --- |")
    for n in tn:
        t = tr[(n, False)]
        print("| " + " | ".join([str(n)] + [f(t.get(k), "{:.2f}") for k in ("forward_ms", "backward_ms", "all_reduce_ms", "optimizer_ms")]) + " |")
zt = tr.get((max(ns), True)) if ns else None
if zt:
    print(f'\nZeRO-1 traced on {max(ns)} GPUs: reduce-scatter tail {zt["all_reduce_ms"]:.2f} ms, optimizer (AdamW on the shard + all-gather) {zt.get("optimizer_ms", 0):.2f} ms per step')
coll = [r for r in rows if r.get("op") and r.get("busbw_GBps")]
if coll:
    print("\n| 256 MiB f32 (graph) | gpukit busbw GB/s | PyTorch busbw GB/s |")
    print("| --- | --- | --- |")
    for op in ("allreduce", "reducescatter", "allgather"):
        a = [r["busbw_GBps"] for r in coll if r["op"] == op and r["impl"] == "gpukit"]
        b = [r["busbw_GBps"] for r in coll if r["op"] == op and r["impl"] == "pytorch"]
        if a or b:
            print(f'| {op} ({coll[0]["ranks"]} GPUs) | {f(max(a) if a else None, "{:.1f}")} | {f(max(b) if b else None, "{:.1f}")} |')
PY

}
if [ "${1:-}" = --table ]; then
	[ -r "${2:-}" ] || { echo "bench/scale.sh --table FILE: cannot read ${2:-(none)}" >&2; exit 2; }
	table "$2"
	exit 0
fi
text=${1:?usage: bench/scale.sh TEXT}
[ -r "$text" ] || { echo "bench/scale.sh: cannot read $text" >&2; exit 2; }
bin=${GPUKIT_BIN:-$root/bin}
[ -x "$bin/trainer" ] || { echo "bench/scale.sh: no trainer at $bin/trainer (build it, or set GPUKIT_BIN)" >&2; exit 2; }
dry=${DRY_RUN:-0}
case $dry in 0 | 1) ;; *) echo "bench/scale.sh: DRY_RUN=$dry: want 0 or 1" >&2; exit 2 ;; esac
case ${COMM_PRIORITY:-normal} in normal | high) ;; *) echo "bench/scale.sh: COMM_PRIORITY=$COMM_PRIORITY: want normal or high" >&2; exit 2 ;; esac
for v in BATCH PER_GPU STEPS BUDGET_S GPUS; do
	x=${!v:-1}
	[[ $x =~ ^[0-9]+$ && $x -gt 0 ]] || { echo "bench/scale.sh: $v=$x: want a positive integer" >&2; exit 2; }
done
for v in NPROCS TORCH_NPROCS TRACE_NPROCS; do
	for n in ${!v:-1}; do
		[[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || { echo "bench/scale.sh: $v=\"${!v}\": want positive integers" >&2; exit 2; }
	done
done
work=$(mktemp -d)
if [ "$dry" = 1 ]; then
	out=$work/out
	trap 'rm -rf "$work"' EXIT
else
	out=${BENCH_OUT:-$(mktemp -d)}
fi
mkdir -p "$out"
exec 3>&1 # the dry run's commands go here, whatever a run's stdout is redirected to
# run CMD...: runs it, or in a dry run prints it ("+ CMD"; ENV=... first
# where given as leading NAME=VALUE words, which env then applies).
run() {
	if [ "$dry" = 1 ]; then
		printf '+' >&3
		printf ' %q' "$@" >&3
		printf '\n' >&3
		return 0
	fi
	env "$@"
}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/kernels} # one kernel cache for every run
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$work/inductor}
start=$SECONDS
budget=${BUDGET_S:-500}
left() { echo $((budget - (SECONDS - start))); }
# lim LIMIT: LIMIT seconds, or the budget left if less (at least 1).
lim() {
	local l
	l=$(left)
	[ "$l" -ge 1 ] || l=1
	echo $(($1 < l ? $1 : l))
}
# keep FILE...: copies a run's stdout and stderr into $out/raw.
keep() { [ "$dry" = 1 ] || { mkdir -p "$out/raw" && cp "$@" "$out/raw/" 2>/dev/null || true; }; }
note() { echo "bench/scale.sh [$((SECONDS - start))s]: $*" >&2; }
emit() { tee -a "$out/scale.jsonl"; }

if [ "$dry" = 1 ]; then
	gpus=${GPUS:-8}
elif [ -n "${GPUS:-}" ]; then
	gpus=$GPUS
else
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
	[ "$gpus" -gt 0 ] || gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
fi
nprocs=()
for n in ${NPROCS:-1 2 4 8}; do
	if [ "$n" -le "$gpus" ]; then nprocs+=("$n"); else note "skipping $n GPUs ($gpus here)"; fi
done
[ "${#nprocs[@]}" -gt 0 ] || { echo "bench/scale.sh: none of NPROCS fits the $gpus GPUs here" >&2; exit 2; }
maxn=${nprocs[-1]}
batch=${BATCH:-32} per=${PER_GPU:-8} steps=${STEPS:-60}
# The flags of the GPT's run (a plain `trainer run --help` is the default
# model's, which trains on one process).
help=$("$bin/trainer" run --model gpt --help 2>&1 || true)
has() { grep -q -- "$1" <<<"$help"; }
shard=${SHARD:-auto}
if [ "$shard" = auto ]; then
	if has --shard-optimizer; then shard=1; else shard=0; note "trainer run has no --shard-optimizer yet: ZeRO-1 runs skipped"; fi
fi
knobs=(--bucket-mb "${BUCKET_MB:-25}" --grad-comm "${GRAD_COMM:-f32}")
if [ -n "${LAST_BUCKET_MB:-}" ]; then
	if has --last-bucket-mb; then knobs+=(--last-bucket-mb "$LAST_BUCKET_MB"); else note "LAST_BUCKET_MB ignored: no --last-bucket-mb"; fi
fi
if [ -n "${COMM_PRIORITY:-}" ] && [ "$COMM_PRIORITY" != normal ]; then
	if has --comm-priority; then knobs+=(--comm-priority "$COMM_PRIORITY"); else note "COMM_PRIORITY ignored: no --comm-priority"; fi
fi
read -r -a extra <<<"${TRAINER_FLAGS:-}"
model=(--model gpt --data "$text" --layers 12 --heads 12 --d-model 768 --block 1024 --precision bf16 --dropout 0 --clip 0)
knobjson={}
[ "$dry" = 1 ] || knobjson=$(python3 -c 'import json,os; print(json.dumps({k: os.environ[k] for k in ("BUCKET_MB","LAST_BUCKET_MB","COMM_PRIORITY","NCCL_MAX_CTAS","NCCL_MIN_CTAS","GRAD_COMM","TRAINER_FLAGS") if os.environ.get(k)}))')

# The memory sampler: nvidia-smi every 200 ms into a file while a run goes.
mempid=
trap '[ -z "$mempid" ] || kill "$mempid" 2>/dev/null || true' EXIT
mem_on() {
	mempid=
	if [ "$dry" = 0 ] && command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
		mempid=$!
	fi
}
# mem_off FILE N: sets mem to the peak MiB over GPUs 0..N-1, or null. Not
# in a command substitution: its subshell would leave mempid set here, and
# the EXIT trap would kill a stale process id (and fail the call).
mem=null
mem_off() {
	if [ -n "$mempid" ]; then
		kill "$mempid" 2>/dev/null || true
		wait "$mempid" 2>/dev/null || true
		mempid=
	fi
	mem=$(python3 - "$1" "$2" <<'PY'
import sys
peak = None
try:
    for line in open(sys.argv[1]):
        f = [x.strip() for x in line.split(",")]
        if len(f) == 2 and f[0].isdigit() and int(f[0]) < int(sys.argv[2]):
            peak = max(peak or 0, int(f[1]))
except OSError:
    pass
print("null" if peak is None else peak)
PY
	)
}

# within N "LIST": N is one of LIST's words.
within() { [[ " $2 " == *" $1 "* ]]; }

# launcher N: the trainer command for N ranks (bin's path without spaces).
launcher() { if [ "$1" -gt 1 ]; then echo "$bin/trainer launch --nproc $1 -- run"; else echo "$bin/trainer run"; fi; }

# gpukit SCALING N B SHARD: one graph run at global batch B on N GPUs; one
# JSON line (step_ms: median over the loss lines after the first).
gpukit() {
	local scaling=$1 n=$2 b=$3 sh=$4 o="$work/$1-$2-$3-$4" flags=()
	[ "$sh" = 1 ] && flags+=(--shard-optimizer)
	mem_on "$o.mem"
	local rc=0
	# shellcheck disable=SC2046
	run timeout "$(lim "${RUN_TIMEOUT:-150}")" $(launcher "$n") "${model[@]}" --batch "$b" --steps "$steps" --log-every 10 \
		--eval-every "$steps" --eval-batches 1 "${knobs[@]}" "${flags[@]}" "${extra[@]}" --out "$o" >"$o.jsonl" 2>"$o.err" || rc=$?
	[ "$dry" = 0 ] || return 0
	keep "$o.jsonl" "$o.err"
	mem_off "$o.mem" "$n"
	python3 - "$o.jsonl" "$scaling" "$n" "$b" "$sh" "$mem" "$rc" "$knobjson" "$o.err" <<'PY' | emit
import json, statistics, sys
path, scaling, n, b, sh, mem, rc, knobs, err = sys.argv[1:10]
r = {"workload": "gpt-scale", "impl": "gpukit", "scaling": scaling, "ranks": int(n), "batch": int(b), "block": 1024,
     "shard_optimizer": sh == "1", "mem_MiB": json.loads(mem), "knobs": json.loads(knobs)}
ls = [json.loads(l) for l in open(path) if '"step_ms"' in l]
r["losses"] = {str(l["step"]): l["loss"] for l in ls if "step" in l}
ls = ls[1:]
if rc != "0" or not ls:
    tail = open(err).read().strip().splitlines()[-1:] or ["no loss lines"]
    r["error"] = f"exit {rc}: {tail[0]}"[:300]
else:
    ms = statistics.median(l["step_ms"] for l in ls)
    r.update(step_ms=ms, tokens_per_s=int(b) * 1024 / (ms / 1e3), mfu_per_gpu=ls[-1].get("mfu"), loss=ls[-1]["loss"])
print(json.dumps(r))
PY
}

# traced N B SHARD: a traced eager run (--graph off, 25 steps); the median
# GPU time per step of "all-reduce" (the exposed bucket tail), "backward"
# and "optimizer" over the ranks' steps after the fifth.
traced() {
	local n=$1 b=$2 sh=$3 o="$work/trace-$1-$2-$3" flags=()
	[ "$sh" = 1 ] && flags+=(--shard-optimizer)
	local rc=0
	# shellcheck disable=SC2046
	run timeout "$(lim "${RUN_TIMEOUT:-150}")" "$bin/tracer" record --out "$o.json" -- $(launcher "$n") "${model[@]}" --batch "$b" \
		--steps 25 --log-every 5 --eval-every 25 --eval-batches 1 --graph off "${knobs[@]}" "${flags[@]}" "${extra[@]}" \
		--out "$o" >"$o.jsonl" 2>"$o.err" || rc=$?
	[ "$dry" = 0 ] || return 0
	keep "$o.jsonl" "$o.err"
	python3 - "$o.json" "$n" "$b" "$sh" "$rc" "$knobjson" <<'PY' | emit
import json, statistics, sys
path, n, b, sh, rc, knobs = sys.argv[1:7]
r = {"workload": "gpt-scale-trace", "impl": "gpukit", "ranks": int(n), "batch": int(b), "shard_optimizer": sh == "1",
     "knobs": json.loads(knobs)}
try:
    ev = json.load(open(path))["traceEvents"]
except (OSError, ValueError, KeyError) as e:
    r["error"] = f"exit {rc}: trace unreadable: {e}"[:300]
    print(json.dumps(r)); sys.exit()
spans = {}
for e in ev:
    if e.get("ph") == "X" and e.get("cat") == "gpu" and e.get("name") in ("all-reduce", "backward", "optimizer", "forward"):
        spans.setdefault((e["name"], e["pid"]), []).append(e["dur"] / 1e3)
for name in ("all-reduce", "backward", "optimizer", "forward"):
    per = [statistics.median(v[5:]) for (k, pid), v in spans.items() if k == name and len(v) > 5]
    if per:
        r[name.replace("-", "_") + "_ms"] = statistics.median(per)
if "all_reduce_ms" not in r and int(n) > 1:
    r["error"] = f"exit {rc}: no GPU spans of the all-reduce phase"
print(json.dumps(r))
PY
}

# torch N: PyTorch DDP (compile) and ZeroRedundancyOptimizer at the strong
# batch on N GPUs, one torchrun; their lines, and the run's nvidia-smi peak.
torchrun_ddp() {
	local n=$1 o="$work/torch-$1"
	mem_on "$o.mem"
	run timeout "$(lim "${DDP_TIMEOUT:-200}")" python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
		"$root/bench/reference/gpt.py" ddp --layers 12 --heads 12 --d-model 768 --block 1024 --batch "$batch" \
		--mode compile --optims adamw,zero --warmup 10 --iters 15 --repeats 3 >"$o.jsonl" 2>"$o.err" ||
		note "torchrun gpt.py ddp on $n GPUs failed or timed out: $(tail -1 "$o.err")"
	[ "$dry" = 0 ] || return 0
	keep "$o.jsonl" "$o.err"
	mem_off "$o.mem" "$n"
	python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); r.update(workload="gpt-scale", scaling="strong", process_peak_MiB=json.loads(sys.argv[2])); print(json.dumps(r))' \
		"$o.jsonl" "$mem" | emit
}

for n in "${nprocs[@]}"; do
	note "strong: $n GPUs, batch $batch"
	gpukit strong "$n" "$batch" 0
done
for n in "${nprocs[@]}"; do
	b=$((per * n))
	[ "$b" -eq "$batch" ] && continue # the strong run
	if [ "$(left)" -lt 60 ]; then note "weak $n GPUs skipped (budget)"; continue; fi
	note "weak: $n GPUs, batch $b"
	gpukit weak "$n" "$b" 0
done
if [ "$shard" = 1 ]; then
	for n in "${nprocs[@]}"; do
		[ "$n" -gt 1 ] || continue
		if [ "$(left)" -lt 60 ]; then note "ZeRO-1 $n GPUs skipped (budget)"; continue; fi
		note "strong, --shard-optimizer: $n GPUs"
		gpukit strong "$n" "$batch" 1
	done
fi
if [ "${TORCH:-1}" = 1 ]; then
	for ((i = ${#nprocs[@]} - 1; i >= 0; i--)); do # the largest size first: the comparison that matters most
		n=${nprocs[i]}
		within "$n" "${TORCH_NPROCS:-${nprocs[*]}}" || continue
		if [ "$(left)" -lt 90 ]; then note "PyTorch on $n GPUs skipped (budget: $(left)s left)"; continue; fi
		note "PyTorch DDP compile + ZeroRedundancyOptimizer: $n GPUs"
		torchrun_ddp "$n"
	done
fi
if [ "${TRACE:-1}" = 1 ]; then
	for n in "${nprocs[@]}"; do
		[ "$n" -gt 1 ] || [ -n "${TRACE_NPROCS:-}" ] || continue # 1 GPU only when named: the backward without NCCL beside it
		within "$n" "${TRACE_NPROCS:-${nprocs[*]}}" || continue
		if [ "$(left)" -lt 60 ]; then note "traced $n GPUs skipped (budget)"; continue; fi
		note "traced (--graph off): $n GPUs, batch $((per * n))"
		traced "$n" $((per * n)) 0
	done
	if [ "$shard" = 1 ] && [ "$maxn" -gt 1 ] && within "$maxn" "${TRACE_NPROCS:-$maxn}" && [ "$(left)" -ge 60 ]; then
		note "traced, --shard-optimizer: $maxn GPUs"
		traced "$maxn" $((per * maxn)) 1
	fi
fi
if [ "$maxn" -gt 1 ] && [ "$(left)" -ge 60 ]; then
	note "collectives of 256 MiB on $maxn GPUs"
	rc=0
	ar=$(($(left) / 2)) # each side (gpukit, PyTorch) under its own limit
	run ROUNDS=1 OPS=allreduce,reducescatter,allgather DTYPES=f32 MODES=graph AR_TIMEOUT=$((ar < 60 ? ar : 60)) \
		bash "$root/bench/reference/allreduce.sh" "$maxn" 256MiB >"$work/coll.txt" 2>"$work/coll.err" || rc=$?
	keep "$work/coll.txt" "$work/coll.err"
	if [ "$dry" = 1 ]; then
		:
	elif [ "$rc" = 0 ] && grep -q '^{' "$work/coll.txt"; then
		grep '^{' "$work/coll.txt" | emit
	else
		note "allreduce.sh failed: $(tail -3 "$work/coll.err" | tr '\n' ' ')"
	fi
fi

if [ "$dry" = 1 ]; then
	note "dry run: nothing ran"
	exit 0
fi
table "$out/scale.jsonl"
note "results in $out/scale.jsonl (done in $((SECONDS - start))s)"
