#!/usr/bin/env bash
# scripts/gpu-par.sh (par.sh in the GPU bundle) — runs the bundle's GPU
# tests in parallel on a GPU machine: every test binary's list (tests/NAME.d/TESTS, or GPUKIT_TEST_RUN's
# names for every binary) split round-robin into shards of at most
# GPUKIT_PAR_SIZE tests (default 6), each shard one process, all at once,
# sharing the kernel cache (writes are atomic renames). The GPU is shared,
# so this is for pass/fail, never for timings. Each shard's log goes to
# LOGDIR/NAME.SHARD.log; the last line is "N passed, N failed".
#
# usage: bash build/gpu/run.sh par.sh [LOGDIR]   (default: logs/ in the bundle)
#   GPUKIT_PAR_TIMEOUT  seconds before every shard still running is killed
#                       (default 480; a killed shard counts as one failure)
set -uo pipefail
[ $# -le 1 ] || { echo "usage: par.sh [LOGDIR]" >&2; exit 2; }
dest=$(cd "$(dirname "$0")" && pwd)
[ -d "$dest/tests" ] || { echo "par.sh: no tests/ beside it (run it inside the GPU bundle: build/gpu/run.sh par.sh)" >&2; exit 2; }
logdir=${1:-$dest/logs}
mkdir -p "$logdir"
export GPUKIT_REQUIRE_GPU=1 PATH="$dest/bin:$PATH" GPUKIT_BIN="$dest/bin"
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$(mktemp -d)}
export GPUKIT_TEXT=${GPUKIT_TEXT:-$dest/data/Isaac.Newton-Opticks.txt}
size=${GPUKIT_PAR_SIZE:-6}
pids=()
for t in "$dest"/tests/*.test; do
	name=$(basename "$t" .test)
	d="$dest/tests/$name.d"
	if [ -n "${GPUKIT_TEST_RUN:-}" ]; then
		names=$(tr '|' '\n' <<<"$GPUKIT_TEST_RUN" | sed 's/^\^*(*//; s/)*\$*$//' | grep -xFf "$d/TESTS" || true)
	else
		names=$(cat "$d/TESTS")
	fi
	[ -n "$names" ] || continue
	n=$(wc -l <<<"$names")
	shards=$(((n + size - 1) / size))
	for ((s = 0; s < shards; s++)); do
		re="^($(awk -v s=$s -v k=$shards 'NR % k == s' <<<"$names" | paste -sd'|'))\$"
		log="$logdir/$name.$s.log"
		(cd "$d" && timeout -k 10 "${GPUKIT_PAR_TIMEOUT:-480}" "$t" -test.v -test.count=1 -test.timeout=20m -test.run "$re" >"$log" 2>&1; echo "exit $?" >>"$log") &
		pids+=($!)
	done
done
wait "${pids[@]}"
pass=0 fail=0
for log in "$logdir"/*.log; do
	p=$(grep -acE '^--- PASS: ' "$log" || true)
	f=$(grep -acE '^--- (FAIL|SKIP): ' "$log" || true)
	if ! grep -aqE '^(ok|PASS)$' "$log" && [ "$f" = 0 ]; then f=1; fi
	echo "== $(basename "$log" .log): $p passed, $f failed ($(tail -1 "$log"))"
	if [ "$f" != 0 ]; then
		grep -aE '^--- (FAIL|SKIP)|^panic:' "$log" | sed 's/^/   /'
		grep -a -B3 -A15 -E '^--- (FAIL|SKIP)|^panic:' "$log" | head -60 | sed 's/^/   | /'
	fi
	pass=$((pass + p)) fail=$((fail + f))
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
