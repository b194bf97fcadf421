#!/usr/bin/env bash
# train-fashion.sh — train a Fashion-MNIST MLP whose parameters, gradients and
# optimizer state live in a gpupool daemon, then evaluate the checkpoint.
#
#   gpupool serve --socket S  →  trainer run --pool S  →  trainer eval
#
# Environment (all optional):
#   GPUKIT_BIN    directory with the gpupool and trainer binaries (./bin)
#   DATA          Fashion-MNIST IDX directory (/usr/share/datasets/fashion-mnist)
#   OUT           run directory (${TMPDIR:-/tmp}/gpukit-train-fashion)
#   EPOCHS        passes over the training set (5)
#   LIMIT         train on the first LIMIT examples only, 0 = all (0); short mode: EPOCHS=1 LIMIT=3000
#   MIN_ACCURACY  fail unless the test accuracy reaches this (0.85 when LIMIT=0, else 0)
#   POOL_TIMEOUT  seconds to wait for the pool's socket (10)
# JSON lines from trainer go to stdout; progress and the summary to stderr.
set -euo pipefail

bin=${GPUKIT_BIN:-./bin}
data=${DATA:-/usr/share/datasets/fashion-mnist}
out=${OUT:-${TMPDIR:-/tmp}/gpukit-train-fashion}
epochs=${EPOCHS:-5}
limit=${LIMIT:-0}
if [ "$limit" = 0 ]; then min_acc=${MIN_ACCURACY:-0.85}; else min_acc=${MIN_ACCURACY:-0}; fi
timeout=${POOL_TIMEOUT:-10}

for b in gpupool trainer; do
	[ -x "$bin/$b" ] || { echo "train-fashion: $bin/$b not found (build with make build, or set GPUKIT_BIN)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/train-fashion.XXXXXX")
pool_pid=
cleanup() {
	if [ -n "$pool_pid" ]; then
		kill -TERM "$pool_pid" 2>/dev/null || true
		wait "$pool_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# Start the pool; it prints its socket path on stdout once it accepts connections.
mkfifo "$work/ready"
"$bin/gpupool" serve --socket "$work/pool.sock" >"$work/ready" 2>"$work/pool.err" &
pool_pid=$!
exec 3<"$work/ready"
if ! read -r -t "$timeout" -u 3 sock || [ -z "$sock" ]; then
	echo "train-fashion: gpupool did not print its socket within ${timeout}s: $(tail -n1 "$work/pool.err" 2>/dev/null)" >&2
	exit 1
fi
cat <&3 >"$work/pool.out" &  # keep draining the pool's stdout so it never blocks or gets SIGPIPE
exec 3<&-
[ -S "$sock" ] || { echo "train-fashion: gpupool printed $sock, which is not a socket" >&2; exit 1; }
echo "train-fashion: pool ready at $sock" >&2

"$bin/trainer" run --pool "$sock" --data "$data" --out "$out" --epochs "$epochs" --limit "$limit" --log-every 100
result=$("$bin/trainer" eval --ckpt "$out/model.safetensors" --data "$data")
echo "$result"

acc=$(printf '%s\n' "$result" | sed -n 's/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p')
[ -n "$acc" ] || { echo "train-fashion: no test_accuracy in: $result" >&2; exit 1; }
if ! awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }'; then
	echo "train-fashion: test accuracy $acc is below $min_acc" >&2
	exit 1
fi
echo "train-fashion: test accuracy $acc (>= $min_acc); outputs in $out" >&2
