#!/usr/bin/env bash
# bench/video.sh — issue 24's video at the background document's scale on a
# GPU machine: `sampler video --random-init` of a U-Net of random weights
# (speed only: the frames are noise) at CONFIG (default bench/video-880m.json:
# channels 640-1280-2560-2560 at 64×64×4, 849 M parameters, 566 GFLOP a
# forward) with 1 to 4 guided steps a frame (re-noise to 0.5, temporal
# blending, the per-frame loop one CUDA graph), one and two streams a batch
# (the background document's batch 1 and 2), beside the same model in
# PyTorch (bench/reference/unet.py video --config: eager, CUDA graph,
# torch.compile) in the same run. JSON lines on stdout and in
# $BENCH_OUT/video.jsonl: gpukit's summary line per step count
# ({frames_per_s, frame_ms (median), steps, ...}) and PyTorch's per mode.
#
# With GUIDANCE "cfg rcfg" (the default) each row runs twice: classifier-free
# guidance at 3 (two U-Net passes a step), and R-CFG at RCFG (default 1.5;
# `sampler video --residual-guidance`: one pass a step), PyTorch doing the
# same in each.
#
# usage: bench/video.sh [CONFIG]   (inside the GPU bundle, or a tree with ./bin)
#        STEPS (default "1 4"), STREAMS (default "1 2": videos in one batch),
#        FRAMES (default 30), MODES (default graph,compile), GUIDANCE, RCFG
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cfg=${1:-$here/video-880m.json}
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
: >"$out/video.jsonl"
[ -x "$bin/sampler" ] || { echo "bench/video.sh: $bin/sampler not found (build the GPU bundle)" >&2; exit 2; }
rcfg=${RCFG:-1.5}
for g in ${GUIDANCE:-cfg rcfg}; do
	ours=() theirs=()
	case $g in
	cfg) ;;
	rcfg) ours=(--residual-guidance "$rcfg") theirs=(--residual-guidance "$rcfg") ;;
	*) echo "bench/video.sh: GUIDANCE $g: want cfg or rcfg" >&2; exit 2 ;;
	esac
for b in ${STREAMS:-1 2}; do
for s in ${STEPS:-1 4}; do
	"$bin/sampler" video --random-init "$cfg" --device cuda --frames "${FRAMES:-30}" --first-steps 1 --steps "$s" \
		--streams "$b" "${ours[@]}" --raw /dev/null --force | tail -n 1 | G="$g" python3 -c '
import json, os, sys
d = json.loads(sys.stdin.read())
d.update({"workload": "unet-video-frame", "impl": "gpukit-graph", "guidance": os.environ["G"]})
print(json.dumps(d))' | tee -a "$out/video.jsonl"
	python3 "$here/reference/unet.py" video --config "$cfg" --steps "$s" --batch "$b" "${theirs[@]}" --modes "${MODES:-graph,compile}" |
		tee -a "$out/video.jsonl"
done
done
done
