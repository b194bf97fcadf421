// ops_clip.cu: gradient clipping by the joint L2 norm of a list of tensors
// (ops.Engine.ClipGradNorm; launched by libgpu/ops/cuda_clip.go), without a
// host round trip:
//
//	clip_sumsq_multi  one partial sum of squares per block (multi-tensor)
//	clip_finalize     one block: norm = sqrt(sum of the partials), coef
//	clip_scale_multi  g *= coef for every tensor (multi-tensor)
//	clip_sumsq_total  one block: the partials' sum rounded to f32
//	                  (ops.Engine.SumSquares: one rank's part of a sum of
//	                  squares that an all-reduce completes)
//	clip_coef_from_sumsq  one thread: norm and coef from such a sum
//	                  (ops.Engine.ClipCoefFromSumSquares)
//
// The list travels by value like ops_optim.cu's (a __grid_constant__ struct
// of up to OPS_CLIP_MAX tensors; tensor i owns blocks [start[i],
// start[i+1]), OPS_CLIP_CHUNK elements per block). Sums are accumulated in
// double in a fixed order (no atomics), so the norm is bitwise the same on
// every run and in a replayed graph.
#include "common.cuh"

#define OPS_CLIP_MAX 32
#define OPS_CLIP_CHUNK 2048

struct ops_clip_tensor {
    float* g;
    long long n;
};

struct ops_clip_args {
    ops_clip_tensor t[OPS_CLIP_MAX];
    int start[OPS_CLIP_MAX + 1];
    int count;
};
static_assert(sizeof(ops_clip_args) == 648, "ops_clip_args layout: launch.OpsClipArgs is generated from it (go generate ./libgpu/kernels/launch)");

__device__ __forceinline__ double clip_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// clip_block_sum: the sum of v over the block (blockDim.x a multiple of 32,
// at most 1024) in an order fixed by blockDim.x; thread 0 gets it.
__device__ __forceinline__ double clip_block_sum(double v) {
    __shared__ double sh[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = clip_warp_sum(v);
    if (lane == 0) {
        sh[warp] = v;
    }
    __syncthreads();
    double t = 0.0;
    if (warp == 0) {
        t = lane < nw ? sh[lane] : 0.0;
        t = clip_warp_sum(t);
    }
    return t;
}

// clip_sumsq_multi writes partial[blockIdx.x] = sum of g^2 over the block's
// chunk of its tensor.
extern "C" __global__ void clip_sumsq_multi(const __grid_constant__ ops_clip_args a, double* partial) {
    int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
    const ops_clip_tensor& T = a.t[ti];
    long long lo = (long long)(blockIdx.x - a.start[ti]) * OPS_CLIP_CHUNK;
    long long hi = lo + OPS_CLIP_CHUNK;
    if (hi > T.n) {
        hi = T.n;
    }
    double s = 0.0;
    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        double g = (double)T.g[k];
        s += g * g;
    }
    s = clip_block_sum(s);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = s;
    }
}

// clip_finalize, one block: n = sqrt(sum of partial[0..count)) rounded to
// f32, norm[0] = n and coef[0] = min(max_norm / (n + 1e-6), 1) in f32, as
// torch.nn.utils.clip_grad_norm_ computes them.
extern "C" __global__ void clip_finalize(const double* partial, int count, float* norm, float* coef,
                                         float max_norm) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        s += partial[i];
    }
    s = clip_block_sum(s);
    if (threadIdx.x == 0) {
        float n = (float)sqrt(s);
        float c = max_norm / (n + 1e-6f);
        norm[0] = n;
        coef[0] = c < 1.0f ? c : (c == c ? 1.0f : c);  // NaN stays NaN
    }
}

// clip_scale_multi: g *= coef[0] over every tensor of the list.
extern "C" __global__ void clip_scale_multi(const __grid_constant__ ops_clip_args a, const float* coef) {
    int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
    const ops_clip_tensor& T = a.t[ti];
    long long lo = (long long)(blockIdx.x - a.start[ti]) * OPS_CLIP_CHUNK;
    long long hi = lo + OPS_CLIP_CHUNK;
    if (hi > T.n) {
        hi = T.n;
    }
    float c = coef[0];
    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        T.g[k] *= c;
    }
}

// clip_sumsq_total, one block: out[0] = the sum of partial[0..count) in
// the order of clip_finalize, rounded to f32.
extern "C" __global__ void clip_sumsq_total(const double* partial, int count, float* out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        s += partial[i];
    }
    s = clip_block_sum(s);
    if (threadIdx.x == 0) {
        out[0] = (float)s;
    }
}

// clip_coef_from_sumsq, one thread: n = sqrt(sumsq[0]) rounded to f32,
// norm[0] = n and coef[0] = min(max_norm / (n + 1e-6), 1) as
// clip_finalize computes them.
extern "C" __global__ void clip_coef_from_sumsq(const float* sumsq, float* norm, float* coef, float max_norm) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        float n = (float)sqrt((double)sumsq[0]);
        float c = max_norm / (n + 1e-6f);
        norm[0] = n;
        coef[0] = c < 1.0f ? c : (c == c ? 1.0f : c);  // NaN stays NaN
    }
}
