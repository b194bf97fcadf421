#!/usr/bin/env python3
"""Regenerates the measured tables of BENCHMARKS.md from bench/results.

    python3 bench/render.py [BENCHMARKS.md]

Each table sits between `<!-- BEGIN name -->` and `<!-- END name -->`; the
prose around them is written by hand. For every table the newest result file
of its kind is used (file names start with the date):

    core      results/*-core.json            (bench/run.sh via report.py)
    compile   results/*-compile.json         (bench/run.sh compile)
    trainer   results/*-trainstep.jsonl      (bench/reference/trainstep.sh)
    fuse      results/*-fuse-backward.jsonl  (gpukit-trainbench with and without --fuse-backward)
    pool      results/*-pool.jsonl           (gpukit-poolbench)
    trace     results/*-trace-overhead.jsonl (bench/reference/trace_overhead.sh)
"""
import glob
import json
import os
import re
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import report  # noqa: E402

SHAPES = [("784-256-256-10", 256), ("784-1024-1024-10", 1024), ("784-4096-4096-10", 4096)]
PEAK = {"tf32": 494.5e12, "bf16": 989.5e12, "f32": 67e12}  # ops.PeakFLOPS, H200 SXM


def newest(pattern):
    files = sorted(glob.glob(os.path.join(here, "results", pattern)))
    if not files:
        sys.exit(f"render.py: no results/{pattern}")
    return files[-1]


def jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.startswith("{")]


def core():
    r = json.load(open(newest("*-core.json")))
    r["rows"] = [x for x in r["rows"] if not x["key"].startswith("compile")]
    return report.table(r)


def compile_table():
    r = json.load(open(newest("*-compile.json")))
    out = ["| workload | gpukit ms per source | CuPy RawModule ms per source | ratio (CuPy/gpukit) |",
           "| --- | ---: | ---: | ---: |"]
    for x in r["rows"]:
        g, t = x.get("gpukit_ms"), x.get("ref_ms")
        out.append(f"| {x['key']} | {g:.3f} | {'' if t is None else f'{t:.3f}'} | {'' if t is None else f'{t / g:.2f}'} |")
    return "\n".join(out)


def trainer():
    rows = jsonl(newest("*-trainstep.jsonl"))
    med = {}
    for x in rows:
        med.setdefault((x["impl"], x["key"]), []).append(x["ms"])
    m = lambda impl, key: statistics.median(med[(impl, key)])  # noqa: E731
    out = ["| precision | MLP, batch | gpukit graph ms | gpukit eager ms | GEMMs alone ms | PyTorch eager ms | "
           "PyTorch graph ms | torch.compile ms | PyTorch graph / gpukit graph | PyTorch eager / gpukit graph | "
           "gpukit graph / GEMMs | MFU (graph) |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for prec in ("tf32", "bf16", "f32"):
        for w, b in SHAPES:
            base = f"trainstep widths={w} batch={b} prec={prec} mode="
            if ("gpukit", base + "graph") not in med:
                continue
            g, e, ge = m("gpukit", base + "graph"), m("gpukit", base + "eager"), m("gpukit", base + "gemm")
            te, tg, tc = m("torch", base + "eager"), m("torch", base + "graph"), m("torch", base + "compile")
            flops = next(x["flops"] for x in rows if x["key"] == base + "graph")
            mfu = flops / (g * 1e-3) / PEAK[prec]
            out.append(f"| {prec} | {w}, {b} | {g:.3f} | {e:.3f} | {ge:.3f} | {te:.3f} | {tg:.3f} | {tc:.3f} | "
                       f"{tg / g:.2f}× | {te / g:.1f}× | {g / ge:.2f} | {mfu * 100:.1f}% |")
    return "\n".join(out)


def fuse():
    med = {}
    for x in jsonl(newest("*-fuse-backward.jsonl")):
        med.setdefault(x["key"], []).append(x["ms"])
    out = ["| MLP, batch (tf32, graph) | fused chain ms | per-layer backward ms |", "| --- | ---: | ---: |"]
    for w, b in SHAPES:
        k = f"trainstep widths={w} batch={b} prec=tf32 mode=graph"
        out.append(f"| {w}, {b} | {statistics.median(med[k]):.3f} | {statistics.median(med['NOCHAIN ' + k]):.3f} |")
    return "\n".join(out)


def pool():
    p = {x["bench"]: x for x in jsonl(newest("*-pool.jsonl"))}
    af, fm, la, zc, cc = p["alloc_free"], p["first_map"], p["local_alloc"], p["zero_copy"], p["concurrent"]
    met = lambda ok: "met" if ok else "**not met**"  # noqa: E731
    return "\n".join([
        "| bench | p50 | p99 | other | target |",
        "| --- | ---: | ---: | --- | --- |",
        f"| alloc_free (alloc round trip + free) | {af['p50_us']:.1f} µs | {af['p99_us']:.1f} µs | | p50 ≤ 20 µs: {met(af['p50_us'] <= 20)} |",
        f"| first_map (first alloc of a new client: fd, import, map) | {fm['p50_us']:.0f} µs | {fm['p99_us']:.0f} µs | {fm.get('note', '')} | ≈ 0.2 ms |",
        f"| local_alloc (in-process cuMemAlloc+cuMemFree, 4 KiB) | {la['p50_us']:.1f} µs | {la['p99_us']:.1f} µs | the comparison | |",
        f"| zero_copy (1 GiB written by one process, read by another) | | | {zc['gb_per_s'] / 1000:.2f} TB/s vs "
        f"{zc['ref_gb_per_s'] / 1000:.2f} TB/s D2D in the same run: ratio {zc['ratio']:.3f} | ≥ 0.95: {met(zc['ratio'] >= 0.95)} |",
        f"| concurrent (8 client processes) | {cc['p50_us']:.1f} µs | {cc['p99_us']:.1f} µs | {cc['ops_per_s']:,.0f} alloc+free/s | |",
    ])


def trace():
    rows = jsonl(newest("*-trace-overhead.jsonl"))
    out = ["| mode | step ms, tracing off (median of 5) | step ms, tracing on | overhead | target |",
           "| --- | ---: | ---: | ---: | --- |"]
    for mode, target in (("graph", 1), ("eager", 5)):
        off = statistics.median([x["step_ms"] for x in rows if x["mode"] == mode and x["tracing"] == "off"])
        on = statistics.median([x["step_ms"] for x in rows if x["mode"] == mode and x["tracing"] == "on"])
        over = 100 * (on - off) / off
        out.append(f"| {mode} | {off:.4f} | {on:.4f} | {over:+.2f}% | ≤ {target}%: {'met' if over <= target else 'not met'} |")
    return "\n".join(out)


TABLES = {"core": core, "compile": compile_table, "trainer": trainer, "fuse": fuse, "pool": pool, "trace": trace}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "BENCHMARKS.md")
    doc = open(path).read()
    for name, fn in TABLES.items():
        pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(\n<!-- END {name} -->)", re.S)
        if not pat.search(doc):
            sys.exit(f"render.py: {path} has no <!-- BEGIN {name} --> block")
        doc = pat.sub(lambda mt: mt.group(1) + fn() + mt.group(2), doc)
    open(path, "w").write(doc)


if __name__ == "__main__":
    main()
