#!/usr/bin/env bash
# bench/scale.sh — issue 15's scaling run: bench/dp.sh for the 12-layer GPT
# (12 heads, d 768, block 1024) at 1, 2, 4 and 8 GPUs (the sizes above the
# GPUs here are skipped), global batch $GPT2_BATCH (default 32: 4 sequences
# per GPU at 8), gpukit against PyTorch DDP at every size, the 256 MiB
# all-reduce bus bandwidth at the largest size next to PyTorch's, and the
# losses of 100 bf16 steps at the largest size against 1 GPU (LOSSES=1).
# Targets (issue 15): scaling efficiency ≥ 0.9 at 8 GPUs, tokens/s ≥ 1.0×
# PyTorch DDP at every size. NCCL_NVLS_ENABLE=0 stays set.
#
# usage: bench/scale.sh TEXT        (TEXT: tinyshakespeare.txt)
# Any of bench/dp.sh's variables may be set (NPROCS, DDP_MODES, ...).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export NPROCS=${NPROCS:-1 2 4 8} MODELS=${MODELS:-gpt2} GPT2_BATCH=${GPT2_BATCH:-32} LOSSES=${LOSSES:-1}
exec bash "$here/dp.sh" "$@"
