// tembed.cu: the sinusoidal timestep embedding of guided-diffusion's
// timestep_embedding (libgpu/ops/tembed.go), in f32 with accurate expf,
// cosf and sinf (NVRTC without --use_fast_math):
//
//   f_i = exp((−lnP·i)/half);  y[n, i] = cos(t_n·f_i);  y[n, half+i] = sin(t_n·f_i)
//
// one thread per (n, i), i < half.
#include "common.cuh"

template <typename T>
__device__ void temb(T* y, const int* t, int n, int half, float lnP) {
  GPUKIT_GRID_STRIDE(j, (long long)n * half) {
    const int r = (int)((long long)j / half), i = (int)((long long)j % half);
    const float f = expf((-lnP * (float)i) / (float)half);
    const float a = (float)t[r] * f;
    gpukit_st(y + (long long)r * 2 * half + i, cosf(a));
    gpukit_st(y + (long long)r * 2 * half + half + i, sinf(a));
  }
}

extern "C" __global__ void temb_f32(float* y, const int* t, int n, int half, float lnP) {
  temb<float>(y, t, n, half, lnP);
}
extern "C" __global__ void temb_bf16(gpukit_bf16* y, const int* t, int n, int half, float lnP) {
  temb<gpukit_bf16>(y, t, n, half, lnP);
}
