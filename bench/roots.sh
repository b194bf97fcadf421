#!/usr/bin/env bash
# bench/roots.sh — issue 13's inverse-root benchmark on a GPU machine:
# (A + r·I)^(-1/4) of Wishart matrices of order 1024, 4096 and a batch of 64
# of order 512 (ridge 1e-6, 1e-4 and 2e-3 times ‖A‖_F) by gpukit's batched
# Newton iteration (newton-auto: as an optimizer runs it on a TF32 engine,
# full f32 products below ops.NewtonTF32MinRelEps = 2e-3 and TF32 from it;
# newton-tf32: TF32 forced below it; newton-f32) and cuSOLVER
# eigendecomposition (libgpu/ops BenchmarkInverseRoot), and by
# torch.linalg.eigh (bench/reference/roots.py), in one run; then the
# table: each method's median ms, its ratio to torch's eigh route (target
# ≤ 0.25 for Newton), its relative error against the float64
# eigendecomposition, its largest residual and how many matrices it
# rejected. JSON lines on stdout and in $BENCH_OUT/roots.jsonl. Also the
# optimizer service's round trip (optimizer BenchmarkServiceStepGPU:
# target p50 ≤ 30 µs) unless ROOTS_ONLY=1.
#
# usage: bench/roots.sh     (inside the GPU bundle, or a source tree whose
#                            tests/ holds the go test -c binaries)
#   BENCHTIME=10x (calls per Go benchmark), ROOTS_ITERS=10 (torch's), ROOTS_ONLY=1
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export GPUKIT_REQUIRE_GPU=1
export GPUKIT_BIN=${GPUKIT_BIN:-$root/bin}
ops=$root/tests/libgpu_ops.test
[ -x "$ops" ] || { echo "roots.sh: no $ops (make gpu-bundle)" >&2; exit 1; }
# Each step's failure is reported and the next one runs: what finished is
# kept.
(cd "$root/tests/libgpu_ops.d" && "$ops" -test.run '^$' -test.bench 'InverseRoot' -test.benchtime "${BENCHTIME:-10x}") |
	grep --line-buffered -E '^(Benchmark|---|panic|\s+cuda_)' >"$out/roots-go.txt" || echo "roots.sh: the Go benchmark failed" >&2
python3 "$here/reference/roots.py" --iters "${ROOTS_ITERS:-10}" >"$out/roots-torch.jsonl" || echo "roots.sh: roots.py failed" >&2
python3 - "$out/roots-go.txt" "$out/roots-torch.jsonl" <<'PY' | tee -a "$out/roots.jsonl"
import json, math, re, sys
torch = [json.loads(l) for l in open(sys.argv[2])]
base = {(t["batch"], t["n"], t["releps"]): t["ms"] for t in torch if t["impl"] == "torch-eigh"}
for t in torch:
    print(json.dumps(t))
for line in open(sys.argv[1]):
    m = re.match(r"BenchmarkInverseRoot/batch=(\d+),n=(\d+)/releps=([0-9e.+-]+)/(\S+?)(-\d+)?\s", line)
    if not m:
        continue
    batch, n, releps, method = int(m[1]), int(m[2]), float(m[3]), m[4]
    metrics = {u: float(v) for v, u in re.findall(r"([0-9.e+-]+|NaN|[+-]Inf) (ms/call|rel_err|iters|resid|failed)", line)}
    fin = lambda k: metrics[k] if k in metrics and math.isfinite(metrics[k]) else None  # noqa: E731
    row = {"workload": "inverse-root", "impl": "gpukit-" + method, "batch": batch, "n": n, "releps": releps,
           "ms": fin("ms/call"), "rel_err": fin("rel_err"), "resid": fin("resid"), "failed": fin("failed"),
           "iters": fin("iters")}
    b = base.get((batch, n, releps))
    if b and row["ms"]:
        row["over_torch_eigh"] = round(row["ms"] / b, 4)
    print(json.dumps(row))
PY
opt=$root/tests/optimizer.test
if [ "${ROOTS_ONLY:-0}" != 1 ] && [ -x "$opt" ]; then
	(cd "$root/tests/optimizer.d" && "$opt" -test.run '^$' -test.bench 'ServiceStepGPU' -test.benchtime 5000x) |
		grep -E '^(Benchmark|---|panic)' | python3 -c '
import json, re, sys
for l in sys.stdin:
    m = re.match(r"BenchmarkServiceStep(\w+?)(-\d+)?\s", l)
    if not m:
        print(json.dumps({"workload": "service-round-trip", "error": l.strip()}))
        continue
    row = {"workload": "service-round-trip", "pool": m[1].lower()}
    for v, u in re.findall(r"([0-9.e+-]+) (\w+_us)", l):
        row[u] = float(v)
    if "overhead_p50_us" in row:
        row["target_p50_us"], row["met"] = 30, row["overhead_p50_us"] <= 30
    print(json.dumps(row))
' | tee -a "$out/roots.jsonl" || echo "roots.sh: the service benchmark failed" >&2
fi
echo "roots.sh: results in $out/roots.jsonl" >&2
