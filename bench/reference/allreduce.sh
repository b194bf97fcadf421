#!/usr/bin/env bash
# Collective bus bandwidth on a multi-GPU machine: gpukit-allreduce (through
# libgpu/nccl) and allreduce.py (torch.distributed under torchrun) alternate
# for ROUNDS rounds (default 3) on the same GPUs, each line already a median
# of its repeats; prints the JSON lines, then a markdown table of medians
# (for BENCHMARKS.md). NCCL_NVLS_ENABLE=0 is kept set. OPS (default
# allreduce) lists the collectives: allreduce, reducescatter, allgather
# (ZeRO-1's gradient and parameter buckets); DTYPES (default f32,bf16) and
# MODES (default eager,graph) narrow the rest.
#   usage: allreduce.sh [NPROC] [SIZE]      (default: 2 256MiB)
# With SOCKETS=1 both run with NCCL's socket transport only
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo).
# GPUKIT_ALLREDUCE names the driver (default: ../gpukit-allreduce beside this
# directory in the GPU bundle, else gpukit-allreduce on PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nproc=${1:-2}
size=${2:-256MiB}
rounds=${ROUNDS:-3}
sel=(--ops "${OPS:-allreduce}" --dtypes "${DTYPES:-f32,bf16}" --modes "${MODES:-eager,graph}")
drv=${GPUKIT_ALLREDUCE:-$here/../gpukit-allreduce}
[ -x "$drv" ] || drv=$(command -v gpukit-allreduce)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} PYTHONUNBUFFERED=1
if [ "${SOCKETS:-0}" = 1 ]; then
	export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
fi
work=$(mktemp -d)
for r in $(seq "$rounds"); do
	echo "round $r/$rounds" >&2
	# Each side under its own limit (AR_TIMEOUT seconds, default 120): a
	# hang (two runs on 2 H200s never returned within 200 s, with no line
	# out) ends as a line saying which side, with NCCL's warnings. Seen on
	# 2 H200s (2026-11-23): allreduce.py prints every line, then does not
	# exit; the limit ends it and its lines are kept.
	NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout "${AR_TIMEOUT:-120}" "$drv" --nproc "$nproc" --size "$size" "${sel[@]}" \
		2>"$work/gpukit-$r.err" | tee -a "$work/gpukit.jsonl" ||
		{ echo "allreduce.sh: gpukit-allreduce failed or timed out (round $r):" >&2; tail -20 "$work/gpukit-$r.err" >&2; }
	NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout "${AR_TIMEOUT:-120}" python3 -m torch.distributed.run --standalone \
		--nproc-per-node "$nproc" "$here/allreduce.py" --size "$size" "${sel[@]}" 2>"$work/torch-$r.err" | tee -a "$work/torch.jsonl" ||
		{ echo "allreduce.sh: allreduce.py failed or timed out (round $r):" >&2; tail -20 "$work/torch-$r.err" >&2; }
done
python3 - "$work/gpukit.jsonl" "$work/torch.jsonl" <<'PY'
import json, statistics, sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault((r["key"], r["impl"]), []).append(r)
keys = sorted({k for k, _ in rows})
print("| collective | gpukit µs | gpukit busbw GB/s | PyTorch µs | PyTorch busbw GB/s | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for k in keys:
    g, t = rows.get((k, "gpukit"), []), rows.get((k, "pytorch"), [])
    gu = statistics.median(r["us"] for r in g) if g else float("nan")
    tu = statistics.median(r["us"] for r in t) if t else float("nan")
    gb = statistics.median(r["busbw_GBps"] for r in g) if g else float("nan")
    tb = statistics.median(r["busbw_GBps"] for r in t) if t else float("nan")
    print(f"| {k} | {gu:.1f} | {gb:.1f} | {tu:.1f} | {tb:.1f} | {gb / tb:.3f} |")
PY
