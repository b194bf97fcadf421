#!/usr/bin/env python3
"""PyTorch side of the training-step benchmark (bench/cmd/gpukit-trainbench).

One step of an MLP classifier, 784-H-H-10 with ReLU: forward, cross-entropy,
backward and AdamW, on random data that stays on the GPU, for the shapes
784-256-256-10 batch 256, 784-1024-1024-10 batch 1024, 784-4096-4096-10
batch 4096, in three modes:

  eager    zero_grad, forward, loss, backward, optimizer.step (foreach AdamW)
  graph    the same step captured once with torch.cuda.graph (AdamW with
           capturable=True, gradients kept, static input) and replayed
  compile  torch.compile(model) with the eager optimizer (a note line is
           printed instead when compilation fails, e.g. without a compiler)

Each line: {"impl": "torch", "key", "ms" (median per step over --repeats),
"flops", "bytes": 0, "device", "mfu" (omitted), "repeats_ms"}. Keys and
FLOPs match gpukit-trainbench's.

  trainstep.py [--precision tf32[,f32,bf16]] [--modes eager,graph,compile] [--repeats 7]
  trainstep.py --report gpukit.jsonl torch.jsonl   # markdown table of medians
"""
import argparse
import json
import statistics
import sys

SHAPES = [([784, 256, 256, 10], 256), ([784, 1024, 1024, 10], 1024), ([784, 4096, 4096, 10], 4096)]


def key(widths, batch, prec, mode):
    return f"trainstep widths={'-'.join(map(str, widths))} batch={batch} prec={prec} mode={mode}"


def step_flops(widths, batch):
    """GEMM FLOPs of one step: forward and weight gradient per layer, input
    gradient for every layer but the first (as nn.MLPStepFLOPs)."""
    f = 0.0
    for i in range(len(widths) - 1):
        mnk = 2.0 * batch * widths[i] * widths[i + 1]
        f += 2 * mnk + (mnk if i > 0 else 0)
    return f


def bench(widths, batch, prec, mode, repeats):
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.manual_seed(1)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(batch, widths[0], device="cuda")
    y = torch.randint(0, widths[-1], (batch,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=(mode == "graph"))
    fwd = torch.compile(model) if mode == "compile" else model

    def step():
        opt.zero_grad(set_to_none=(mode != "graph"))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
            logits = fwd(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()

    fn = step
    if mode == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        fn = g.replay

    def once(iters):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / iters

    for _ in range(3):
        fn()
    warm = once(10)
    iters = max(20, int(20 / max(warm, 1e-3)))
    return [once(iters) for _ in range(repeats)]


def report(paths):
    rows = {}
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.startswith("{"):
                    r = json.loads(line)
                    if "ms" in r:
                        rows.setdefault((r["key"].rsplit(" mode=", 1)[0], r["impl"], r["key"].rsplit("=", 1)[1]), []).append(r)
    shapes = []
    for (s, _, _) in rows:
        if s not in shapes:
            shapes.append(s)
    cols = [("gpukit", "graph"), ("gpukit", "eager"), ("gpukit", "gemm"), ("torch", "eager"), ("torch", "graph"), ("torch", "compile")]
    print("| shape | " + " | ".join(f"{i} {m} ms" for i, m in cols) + " | gpukit graph MFU | torch graph / gpukit graph | gpukit graph / GEMM floor |")
    print("|" + "---|" * (len(cols) + 4))
    for s in shapes:
        med = {c: statistics.median(r["ms"] for r in rows[(s, *c)]) for c in cols if (s, *c) in rows}
        cells = [f"{med[c]:.3f}" if c in med else "–" for c in cols]
        g = rows.get((s, "gpukit", "graph"))
        mfu = f"{statistics.median(r.get('mfu', 0) for r in g):.1%}" if g and g[0].get("mfu") else "–"
        ratio = f"{med[('torch', 'graph')] / med[('gpukit', 'graph')]:.2f}×" if ("torch", "graph") in med and ("gpukit", "graph") in med else "–"
        floor = f"{med[('gpukit', 'graph')] / med[('gpukit', 'gemm')]:.2f}" if ("gpukit", "gemm") in med and ("gpukit", "graph") in med else "–"
        print(f"| {s.replace('trainstep ', '')} | " + " | ".join(cells) + f" | {mfu} | {ratio} | {floor} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--modes", default="eager,graph,compile")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--report", nargs="+", metavar="JSONL")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        return
    import torch

    dev = torch.cuda.get_device_name()
    for prec in a.precision.split(","):
        for widths, batch in SHAPES:
            for mode in a.modes.split(","):
                k = key(widths, batch, prec, mode)
                try:
                    rs = bench(widths, batch, prec, mode, max(a.repeats, 5))
                except Exception as e:  # torch.compile without a compiler, out of memory, ...
                    print(json.dumps({"impl": "torch", "key": k, "note": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                      "device": dev}), flush=True)
                    torch.cuda.empty_cache()
                    continue
                print(json.dumps({"impl": "torch", "key": k, "ms": statistics.median(rs), "flops": step_flops(widths, batch),
                                  "bytes": 0, "device": dev, "repeats_ms": rs}), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
