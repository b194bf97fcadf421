#!/usr/bin/env bash
# train-fashion-traced.sh — train-fashion.sh under `tracer record`: one
# timeline of the pool daemon, the trainer and the GPU, in a file that opens
# in Perfetto (https://ui.perfetto.dev) or chrome://tracing, then a report.
#
#   tracer record --out TRACE -- train-fashion.sh  →  tracer report --check TRACE
#
# Environment: everything train-fashion.sh reads (GPUKIT_BIN, DATA, OUT,
# EPOCHS, LIMIT, MIN_ACCURACY, POOL_TIMEOUT), and
#   TRACE      trace file (${OUT:-${TMPDIR:-/tmp}/gpukit-train-fashion}/trace.json), replaced
#   TRACE_MAX  size cap of the trace file (1G)
# The report (top spans, GPU busy fraction, per-step breakdown) goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${GPUKIT_BIN:-./bin}
out=${OUT:-${TMPDIR:-/tmp}/gpukit-train-fashion}
trace=${TRACE:-$out/trace.json}
[ -x "$bin/tracer" ] || { echo "train-fashion-traced: $bin/tracer not found (build with make build, or set GPUKIT_BIN)" >&2; exit 1; }
mkdir -p "$(dirname "$trace")"

"$bin/tracer" record --out "$trace" --force --max-size "${TRACE_MAX:-1G}" -- bash "$here/train-fashion.sh"
"$bin/tracer" report --check "$trace" >&2
echo "train-fashion-traced: trace in $trace (open it in https://ui.perfetto.dev)" >&2
