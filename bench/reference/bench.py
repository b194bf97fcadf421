#!/usr/bin/env python3
"""PyTorch side of gpukit's side-by-side benchmarks.

Runs every workload of ../workloads.json once (one repeat: warm-up, then
`iters` launches between two CUDA events) and prints one JSON line per
workload: {"impl": "ref", "key": ..., "ms": per-launch milliseconds,
"flops": ..., "bytes": ...}. bench/run.sh alternates this with gpukit's driver
and takes medians over rounds.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F


def key(w):
    parts = [w["name"]] + [f"{k}={w[k]}" for k in ("dtype", "act", "m", "n", "k", "bytes", "kernels", "pch") if k in w]
    return " ".join(parts)


def timed(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def dtype_of(w):
    return torch.bfloat16 if w.get("dtype") == "bf16" else torch.float32


def act_fn(name):
    return torch.relu if name == "relu" else (lambda z: F.gelu(z, approximate="tanh"))


def run(w, gen):
    name = w["name"]
    if name == "copy":
        n = w["bytes"] // 2
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda", generator=gen)
        dst = torch.empty_like(src)
        ms = timed(lambda: dst.copy_(src), w["iters"])
        return ms, 0, 2 * n
    torch.backends.cuda.matmul.allow_tf32 = w.get("dtype") == "tf32"
    dt = dtype_of(w)
    if name == "gemm":
        m, n, k = w["m"], w["n"], w["k"]
        a = torch.randn(m, k, device="cuda", dtype=dt, generator=gen)
        b = torch.randn(k, n, device="cuda", dtype=dt, generator=gen)
        ms = timed(lambda: torch.matmul(a, b), w["iters"])
        return ms, 2 * m * n * k, (m * k + k * n + m * n) * a.element_size()
    if name in ("linear_fwd", "linear_bwd"):
        m, n, k = w["m"], w["n"], w["k"]
        x = torch.randn(m, k, device="cuda", dtype=dt, generator=gen)
        wt = torch.randn(n, k, device="cuda", dtype=dt, generator=gen) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=dt, generator=gen)
        act = act_fn(w["act"])
        es = x.element_size()
        if name == "linear_fwd":
            ms = timed(lambda: act(F.linear(x, wt, bias)), w["iters"])
            return ms, 2 * m * n * k, (m * k + n * k + n + m * n) * es
        x.requires_grad_(True)
        wt.requires_grad_(True)
        bias.requires_grad_(True)
        y = act(F.linear(x, wt, bias))
        dy = torch.randn_like(y)

        def bwd():
            torch.autograd.grad(y, (x, wt, bias), dy, retain_graph=True)

        ms = timed(bwd, w["iters"])
        # dx = dz·w and dw = dzᵀ·x; reads dy, z, x, w; writes dx, dw, db.
        return ms, 4 * m * n * k, (2 * m * n + m * k + n * k + m * k + n * k + n) * es
    if name in ("launch_eager", "launch_graph"):
        t = torch.zeros(1, device="cuda")
        kern = w["kernels"]

        def eager():
            for _ in range(kern):
                t.add_(1.0)

        if name == "launch_eager":
            return timed(eager, w["iters"]) / kern, 0, 0
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            eager()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            eager()
        return timed(g.replay, w["iters"]) / kern, 0, 0
    if name in ("compile_cold", "compile_warm"):
        if w.get("pch") == "off":
            return None  # CuPy has no PCH switch: one cold row (pch=on) compares
        return compile_cupy(w), 0, 0
    raise SystemExit(f"bench.py: unknown workload {name!r}")


def compile_cupy(w):
    """CuPy RawModule on the same .cu sources libgpu embeds (bench/kernels/),
    host milliseconds per source: cold = empty disk cache and no in-memory
    cache (pch=on/off has no CuPy counterpart: both rows compile plainly);
    warm = disk cache hit plus module load."""
    import glob
    import shutil
    import tempfile
    import time

    import cupy
    from cupy.cuda import compiler

    kdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels")
    srcs = sorted(glob.glob(os.path.join(kdir, "*.cu")))
    opts = ("-std=c++17", "-I" + kdir)
    cache = tempfile.mkdtemp(prefix="cupy-cache-")
    os.environ["CUPY_CACHE_DIR"] = cache
    os.environ["CUPY_CACHE_IN_MEMORY"] = "0"

    nonce = [0]

    def load(path, fresh=False):
        with open(path) as f:
            code = f.read()
        if fresh:  # a new comment changes every cache key: a true cold compile
            nonce[0] += 1
            code += f"\n// cold {os.getpid()} {nonce[0]}\n"
        mod = cupy.RawModule(code=code, options=opts)
        mod.compile()
        return mod

    # NVRTC's own start-up (loading libnvrtc and its builtins) is outside the
    # timing on both sides: compile one throwaway kernel first.
    warm = cupy.RawModule(code='extern "C" __global__ void w(float* p) { p[0] = 1; }', options=opts)
    warm.compile()
    try:
        if w["name"] == "compile_cold":
            t0 = time.perf_counter()
            for s in srcs:
                shutil.rmtree(cache, ignore_errors=True)
                os.makedirs(cache, exist_ok=True)
                load(s, fresh=True)
            return (time.perf_counter() - t0) * 1e3 / len(srcs)
        for s in srcs:
            load(s)
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            for s in srcs:
                load(s)
        return (time.perf_counter() - t0) * 1e3 / (reps * len(srcs))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main():
    spec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads.json")
    with open(spec) as f:
        wl = json.load(f)["workloads"]
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for w in wl:
        if only and only not in key(w):
            continue
        got = run(w, gen)
        if got is None:
            continue
        ms, flops, nbytes = got
        print(json.dumps({"impl": "ref", "key": key(w), "ms": ms, "flops": flops, "bytes": nbytes,
                          "device": torch.cuda.get_device_name()}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
