#!/usr/bin/env python3
"""Summarises side-by-side benchmark rounds (render.py puts the tables in BENCHMARKS.md).

    report.py --out DIR gpukit.jsonl ref.jsonl   # table + DIR/<date>-<gpu>.json

Each input line: {"impl", "key", "ms" (per launch), "flops", "bytes", "device"}.
Per workload and impl the median over rounds is taken. ratio = reference_ms /
gpukit_ms (above 1: gpukit is faster). The floor is max(flops / peak,
bytes / bandwidth) with bandwidth from the "copy" workload (bytes read plus
written) and peak from the fastest measured GEMM of the same dtype, both
measured in the same run.
"""
import argparse
import datetime
import json
import os
import statistics
import sys


def load(paths):
    rows = {}
    device = "unknown"
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                device = r.get("device", device)
                rows.setdefault((r["key"], r["impl"]), []).append(r)
    return rows, device


def summarise(rows, device):
    keys = []
    for k, _ in rows:
        if k not in keys:
            keys.append(k)
    med = {}
    for (k, impl), rs in rows.items():
        med[(k, impl)] = (statistics.median(r["ms"] for r in rs), rs[0]["flops"], rs[0]["bytes"], len(rs))
    bw = None
    if ("copy bytes=4294967296", "ref") in med:
        ms, _, b, _ = med[("copy bytes=4294967296", "ref")]
        bw = b / (ms * 1e-3)
    peak = {}
    for (k, impl), (ms, fl, _, _) in med.items():
        if k.startswith("gemm") and fl:
            dt = k.split()[1].split("=")[1]
            peak[dt] = max(peak.get(dt, 0), fl / (ms * 1e-3))
    out = []
    for k in keys:
        g = med.get((k, "gpukit"))
        t = med.get((k, "ref"))
        row = {"key": k}
        for name, m in (("gpukit", g), ("ref", t)):
            if m:
                row[name + "_ms"] = m[0]
                row["rounds"] = m[3]
                if m[1]:
                    row[name + "_tflops"] = m[1] / (m[0] * 1e-3) / 1e12
                if m[2] and k.startswith("copy"):
                    row[name + "_tbps"] = m[2] / (m[0] * 1e-3) / 1e12
        if g and t:
            row["ratio"] = t[0] / g[0]
        m = g or t
        dt = next((p.split("=")[1] for p in k.split() if p.startswith("dtype=")), None)
        floor = 0.0
        if m and m[1] and dt in peak:
            floor = max(floor, m[1] / peak[dt] * 1e3)
        if m and m[2] and bw:
            floor = max(floor, m[2] / bw * 1e3)
        if floor:
            row["floor_ms"] = floor
        out.append(row)
    return {
        "date": datetime.date.today().isoformat(),
        "device": device,
        "bandwidth_tbps": bw / 1e12 if bw else None,
        "peak_tflops": {k: v / 1e12 for k, v in peak.items()},
        "rows": out,
    }


def fmt(v, p=3):
    return "" if v is None else f"{v:.{p}f}"


def table(res):
    lines = [
        f"Measured on {res['device']}, {res['date']}; copy bandwidth {fmt(res['bandwidth_tbps'], 2)} TB/s (read+write); "
        + "GEMM peak " + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in sorted(res["peak_tflops"].items())) + ".",
        "",
        "| workload | gpukit ms | reference ms | ratio (reference/gpukit) | gpukit TFLOP/s | reference TFLOP/s | floor ms | gpukit/floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in res["rows"]:
        g, t, fl = r.get("gpukit_ms"), r.get("ref_ms"), r.get("floor_ms")
        p = 4 if (g or t or 1) < 0.1 else 3
        lines.append(
            f"| {r['key']} | {fmt(g, p)} | {fmt(t, p)} | {fmt(r.get('ratio'), 2)} | {fmt(r.get('gpukit_tflops'), 0)} | "
            f"{fmt(r.get('ref_tflops'), 0)} | {fmt(fl, p)} | {fmt(g / fl if g and fl else None, 2)} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    rows, device = load(a.files)
    res = summarise(rows, device)
    print(table(res))
    if a.out:
        gpu = device.replace(" ", "-").replace("/", "-")
        path = os.path.join(a.out, f"{res['date']}-{gpu}.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", path)


if __name__ == "__main__":
    main()
