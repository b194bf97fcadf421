#!/usr/bin/env python3
"""bench/conv.sh's parsing and table.

conv_table.py go     reads `go test -bench BenchmarkConv2D` output and
                     prints one JSON line per sub-benchmark
                     ({"shape", "pass", "impl": "gpukit-<path>", "ms",
                     "TFLOP/s"});
conv_table.py table  reads those lines and conv.py's and prints a
                     Markdown table: TFLOP/s of each gpukit path (mma:
                     mma.sync; wg: wgmma, the default; ws: wgmma
                     warp-specialised; tma: ws with TMA loads; im2col) and
                     of cuDNN per shape and pass, and the wgmma paths over
                     cuDNN.
"""
import json
import re
import sys

LINE = re.compile(r"^BenchmarkConv2D/(\S+?)/(fwd|bwd)/(\w+)(?:-\d+)?\s+\d+\s+(.*)$")


def go():
    for l in sys.stdin:
        m = LINE.match(l.strip())
        if not m:
            continue
        d = {"shape": m.group(1), "pass": m.group(2), "impl": "gpukit-" + m.group(3)}
        f = m.group(4).split()
        for v, u in zip(f[::2], f[1::2]):
            if u in ("ms/op", "TFLOP/s"):
                d["ms" if u == "ms/op" else u] = float(v)
        print(json.dumps(d), flush=True)


def table():
    rows, impls = {}, ["gpukit-mma", "gpukit-wg", "gpukit-ws", "gpukit-im2col", "cudnn"]
    for l in sys.stdin:
        d = json.loads(l)
        rows.setdefault((d["shape"], d["pass"]), {})[d["impl"]] = d["TFLOP/s"]
    print("| shape (N×H×W×Cin→Cout, 3×3) | pass | " + " | ".join(impls) + " | mma / cuDNN | wg / cuDNN | ws / cuDNN | tma / cuDNN |")
    print("| --- | --- |" + " ---: |" * (len(impls) + 4))
    for (shape, p), r in rows.items():
        cells = [f"{r[i]:.1f}" if i in r else "–" for i in impls]
        ratios = [f"{r[i] / r['cudnn']:.2f}" if i in r and r.get("cudnn") else "–" for i in ("gpukit-mma", "gpukit-wg", "gpukit-ws", "gpukit-tma")]
        print(f"| {shape} | {p} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    {"go": go, "table": table}[sys.argv[1]]()
