// ops_optim.cu: multi-tensor AdamW and SGD (ops.AdamW, ops.SGD; launched by
// libgpu/ops/cuda_optim.go).
//
// Every tensor of a parameter list is updated by one launch: the list (up to
// OPS_MT_MAX tensors per launch) travels by value in the kernel's parameter
// space as a __grid_constant__ struct, so nothing is uploaded before the
// launch and a captured CUDA graph keeps its own copy of it. Tensor i owns
// blocks [start[i], start[i+1]); each block updates OPS_MT_CHUNK consecutive
// elements of its tensor. The Go mirrors of these structs are in
// cuda_optim.go; the sizes below are asserted on both sides.
#include "common.cuh"

#define OPS_MT_MAX 32
#define OPS_MT_CHUNK 2048

struct ops_adam_tensor {
    float* p;
    const float* g;
    float* m;
    float* v;
    long long n;
    float wd;  // this tensor's weight decay (0 for biases and norms)
};

struct ops_adam_args {
    ops_adam_tensor t[OPS_MT_MAX];
    int start[OPS_MT_MAX + 1];
    int count;
    float lr, b1, b2, eps;
    const float* bc;        // {1 - b1^t, 1 - b2^t}, written by adamw_step
    const float* lr_scale;  // null, or a device scalar multiplying lr (a schedule)
    const float* g_scale;   // null, or a device scalar multiplying every gradient (clipping)
};
static_assert(sizeof(ops_adam_args) == 1712, "ops_adam_args layout: launch.OpsAdamArgs is generated from it (go generate ./libgpu/kernels/launch)");

struct ops_sgd_tensor {
    float* p;
    const float* g;
    float* buf;
    long long n;
};

struct ops_sgd_args {
    ops_sgd_tensor t[OPS_MT_MAX];
    int start[OPS_MT_MAX + 1];
    int count;
    float lr, mu, wd;
};
static_assert(sizeof(ops_sgd_args) == 1176, "ops_sgd_args layout: launch.OpsSgdArgs is generated from it (go generate ./libgpu/kernels/launch)");

// powi is b^t for t >= 0 by repeated squaring in double (no math library
// needed; a few ulps of double, far below f32 resolution).
__device__ __forceinline__ double powi(double b, int t) {
    double r = 1.0;
    while (t > 0) {
        if (t & 1) {
            r *= b;
        }
        b *= b;
        t >>= 1;
    }
    return r;
}

// adamw_step advances the step counter and the bias corrections, one
// thread: t = ++*step; bc = {1 - b1^(t-lag), 1 - b2^(t-lag)} (computed in
// double; bc may be null: the counter alone). It runs before adamw_multi
// on the same stream, so every block of the update sees the same t; in a
// replayed graph the counter advances on every replay.
extern "C" __global__ void adamw_step(int* step, float* bc, float b1, float b2, int lag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int t = *step + 1;
        *step = t;
        if (bc) {
            bc[0] = (float)(1.0 - powi((double)b1, t - lag));
            bc[1] = (float)(1.0 - powi((double)b2, t - lag));
        }
    }
}

// adamw_multi: AdamW (Loshchilov & Hutter 2019, Algorithm 2) as
// torch.optim.AdamW computes it, per element:
//
//	p <- p (1 - lr wd)
//	m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//	p <- p - lr (m / bc1) / (sqrt(v / bc2) + eps)
//
// with lr = a.lr · *a.lr_scale when lr_scale is set (read on the device, so
// a replayed graph follows a schedule), g = g · *g_scale when g_scale is set
// (the clipping coefficient: the same f32 product clip_scale_multi would
// have stored) and wd per tensor (param groups).
extern "C" __global__ void adamw_multi(const __grid_constant__ ops_adam_args a) {
    int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
    const ops_adam_tensor& T = a.t[ti];
    long long lo = (long long)(blockIdx.x - a.start[ti]) * OPS_MT_CHUNK;
    long long hi = lo + OPS_MT_CHUNK;
    if (hi > T.n) {
        hi = T.n;
    }
    float bc1 = a.bc[0], bc2 = a.bc[1];
    float lr = a.lr_scale ? a.lr * *a.lr_scale : a.lr;
    const float gsc = a.g_scale ? *a.g_scale : 1.0f;
    float decay = 1.0f - lr * T.wd;
    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        float g = a.g_scale ? T.g[k] * gsc : T.g[k];
        float m = a.b1 * T.m[k] + (1.0f - a.b1) * g;
        float v = a.b2 * T.v[k] + (1.0f - a.b2) * g * g;
        T.m[k] = m;
        T.v[k] = v;
        T.p[k] = T.p[k] * decay - lr * (m / bc1) / (sqrtf(v / bc2) + a.eps);
    }
}

// sgd_multi: SGD with momentum as torch.optim.SGD (dampening 0, not
// Nesterov), per element, with buf zero before the first step:
//
//	d <- g + wd p;  buf <- mu buf + d;  p <- p - lr buf
extern "C" __global__ void sgd_multi(const __grid_constant__ ops_sgd_args a) {
    int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
    const ops_sgd_tensor& T = a.t[ti];
    long long lo = (long long)(blockIdx.x - a.start[ti]) * OPS_MT_CHUNK;
    long long hi = lo + OPS_MT_CHUNK;
    if (hi > T.n) {
        hi = T.n;
    }
    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        float d = T.g[k] + a.wd * T.p[k];
        float b = a.mu * T.buf[k] + d;
        T.buf[k] = b;
        T.p[k] -= a.lr * b;
    }
}
