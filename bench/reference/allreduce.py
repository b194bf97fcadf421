"""torch.distributed collective bus bandwidth, for the table gpukit-allreduce
fills (bench/cmd/gpukit-allreduce): run under torchrun (or trainer launch),
one process per GPU; rank 0 prints one JSON line per (op, dtype, mode) with
the same keys:

    torchrun --standalone --nproc-per-node 2 bench/reference/allreduce.py --size 256MiB [--ops allreduce,reducescatter,allgather]

us is the time of one collective on a --size buffer (median over --repeats
of --iters back-to-back collectives timed with CUDA events on rank 0 after a
barrier): allreduce an in-place SUM all_reduce; reducescatter an in-place
SUM reduce_scatter_tensor (each rank's output its 1/n of the buffer, as
FSDP and ZeroRedundancyOptimizer's buckets are); allgather an in-place
all_gather_into_tensor. algbw = bytes/time, busbw = algbw*2(n-1)/n for an
all-reduce and algbw*(n-1)/n for the others (nccl-tests' PERFORMANCE.md).
Mode "eager" calls the collective --iters times; "graph" replays the
--iters calls captured in one torch.cuda.CUDAGraph.
NCCL_NVLS_ENABLE=0 is set when unset (NVLink multicast stays off on shared
GPU hosts).
"""
import argparse
import json
import os
import re
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2, "gi": 1024**3}


def parse_size(s):
    """'256MiB', '256M' (= MiB, as gpukit's sizes), '1G', '1000000'."""
    m = re.fullmatch(r"(\d+)\s*([kKmMgG]?i?)[bB]?", s.strip())
    if not m:
        raise ValueError(f"size {s!r}")
    unit = m.group(2).lower()
    if unit in ("k", "m", "g"):
        unit += "i"  # libgpu/cli: 1G = 1GiB
    return int(m.group(1)) * UNITS[unit]


def capture(one, iters, rank):
    """iters calls of one (a collective) captured in one CUDA graph (warmed
    up on a side stream, as torch.cuda.graphs asks); None, said on stderr,
    when PyTorch cannot capture them."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                one()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                one()
        g.replay()
        return g.replay
    except Exception as e:  # noqa: BLE001 - reported, the eager line stands
        if rank == 0:
            print(f"allreduce.py: graph mode: {e}", file=sys.stderr)
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="256MiB")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--ops", default="allreduce")
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, n = dist.get_rank(), dist.get_world_size()
    nbytes = parse_size(a.size)
    types = {"f32": torch.float32, "bf16": torch.bfloat16}
    barrier = torch.zeros(1, device="cuda")
    for ds in a.dtypes.split(","):
        dt = types[ds]
        x = torch.zeros(nbytes // dt.itemsize // n * n, dtype=dt, device="cuda")
        part = x.chunk(n)[rank]
        for op in a.ops.split(","):
            one = {
                "allreduce": lambda: dist.all_reduce(x),
                "reducescatter": lambda: dist.reduce_scatter_tensor(part, x),
                "allgather": lambda: dist.all_gather_into_tensor(x, part),
            }.get(op)
            if one is None:
                raise SystemExit(f"op {op!r}: want allreduce, reducescatter or allgather")
            for mode in a.modes.split(","):
                measure(a, op, one, mode, x, ds, n, rank, barrier)
        del x, part
    dist.destroy_process_group()


def measure(a, op, one, mode, x, ds, n, rank, barrier):
    """Times one collective in mode and prints rank 0's line."""
    for _ in range(a.warmup):
        one()
    if mode == "eager":
        def body():
            for _ in range(a.iters):
                one()
    elif mode == "graph":
        body = capture(one, a.iters, rank)
        if body is None:
            return
    else:
        raise SystemExit(f"mode {mode!r}: want eager or graph")
    us = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(a.repeats):
        dist.all_reduce(barrier)
        torch.cuda.synchronize()
        start.record()
        body()
        end.record()
        end.synchronize()
        us.append(start.elapsed_time(end) * 1e3 / a.iters)
    if rank == 0:
        t = statistics.median(us)
        alg = x.numel() * x.element_size() / (t * 1e-6) / 1e9
        bus = alg * (n - 1) / n * (2 if op == "allreduce" else 1)
        print(json.dumps({
            "impl": "pytorch", "key": f"{op} bytes={x.numel() * x.element_size()} dtype={ds} ranks={n} mode={mode}",
            "op": op, "bytes": x.numel() * x.element_size(), "dtype": ds, "ranks": n, "mode": mode, "us": t,
            "algbw_GBps": alg, "busbw_GBps": bus, "repeats_us": us,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
        }), flush=True)


if __name__ == "__main__":
    main()
