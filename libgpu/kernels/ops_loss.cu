// ops_loss.cu: softmax cross-entropy, forward and backward in one kernel
// (ops.SoftmaxCrossEntropy; launched by libgpu/ops/cuda_misc.go).
#include "common.cuh"

// Block-wide reductions for blockDim.x a multiple of 32 (at most 1024). The
// order of the additions depends only on blockDim.x, so results are bitwise
// reproducible. sh needs 32 floats. Every thread gets the result.
__device__ __forceinline__ float xent_block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = gpukit_warp_sum(v);
    __syncthreads();  // sh may still be read by a previous reduction
    if (lane == 0) {
        sh[warp] = v;
    }
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return gpukit_warp_sum(t);
}

__device__ __forceinline__ float xent_block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    __syncthreads();
    if (lane == 0) {
        sh[warp] = v;
    }
    __syncthreads();
    float t = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
    for (int o = 16; o > 0; o >>= 1) {
        t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
    }
    return t;
}

// softmax_xent: one block per row i of logits[m,c] (row-major), labels[m]
// i32. With mx = max_j x_ij and s = sum_j exp(x_ij - mx):
//
//	dlogits[i,j] = (exp(x_ij - mx)/s - [j == label_i]) / m
//	rowloss[i]   = log s - (x_{i,label_i} - mx)          (= -log softmax_label)
//
// and the last block to finish (a ticket taken with atomicAdd on *counter
// after a __threadfence, as in the CUDA samples' threadFenceReduction) sums
// rowloss[0..m) in a fixed order and writes loss[0] = sum / m, then resets
// *counter to 0 for the next launch. No float atomics: the loss is bitwise
// the same on every run, eager or replayed in a graph. A label outside
// [0, c) makes that row's loss NaN (the GPU does not report errors back) and
// its gradient softmax/m without the one-hot term.
extern "C" __global__ void softmax_xent(float* loss, float* dlogits, const float* logits,
                                        const int* labels, float* rowloss,
                                        unsigned int* counter, int m, int c) {
    __shared__ float sh[32];
    __shared__ bool last;
    int row = blockIdx.x;
    const float* x = logits + (long long)row * c;
    float* d = dlogits + (long long)row * c;

    float mx = -__int_as_float(0x7f800000);
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        mx = fmaxf(mx, x[j]);
    }
    mx = xent_block_max(mx, sh);

    float s = 0.0f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        s += expf(x[j] - mx);
    }
    s = xent_block_sum(s, sh);

    int label = labels[row];
    bool valid = label >= 0 && label < c;
    float invm = 1.0f / (float)m;
    float scale = invm / s;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        float g = expf(x[j] - mx) * scale;
        if (j == label) {
            g -= invm;
        }
        d[j] = g;
    }
    if (threadIdx.x == 0) {
        rowloss[row] = valid ? logf(s) - (x[label] - mx) : __int_as_float(0x7fffffff);
        __threadfence();
        unsigned int ticket = atomicAdd(counter, 1u);
        last = ticket == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) {
        return;
    }
    // Every other block's rowloss is visible (each fenced before its ticket).
    // Read through volatile so no stale cached value is used.
    const volatile float* rl = rowloss;
    float t = 0.0f;
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        t += rl[i];
    }
    t = xent_block_sum(t, sh);
    if (threadIdx.x == 0) {
        loss[0] = t * invm;
        *counter = 0u;
    }
}
