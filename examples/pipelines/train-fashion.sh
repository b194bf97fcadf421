#!/usr/bin/env bash
# train-fashion.sh — train a Fashion-MNIST MLP whose parameters, gradients and
# optimizer state live in a gpupool daemon, then evaluate the checkpoint.
#
#   gpupool serve --socket S --backend B  →  trainer run --pool S  →  trainer eval
#
# On a GPU (trainer info --device $DEVICE says cuda) the pool serves GPU
# memory and the trainer replays each step as a CUDA graph: the defaults then
# train a wider MLP for more epochs in about the time the host takes for 5,
# and require 89% test accuracy; on the host, 5 epochs and 85%.
#
# Environment (all optional):
#   GPUKIT_BIN    directory with the gpupool and trainer binaries (./bin)
#   DATA          Fashion-MNIST IDX directory ($GPUKIT_DATA_DIR or /usr/share/datasets/fashion-mnist)
#   OUT           run directory (${TMPDIR:-/tmp}/gpukit-train-fashion); a run already there is replaced
#   DEVICE        auto, host or cuda[:N] (auto: a GPU when one answers)
#   EPOCHS        passes over the training set (GPU 30, host 5)
#   WIDTHS        MLP widths (GPU 784,1024,1024,10; host 784,256,256,10)
#   BATCH         examples per step (128)
#   LIMIT         train on the first LIMIT examples only, 0 = all (0); short mode: EPOCHS=1 LIMIT=3000
#   MIN_ACCURACY  fail unless the test accuracy reaches this (LIMIT=0: GPU 0.89, host 0.85; else 0)
#   POOL_TIMEOUT  seconds to wait for the pool's socket (10)
# JSON lines from trainer go to stdout; progress and the summary to stderr.
set -euo pipefail

bin=${GPUKIT_BIN:-./bin}
data=${DATA:-${GPUKIT_DATA_DIR:-/usr/share/datasets/fashion-mnist}}
out=${OUT:-${TMPDIR:-/tmp}/gpukit-train-fashion}
limit=${LIMIT:-0}
batch=${BATCH:-128}
timeout=${POOL_TIMEOUT:-10}

for b in gpupool trainer; do
	[ -x "$bin/$b" ] || { echo "train-fashion: $bin/$b not found (build with make build, or set GPUKIT_BIN)" >&2; exit 1; }
done

info=$("$bin/trainer" info --device "${DEVICE:-auto}")
kind=$(printf '%s\n' "$info" | sed -n 's/.*"kind":"\([a-z]*\)".*/\1/p')
if [ "$kind" = cuda ]; then
	backend=cuda epochs=${EPOCHS:-30} widths=${WIDTHS:-784,1024,1024,10} def_acc=0.89
else
	backend=host epochs=${EPOCHS:-5} widths=${WIDTHS:-784,256,256,10} def_acc=0.85
fi
if [ "$limit" = 0 ]; then min_acc=${MIN_ACCURACY:-$def_acc}; else min_acc=${MIN_ACCURACY:-0}; fi
echo "train-fashion: $(printf '%s\n' "$info" | sed -n 's/.*"device":"\([^"]*\)".*/\1/p'): $epochs epochs of $widths, batch $batch" >&2

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
"$bin/gpupool" serve --socket "$work/pool.sock" --backend "$backend" >"$work/ready" 2>"$work/pool.err" &
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

"$bin/trainer" run --pool "$sock" --data "$data" --out "$out" --force --epochs "$epochs" --limit "$limit" \
	--widths "$widths" --batch "$batch" --log-every 100
result=$("$bin/trainer" eval --ckpt "$out/model.safetensors" --data "$data")
echo "$result"

acc=$(printf '%s\n' "$result" | sed -n 's/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p')
[ -n "$acc" ] || { echo "train-fashion: no test_accuracy in: $result" >&2; exit 1; }
if ! awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }'; then
	echo "train-fashion: test accuracy $acc is below $min_acc" >&2
	exit 1
fi
echo "train-fashion: test accuracy $acc (>= $min_acc); outputs in $out" >&2
