// graphwhile.cu: the device side of Engine.While's conditional WHILE node
// (libgpu/ops/while.go; CUDA Programming Guide, "Conditional Graph Nodes").
// Alone in its file: should NVRTC's cubin not resolve
// cudaGraphSetConditional, the Go side loads this file as PTX instead, and
// no other kernel depends on it (Engine.CountAbove's is countabove.cu).
//
// while_set runs once before the node (first = 1) and at the end of every
// body run (first = 0): it keeps the trip counter (the body runs completed
// so far) and sets the node's condition to cond ≠ 0 and, with a limit,
// count < max_iter, through cudaGraphSetConditional, the device runtime
// function that sets a conditional handle. The declaration is the CUDA
// toolkit's (cuda_device_runtime_api.h), written out so that NVRTC
// compiles it with no include path, as NVIDIA's NeMo does for its
// decoding loops (nemo/core/utils/cuda_python_utils.py); the driver's
// PTX compiler supplies the function (cubin or PTX JIT alike), no
// device-runtime library is linked.
#include "common.cuh"

#if defined(__CUDACC_RTC__)
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
#else  // scripts/cuda-check.sh (clang): only the declaration is checked
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
#endif

extern "C" __global__ void while_set(cudaGraphConditionalHandle handle, const int* cond, int* count, int max_iter, int first) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int n = 0;
  if (count) {
    n = first ? 0 : *count + 1;
    *count = n;
  }
  const bool go = *cond != 0 && (max_iter <= 0 || n < max_iter);
  cudaGraphSetConditional(handle, go ? 1u : 0u);
}
