#!/usr/bin/env bash
# diffusion-fashion.sh — train a class-conditional diffusion U-Net on
# Fashion-MNIST whose weights live in a gpupool daemon and are published
# there as snapshots while it trains; sample image grids from the
# checkpoint and from the pool's snapshot (the same images: the same
# weights), an animated GIF, and score the samples with an MLP classifier
# the trainer trains on the real data.
#
#   gpupool serve  →  trainer run --model unet --pool S --publish-every N
#                  →  trainer run (the classifier)
#                  →  sampler sample --ckpt | --pool S --weights RUN/weights
#                  →  sampler video  →  sampler score
#
# On a GPU (trainer info says cuda) the defaults train the 5.3 M parameter
# U-Net (64-128-256) for 20000 steps in bf16 and score 10000 samples
# (20 DPM-Solver++ steps at guidance 3); on the host a tiny U-Net (8-8-16)
# trains 400 steps of 16 images at lr 4e-3 (a few minutes on two cores) and
# samples with 10 steps: rough garments, whose class a classifier gets right
# about a quarter of the time (chance: a tenth; the script fails below 0.15).
# The EMA the samplers read warms up (trainer run --ema-warmup), so it
# follows the weights of a short run instead of staying near their noise.
#
# Environment (all optional):
#   GPUKIT_BIN  directory with gpupool, trainer and sampler (./bin)
#   DATA        Fashion-MNIST IDX directory ($GPUKIT_DATA_DIR or /usr/share/datasets/fashion-mnist)
#   OUT         output directory (${TMPDIR:-/tmp}/gpukit-diffusion-fashion)
#   DEVICE      auto, host or cuda[:N]
#   STEPS       U-Net training steps (GPU 20000, host 400)
#   CHANNELS    U-Net widths (GPU 64,128,256; host 8,8,16)
#   BATCH       images per training step (GPU 128, host 16)
#   LR          U-Net learning rate (GPU 2e-4, host 4e-3)
#   SAMPLES     images scored (GPU 10000, host 100)
#   FRAMES      video frames (GPU 40, host 4)
#   MIN_ACCURACY fail unless the class-conditional accuracy reaches this (GPU 0.9, host 0.15)
# JSON lines go to stdout; progress and summaries to stderr.
set -euo pipefail

bin=${GPUKIT_BIN:-./bin}
data=${DATA:-${GPUKIT_DATA_DIR:-/usr/share/datasets/fashion-mnist}}
out=${OUT:-${TMPDIR:-/tmp}/gpukit-diffusion-fashion}
timeout=${POOL_TIMEOUT:-10}

for b in gpupool trainer sampler; do
	[ -x "$bin/$b" ] || { echo "diffusion-fashion: $bin/$b not found (build with make build, or set GPUKIT_BIN)" >&2; exit 1; }
done

info=$("$bin/trainer" info --device "${DEVICE:-auto}")
kind=$(printf '%s\n' "$info" | sed -n 's/.*"kind":"\([a-z]*\)".*/\1/p')
if [ "$kind" = cuda ]; then
	backend=cuda steps=${STEPS:-20000} channels=${CHANNELS:-64,128,256} groups=32 heads=4 batch=${BATCH:-128}
	samples=${SAMPLES:-10000} frames=${FRAMES:-40} min_acc=${MIN_ACCURACY:-0.9} epochs=10 limit=0 prec=bf16
	publish=$((steps / 4)) sbatch=256 ssteps=20 cls_widths=784,256,256,10 lr=${LR:-2e-4}
else
	backend=host steps=${STEPS:-400} channels=${CHANNELS:-8,8,16} groups=4 heads=2 batch=${BATCH:-16}
	samples=${SAMPLES:-100} frames=${FRAMES:-4} min_acc=${MIN_ACCURACY:-0.15} epochs=1 limit=3000 prec=f32
	publish=$((steps / 2)) sbatch=20 ssteps=10 cls_widths=784,64,10 lr=${LR:-4e-3}
fi
mkdir -p "$out"
echo "diffusion-fashion: $(printf '%s\n' "$info" | sed -n 's/.*"device":"\([^"]*\)".*/\1/p'): U-Net $channels, $steps steps of $batch" >&2

work=$(mktemp -d "${TMPDIR:-/tmp}/diffusion-fashion.XXXXXX")
pool_pid=
cleanup() {
	if [ -n "$pool_pid" ]; then
		kill -TERM "$pool_pid" 2>/dev/null || true
		wait "$pool_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

mkfifo "$work/ready"
"$bin/gpupool" serve --socket "$work/pool.sock" --backend "$backend" >"$work/ready" 2>"$work/pool.err" &
pool_pid=$!
exec 3<"$work/ready"
if ! read -r -t "$timeout" -u 3 sock || [ -z "$sock" ]; then
	echo "diffusion-fashion: gpupool did not print its socket within ${timeout}s: $(tail -n1 "$work/pool.err" 2>/dev/null)" >&2
	exit 1
fi
cat <&3 >"$work/pool.out" &
exec 3<&-

# The diffusion model, published to the pool every $publish steps.
"$bin/trainer" run --model unet --pool "$sock" --run unet --data "$data" --out "$out/unet" --force --steps "$steps" \
	--channels "$channels" --groups "$groups" --heads "$heads" --batch "$batch" --lr "$lr" --precision "$prec" \
	--publish-every "$publish" --log-every $((steps / 4 > 0 ? steps / 4 : 1))
# The classifier that scores samples.
"$bin/trainer" run --data "$data" --out "$out/mlp" --force --epochs "$epochs" --limit "$limit" --widths "$cls_widths" \
	--log-every 1000 >/dev/null

ck=$out/unet/model.safetensors
common=(--steps "$ssteps" --scheduler dpmsolver++ --guidance-scale 3 --seed 7 --batch "$sbatch" --precision "$prec" --device "${DEVICE:-auto}")
"$bin/sampler" sample --ckpt "$ck" "${common[@]}" --n 20 --out "$out/grid.png" --save "$out/ckpt-samples.safetensors" --force
# The same images from the pool's newest snapshot (the final step's EMA, as in the checkpoint).
# (sampler/pipeline_test.go compares the two files' samples.)
"$bin/sampler" sample --pool "$sock" --weights unet/weights "${common[@]}" --n 20 --out "$out/grid-pool.png" \
	--save "$out/pool-samples.safetensors" --force
"$bin/sampler" video --ckpt "$ck" --frames "$frames" --fps 8 --strength 0.5 --blend 0.2 --steps 4 --first-steps "$ssteps" \
	--guidance-scale 3 --seed 7 --precision "$prec" --device "${DEVICE:-auto}" --out "$out/video.gif" --frames-dir "$out/frames" --force
result=$("$bin/sampler" score --ckpt "$ck" --classifier "$out/mlp/model.safetensors" --data "$data" --n "$samples" "${common[@]}" | tail -n1)
echo "$result"
acc=$(printf '%s\n' "$result" | sed -n 's/.*"accuracy":\([0-9.eE+-]*\).*/\1/p')
[ -n "$acc" ] || { echo "diffusion-fashion: no accuracy in: $result" >&2; exit 1; }
if ! awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }'; then
	echo "diffusion-fashion: class-conditional accuracy $acc is below $min_acc" >&2
	exit 1
fi
echo "diffusion-fashion: accuracy $acc (>= $min_acc); grid, video and frames in $out" >&2
