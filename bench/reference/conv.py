#!/usr/bin/env python3
"""PyTorch (cuDNN) side of bench/conv.sh.

Times 3×3, stride-1, padding-1 bf16 convolutions in channels-last layout
(cuDNN's fast path on Hopper) at the shapes of gpukit's BenchmarkConv2D
(libgpu/ops/cuda_unet_test.go): the forward with bias, and the backward
(input and weight gradients, aten.convolution_backward, as gpukit's
Conv2DBackward without the bias gradient). torch.backends.cudnn.benchmark
is on, so cuDNN picks its fastest algorithm per shape during the warm-up.
Each figure is the median over REPEATS of ITERS launches between two CUDA
events after WARMUP launches (METHOD.md). One JSON line per shape and pass:
{"shape": "NxHxWxCINtoCOUT", "pass": "fwd"|"bwd", "impl": "cudnn",
"ms": ..., "TFLOP/s": ...}, where a pass's useful work is 2·P·K·Cout
flops (×2 for the backward), P = N·H·W, K = 9·Cin.

usage: conv.py [--shapes NxHWxCINxCOUT,...] [--iters N] [--repeats R]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

SHAPES = [(512, 32, 64, 64), (512, 32, 192, 64), (512, 16, 384, 128), (512, 8, 256, 256),
          (16, 64, 320, 320), (16, 32, 640, 640), (64, 32, 256, 256), (128, 32, 128, 128)]


def timed(fn, iters, repeats, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / iters)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", help="comma-separated N x HW x Cin x Cout, e.g. 16x64x320x320 (default: gpukit's list)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    for n, hw, cin, cout in shapes:
        g = torch.Generator(device=dev).manual_seed(1)
        x = torch.randn(n, cin, hw, hw, device=dev, generator=g).to(torch.bfloat16, memory_format=torch.channels_last)
        w = (torch.randn(cout, cin, 3, 3, device=dev, generator=g) / (9 * cin) ** 0.5).to(
            torch.bfloat16, memory_format=torch.channels_last)
        b = torch.randn(cout, device=dev, generator=g).to(torch.bfloat16)
        dy = torch.randn(n, cout, hw, hw, device=dev, generator=g).to(torch.bfloat16, memory_format=torch.channels_last)
        flops = 2 * n * hw * hw * 9 * cin * cout
        fwd = lambda: F.conv2d(x, w, b, padding=1)
        bwd = lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                          [True, True, False])
        for name, fn, work in (("fwd", fwd, flops), ("bwd", bwd, 2 * flops)):
            with torch.no_grad():
                ms = timed(fn, args.iters, args.repeats)
            print(json.dumps({"shape": f"{n}x{hw}x{hw}x{cin}to{cout}", "pass": name, "impl": "cudnn", "ms": round(ms, 4),
                              "TFLOP/s": round(work / ms / 1e9, 1)}), flush=True)


if __name__ == "__main__":
    main()
