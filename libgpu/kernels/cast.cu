// cast.cu: dtype conversion between f32 and bf16 (libgpu/ops/cast.go).
#include "common.cuh"
#include "vec.cuh"

// cast_f32_to_bf16: dst[i] = round-to-nearest-even(src[i]), i in [0, n).
extern "C" __global__ void cast_f32_to_bf16(gpukit_bf16* dst, const float* src, long long n) {
  GPUKIT_GRID_STRIDE(i, n) { dst[i] = gpukit_f32_to_bf16(src[i]); }
}

// cast_bf16_to_f32: dst[i] = src[i] widened exactly.
extern "C" __global__ void cast_bf16_to_f32(float* dst, const gpukit_bf16* src, long long n) {
  GPUKIT_GRID_STRIDE(i, n) { dst[i] = gpukit_bf16_to_f32(src[i]); }
}

// Multi-tensor f32 → bf16 cast (ops.Engine.Casts; Graph's autocast copies
// of f32 master weights, all of a step's in one launch). As ops_optim.cu's
// multi-tensor kernels: up to CAST_MT_MAX tensors per launch travel by value
// in the kernel's parameter space (a __grid_constant__ struct, so a
// captured graph keeps its own copy and nothing is uploaded); tensor i owns
// blocks [start[i], start[i+1]), each CAST_MT_CHUNK consecutive elements.
// The Go mirror (castMTArgs in cast.go) asserts the same layout.
#define CAST_MT_MAX 128
#define CAST_MT_CHUNK 4096  // 256 threads × 8 elements × 2 rounds

struct cast_mt_tensor {
  gpukit_bf16* dst;
  const float* src;
  long long n;
};

struct cast_mt_args {
  cast_mt_tensor t[CAST_MT_MAX];
  int start[CAST_MT_MAX + 1];
  int count;
};
static_assert(sizeof(cast_mt_args) == 3592, "cast_mt_args layout: launch.CastMtArgs is generated from it (go generate ./libgpu/kernels/launch)");

// cast_multi_f32_to_bf16: block b casts elements [lo, hi) of its tensor,
// lo = (b − start)·CAST_MT_CHUNK. Where both pointers are 16-byte aligned,
// each thread moves two vectors of 8 (two 16-byte loads each, all four in
// flight before the first store) and the last n mod 8 elements go one by
// one; otherwise every element goes one by one. 256 threads per block.
extern "C" __global__ void __launch_bounds__(256) cast_multi_f32_to_bf16(const __grid_constant__ cast_mt_args a) {
  const int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
  const cast_mt_tensor& T = a.t[ti];
  const long long lo = (long long)(blockIdx.x - a.start[ti]) * CAST_MT_CHUNK;
  const long long hi = lo + CAST_MT_CHUNK < T.n ? lo + CAST_MT_CHUNK : T.n;
  long long tail = lo;
  if ((((unsigned long long)T.dst | (unsigned long long)T.src) & 15ull) == 0) {
    const long long k0 = lo + (long long)threadIdx.x * 8, k1 = k0 + CAST_MT_CHUNK / 2;
    const bool ok0 = k0 + 8 <= hi, ok1 = k1 + 8 <= hi;
    float u[8], w[8];
    if (ok0) gpukit_ldv<8>(T.src + k0, u);
    if (ok1) gpukit_ldv<8>(T.src + k1, w);
    if (ok0) gpukit_stv<8>(T.dst + k0, u);
    if (ok1) gpukit_stv<8>(T.dst + k1, w);
    tail = lo + (hi - lo) / 8 * 8;
  }
  for (long long k = tail + threadIdx.x; k < hi; k += blockDim.x) T.dst[k] = gpukit_f32_to_bf16(T.src[k]);
}
