// bce.cu: binary cross-entropy with logits, summed (libgpu/ops/bce.go;
// PyTorch's F.binary_cross_entropy_with_logits(x, y, reduction="sum"),
// which sapientinc/HRM's Q-halt and Q-continue losses use), and its
// gradient, in one block:
//
//   ℓ_i = max(x_i, 0) − x_i·y_i + log(1 + e^(−|x_i|))   (the stable form)
//   loss = scale · Σ_i ℓ_i,   dx_i = scale · (σ(x_i) − y_i)
//
// Every term in double, the sum in a fixed order (bitwise reproducible).
// One block of 1024 threads: the Q losses have one element per sequence.
#include "common.cuh"

struct bce_args {
  float* loss;      // [1]; null: not wanted
  void* dx;         // [n]; null: not wanted
  const void* x;    // [n] logits
  const void* y;    // [n] targets in [0, 1]
  long long n;
  float scale;
  int acc;          // add to dx
};
static_assert(sizeof(bce_args) == 48, "bce_args layout: launch.BceArgs is generated from it (go generate ./libgpu/kernels/launch)");

__device__ __forceinline__ double bce_warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename TX, typename TY>
__device__ void bce(const bce_args& a) {
  __shared__ double sh[32];
  const TX* x = static_cast<const TX*>(a.x);
  const TY* y = static_cast<const TY*>(a.y);
  TX* dx = static_cast<TX*>(a.dx);
  double s = 0.0;
  for (long long i = threadIdx.x; i < a.n; i += blockDim.x) {
    const double xi = (double)gpukit_ld(x + i), yi = (double)gpukit_ld(y + i);
    s += fmax(xi, 0.0) - xi * yi + log1p(exp(-fabs(xi)));
    if (dx) {
      float d = (float)((double)a.scale * (1.0 / (1.0 + exp(-xi)) - yi));
      if (a.acc) d += gpukit_ld(dx + i);
      gpukit_st(dx + i, d);
    }
  }
  s = bce_warp_sum(s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sh[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = bce_warp_sum(lane < nw ? sh[lane] : 0.0);
    if (lane == 0 && a.loss) a.loss[0] = (float)((double)a.scale * s);
  }
}

#define BCE_INSTANCE(SUF, TX, TY) \
  extern "C" __global__ void __launch_bounds__(1024) bce_##SUF(const __grid_constant__ bce_args a) { bce<TX, TY>(a); }

BCE_INSTANCE(f32_f32, float, float)
BCE_INSTANCE(f32_bf16, float, gpukit_bf16)
BCE_INSTANCE(bf16_f32, gpukit_bf16, float)
BCE_INSTANCE(bf16_bf16, gpukit_bf16, gpukit_bf16)
