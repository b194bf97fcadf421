#!/usr/bin/env bash
# Compiles every embedded kernel (libgpu/kernels/*.cu) to PTX with clang's
# NVPTX back end, without the CUDA toolkit, to catch C++ errors before a
# GPU machine's NVRTC sees them. A developer tool: needs clang (Debian's
# clang-14 works; sm_80 is its newest target, enough for mma.sync, ldmatrix
# and cp.async); inline PTX is not assembled here. A file that mentions
# GPUKIT_CHECK_SM90 is compiled a second time with it defined, so code
# guarded for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL: wgmma) is checked too. Usage:
#   scripts/cuda-check.sh [file.cu ...]
set -euo pipefail
cd "$(dirname "$0")/.."
cc=$(command -v clang-14 || command -v clang || true)
[ -n "$cc" ] || { echo "cuda-check: no clang (apt-get install clang-14)" >&2; exit 2; }
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(libgpu/kernels/*.cu)
fail=0
check() {
	"$cc" -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_80 -Xclang -target-feature -Xclang +ptx75 \
		-std=c++17 -O1 -Wall -Wno-unused-function -Wno-unknown-cuda-version \
		-include scripts/cudacheck/shim.h -I scripts/cudacheck -I libgpu/kernels -S -o /dev/null "$@"
}
for f in "${files[@]}"; do
	if ! check "$f"; then
		echo "cuda-check: $f FAILED" >&2
		fail=1
	fi
	if grep -q GPUKIT_CHECK_SM90 "$f" && ! check -DGPUKIT_CHECK_SM90 "$f"; then
		echo "cuda-check: $f (sm_90a code) FAILED" >&2
		fail=1
	fi
done
[ $fail = 0 ] && echo "cuda-check: ${#files[@]} file(s) compile"
exit $fail
