#!/usr/bin/env bash
# gpt-opticks.sh — train a small character-level GPT on a text (Newton's
# Opticks, which every machine with Go has), check that its validation loss
# is well below the text's unigram entropy, then generate from it.
#
#   trainer run --model gpt --data TEXT  →  trainer generate --ckpt model.safetensors
#
# The defaults (2 layers, 4 heads, d 128, block 64, batches of 32, 600
# steps) train in 5 to 13 minutes on a 2-core machine (measured) and in
# seconds on a GPU.
#
# Environment (all optional):
#   GPUKIT_BIN   directory with the trainer binary (./bin)
#   TEXT         UTF-8 text to train on ($(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt)
#   OUT          run directory (${TMPDIR:-/tmp}/gpukit-gpt-opticks); a run already there is replaced
#   DEVICE       auto, host or cuda[:N]
#   STEPS        optimizer steps (600); short mode: STEPS=30
#   MARGIN       fail unless the validation loss is at least this far below the
#                unigram entropy, in nats (STEPS ≥ 300: 0.5; else 0)
#   TOKENS       characters to generate (300)
# JSON lines from trainer go to stdout; progress (a bar on a terminal), the
# summary and the generated text's header to stderr (the trainer's also to
# $OUT.log); the generated text to stdout.
set -euo pipefail

bin=${GPUKIT_BIN:-./bin}
steps=${STEPS:-600}
out=${OUT:-${TMPDIR:-/tmp}/gpukit-gpt-opticks}
tokens=${TOKENS:-300}
if [ -z "${TEXT:-}" ]; then
	goroot=${GOROOT:-$(go env GOROOT 2>/dev/null || echo /usr/local/go)}
	TEXT=$goroot/src/testdata/Isaac.Newton-Opticks.txt
fi
[ -x "$bin/trainer" ] || { echo "gpt-opticks: $bin/trainer not found (build with make build, or set GPUKIT_BIN)" >&2; exit 1; }
[ -f "$TEXT" ] || { echo "gpt-opticks: no text at $TEXT (set TEXT)" >&2; exit 1; }
if [ "$steps" -ge 300 ]; then margin=${MARGIN:-0.5}; else margin=${MARGIN:-0}; fi

# The trainer's stderr (progress, the summary) is shown as it comes and kept
# in $out.log, where the summary is read from; on a terminal the progress
# bar is drawn through the pipe (GPUKIT_PROGRESS=always).
if [ -t 2 ]; then export GPUKIT_PROGRESS=${GPUKIT_PROGRESS:-always}; fi
{ "$bin/trainer" run --model gpt --data "$TEXT" --out "$out" --force --device "${DEVICE:-auto}" \
	--steps "$steps" --eval-every $(( steps < 100 ? steps : 100 )) --log-every 50 2>&1 >&3 3>&- | tee "$out.log" >&2 3>&-; } 3>&1
summary=$(grep -a 'validation loss' "$out.log" | tail -n1)
echo "$summary" >&2
val=$(printf '%s\n' "$summary" | sed -n 's/.*validation loss \([0-9.]*\) (unigram entropy of the text \([0-9.]*\)).*/\1/p')
uni=$(printf '%s\n' "$summary" | sed -n 's/.*unigram entropy of the text \([0-9.]*\)).*/\1/p')
[ -n "$val" ] && [ -n "$uni" ] || { echo "gpt-opticks: no validation loss in: $summary" >&2; exit 1; }
if ! awk -v v="$val" -v u="$uni" -v m="$margin" 'BEGIN { exit !(v <= u - m) }'; then
	echo "gpt-opticks: validation loss $val is not $margin below the unigram entropy $uni" >&2
	exit 1
fi
echo "gpt-opticks: validation loss $val vs unigram entropy $uni; sampling $tokens characters:" >&2
"$bin/trainer" generate --ckpt "$out/model.safetensors" --device "${DEVICE:-auto}" --prompt "Light " --tokens "$tokens"
