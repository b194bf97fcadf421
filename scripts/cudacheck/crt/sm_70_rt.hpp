// empty stand-in for the toolkit header __clang_cuda_intrinsics.h includes (scripts/cuda-check.sh)
