#!/usr/bin/env python3
"""PyTorch reference for gpukit's inverse matrix roots
(libgpu/ops BenchmarkInverseRoot): (A + r·I)^(-1/4) of Wishart matrices
A = G·Gᵀ/n (G of N(0, 1) draws) with the ridge r = releps·‖A‖_F, for one
matrix of order 1024, one of 4096 and a batch of 64 of order 512, by

  eigh          torch.linalg.eigh (f32) and V·diag((max(λ, 0) + r)^(-1/4))·Vᵀ,
                the route the issue's baseline times (Shampoo's usual root)
  eigh-f64      the same in float64, the reference every error is against
                (decomposed once per matrix; not timed)
  newton-tf32   the coupled Newton iteration of libgpu/ops (Guo & Higham
                2006 with Anil et al. 2020's scaling), written from the
                formula in torch with TF32 matmuls, as many iterations as
                gpukit's NewtonIters gives, for comparison

for ridges releps·‖A‖_F with releps 1e-6, 1e-4 and 2e-3 (gpukit's
NewtonTF32MinRelEps), and prints one JSON line per (shape, releps,
method): the median time per call in ms (CUDA events around each call,
after warm-up) and the relative Frobenius error against eigh-f64 (the
largest over the batch; null where it is not finite), with the keys of
gpukit's benchmark (batch, n, releps, method).

  roots.py [--iters 10] [--device cuda]

Needs torch (numpy not needed).
"""
import argparse
import json
import math

import torch


def wishart(batch, n, gen, device):
    g = torch.randn(batch, n, n, generator=gen, device=device, dtype=torch.float32)
    return g @ g.transpose(-1, -2) / n


def ridge(a, releps):
    return releps * torch.linalg.matrix_norm(a, ord="fro", dim=(-2, -1))


def eigh_root(a, releps, p=4, wv=None):
    r = ridge(a, releps)
    w, v = torch.linalg.eigh(a) if wv is None else wv
    f = (w.clamp_min(0) + r[..., None]).pow(-1.0 / p)
    return (v * f[..., None, :]) @ v.transpose(-1, -2)


def newton_iters(p, releps, n):
    """gpukit's ops.NewtonIters: the scalar recurrence of M's eigenvalues."""
    f = lambda m: ((p + 1 - m) / p) ** p * m  # noqa: E731
    lo, hi = (p + 1) * releps / (2 * (1 + releps * math.sqrt(n))), (p + 1) / 2
    k = 0
    while k < 100 and (1 - lo > 1e-6 or abs(hi - 1) > 1e-6):
        a, b = f(lo), f(hi)
        lo, hi = min(a, b), max(a, b)
        k += 1
    return k


def newton_root(a, releps, iters, p=4):
    n = a.shape[-1]
    eye = torch.eye(n, device=a.device, dtype=a.dtype)
    r = ridge(a, releps)
    ar = a + r[..., None, None] * eye
    z = (p + 1) / (2 * torch.linalg.matrix_norm(ar, ord="fro", dim=(-2, -1)))
    x = z[..., None, None] ** (1.0 / p) * eye.expand_as(a)
    m = z[..., None, None] * ar
    for _ in range(iters):
        t = ((p + 1) * eye - m) / p
        x = x @ t
        t2 = t @ t
        m = (t2 @ t2) @ m
    return (x + x.transpose(-1, -2)) / 2


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ms.append(s.elapsed_time(e))
    ms.sort()
    return ms[len(ms) // 2]


def relerr(x, ref):
    d = torch.linalg.matrix_norm((x.double() - ref), ord="fro", dim=(-2, -1))
    e = (d / torch.linalg.matrix_norm(ref, ord="fro", dim=(-2, -1))).max().item()
    return e if math.isfinite(e) else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    gen = torch.Generator(device=a.device).manual_seed(5)
    dev = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    for batch, n in [(1, 1024), (1, 4096), (64, 512)]:
        mat = wishart(batch, n, gen, a.device)
        wv64 = torch.linalg.eigh(mat.double())
        for releps in (1e-6, 1e-4, 2e-3):
            ref = eigh_root(mat.double(), releps, wv=wv64)
            it = newton_iters(4, releps, n)
            cases = {"eigh": lambda: eigh_root(mat, releps)}
            if a.device == "cuda":
                cases["newton-tf32"] = lambda: newton_root(mat, releps, it)
            for name, fn in cases.items():
                torch.backends.cuda.matmul.allow_tf32 = name == "newton-tf32"
                ms = timed(fn, 2, a.iters) if a.device == "cuda" else None
                out = {"workload": "inverse-root", "impl": "torch-" + name, "batch": batch, "n": n,
                       "releps": releps, "ms": ms, "rel_err": relerr(fn(), ref), "device": dev}
                if name == "newton-tf32":
                    out["iters"] = it
                print(json.dumps(out), flush=True)
            torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
