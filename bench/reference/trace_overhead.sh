#!/usr/bin/env bash
# Trainer step time with tracing on vs off, on a GPU machine (issue 7's
# target: overhead <= 1% with --graph on, <= 5% with --graph off).
#
# For each mode (graph, eager) and each of ROUNDS rounds, runs the same
# `trainer run` twice, alternating which goes first: plainly, and under
# `tracer record` (host spans per step and phase, a GPU span per graph
# replay or per eager phase). A run's step time is the median step_ms of its
# loss lines, the first one left out (it holds kernel compilation and graph
# capture); evaluation is not in step_ms. Prints one JSON line per run, then
# per mode the median over rounds with tracing off and on and the overhead.
#
#   usage: trace_overhead.sh            (from the GPU bundle: bench/reference/)
# Environment:
#   GPUKIT_BIN    directory with trainer and tracer (default: the bundle's bin/)
#   DATA          Fashion-MNIST directory ($GPUKIT_DATA_DIR or /usr/share/datasets/fashion-mnist)
#   ROUNDS (5) EPOCHS (2) WIDTHS (784,1024,1024,10) BATCH (128) LOG_EVERY (100) MODES (graph eager)
#   DEVICE (cuda; host only to try the script: --graph is a no-op there)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${GPUKIT_BIN:-$here/../../bin}
data=${DATA:-${GPUKIT_DATA_DIR:-/usr/share/datasets/fashion-mnist}}
rounds=${ROUNDS:-5}
for b in trainer tracer; do
	[ -x "$bin/$b" ] || { echo "trace_overhead: $bin/$b not found (set GPUKIT_BIN)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/cache}
unset GPUKIT_TRACE

# one MODE TRACING ROUND: a run; prints its JSON line
one() {
	local mode=$1 tracing=$2 round=$3 graph=on
	[ "$mode" = eager ] && graph=off
	local args=(run --device "${DEVICE:-cuda}" --graph "$graph" --data "$data" --out "$work/run" --epochs "${EPOCHS:-2}"
		--widths "${WIDTHS:-784,1024,1024,10}" --batch "${BATCH:-128}" --log-every "${LOG_EVERY:-100}")
	if [ "$tracing" = on ]; then
		"$bin/tracer" record --out "$work/trace.json" -- "$bin/trainer" "${args[@]}" >"$work/out.jsonl" 2>"$work/err"
	else
		"$bin/trainer" "${args[@]}" >"$work/out.jsonl" 2>"$work/err"
	fi || { echo "trace_overhead: trainer run (tracing $tracing, --graph $graph) failed: $(tail -n3 "$work/err")" >&2; exit 1; }
	if grep -q "events dropped" "$work/err"; then
		echo "trace_overhead: $(grep "events dropped" "$work/err")" >&2
	fi
	python3 - "$mode" "$tracing" "$round" "$work/out.jsonl" <<'PY'
import json, statistics, sys
mode, tracing, rnd, path = sys.argv[1:]
ms = [l["step_ms"] for l in map(json.loads, open(path)) if "step_ms" in l][1:]
if not ms:
    sys.exit("trace_overhead: no step_ms lines after the first (raise EPOCHS or lower LOG_EVERY)")
print(json.dumps({"mode": mode, "tracing": tracing, "round": int(rnd), "step_ms": round(statistics.median(ms), 4), "intervals": len(ms)}))
PY
}

for mode in ${MODES:-graph eager}; do
	for r in $(seq "$rounds"); do
		order="off on"
		[ $((r % 2)) = 0 ] && order="on off"
		for tracing in $order; do
			one "$mode" "$tracing" "$r" | tee -a "$work/all.jsonl"
		done
	done
done

python3 - "$work/all.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("\n| mode | step ms, tracing off | step ms, tracing on | overhead | target |")
print("| --- | --- | --- | --- | --- |")
for mode, target in (("graph", 1.0), ("eager", 5.0)):
    off = [r["step_ms"] for r in runs if r["mode"] == mode and r["tracing"] == "off"]
    on = [r["step_ms"] for r in runs if r["mode"] == mode and r["tracing"] == "on"]
    if not off or not on:
        continue
    a, b = statistics.median(off), statistics.median(on)
    print(f"| {mode} | {a:.4f} | {b:.4f} | {100 * (b / a - 1):+.2f}% | <= {target:g}% |")
PY
