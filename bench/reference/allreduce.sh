#!/usr/bin/env bash
# All-reduce bus bandwidth on a multi-GPU machine: gpukit-allreduce (through
# libgpu/nccl) and allreduce.py (torch.distributed under torchrun) alternate
# for ROUNDS rounds (default 3) on the same GPUs, each line already a median
# of its repeats; prints the JSON lines, then a markdown table of medians
# (for BENCHMARKS.md). NCCL_NVLS_ENABLE=0 is kept set.
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
	"$drv" --nproc "$nproc" --size "$size" | tee -a "$work/gpukit.jsonl"
	python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" "$here/allreduce.py" --size "$size" |
		tee -a "$work/torch.jsonl"
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
print("| all-reduce | gpukit µs | gpukit busbw GB/s | PyTorch µs | PyTorch busbw GB/s | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for k in keys:
    g, t = rows.get((k, "gpukit"), []), rows.get((k, "pytorch"), [])
    gu = statistics.median(r["us"] for r in g) if g else float("nan")
    tu = statistics.median(r["us"] for r in t) if t else float("nan")
    gb = statistics.median(r["busbw_GBps"] for r in g) if g else float("nan")
    tb = statistics.median(r["busbw_GBps"] for r in t) if t else float("nan")
    print(f"| {k.removeprefix('allreduce ')} | {gu:.1f} | {gb:.1f} | {tu:.1f} | {tb:.1f} | {gb / tb:.3f} |")
PY
