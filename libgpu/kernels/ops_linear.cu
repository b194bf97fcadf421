// ops_linear.cu: element-wise and reduction kernels around the cuBLASLt GEMMs
// of ops.Linear and ops.LinearBackward (libgpu/ops/cuda_linear.go launches
// them). Includes only common.cuh, so NVRTC needs no CUDA headers.
//
// Activations (ops.Act): 0 none, 1 ReLU, 2 GELU with the tanh approximation
// (Hendrycks & Gimpel 2016): gelu(z) = 0.5 z (1 + tanh(c (z + a z^3))),
// c = sqrt(2/pi), a = 0.044715, the form cuBLASLt's GELU epilogues compute.

#include "common.cuh"

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_GELU 2

#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f

__device__ __forceinline__ float act_fwd(float z, int act) {
    if (act == ACT_RELU) {
        return z > 0.0f ? z : 0.0f;
    }
    if (act == ACT_GELU) {
        float t = tanhf(GELU_C * (z + GELU_A * z * z * z));
        return 0.5f * z * (1.0f + t);
    }
    return z;
}

// act_grad is d act / dz; for ReLU the argument is y = relu(z) or z itself
// (y > 0 exactly when z > 0), and the derivative at 0 is 0 as in PyTorch.
__device__ __forceinline__ float act_grad(float z, int act) {
    if (act == ACT_RELU) {
        return z > 0.0f ? 1.0f : 0.0f;
    }
    if (act == ACT_GELU) {
        float t = tanhf(GELU_C * (z + GELU_A * z * z * z));
        return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * z * z);
    }
    return 1.0f;
}

// bias_act finishes a GEMM whose epilogue could not be fused: for the
// row-major y[m,n] (the GEMM output, updated in place), z = y + b[j]
// (b may be NULL), aux[i,j] = z when aux is not NULL, y = act(z).
// Grid-stride over m*n elements.
extern "C" __global__ void bias_act(float* y, float* aux, const float* b,
                                    long long m, int n, int act) {
    long long total = m * (long long)n;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        float z = y[k];
        if (b != 0) {
            z += b[k % n];
        }
        if (aux != 0) {
            aux[k] = z;
        }
        y[k] = act_fwd(z, act);
    }
}

// act_bwd_colsum computes, for the row-major dy[m,n] and aux[m,n] (z for
// GELU, y or z for ReLU, unused for none), dz = dy * act'(aux), written to dz
// when dz is not NULL, and per-block column sums of dz into
// partial[blockIdx.y * n + j] when partial is not NULL.
//
// Block (32, 8): threadIdx.x picks the column j = blockIdx.x*32 + threadIdx.x
// (so a warp reads 32 consecutive floats of one row), threadIdx.y strides the
// rows [blockIdx.y*rows_per_block, +rows_per_block). The column sum is
// reduced in a fixed order (rows in order per thread, then the 8 thread rows
// in order), so the result is bitwise reproducible for a given launch shape.
// With gridDim.y == 1, partial may be db itself; otherwise colsum_final sums
// the gridDim.y partial rows.
extern "C" __global__ void act_bwd_colsum(float* dz, const float* dy, const float* aux,
                                          float* partial, int m, int n, int act,
                                          int rows_per_block) {
    __shared__ float sh[8][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    long long r0 = (long long)blockIdx.y * rows_per_block;
    long long r1 = r0 + rows_per_block;
    if (r1 > m) {
        r1 = m;
    }
    float s = 0.0f;
    if (j < n) {
        for (long long i = r0 + threadIdx.y; i < r1; i += 8) {
            long long k = i * n + j;
            float g = dy[k];
            if (act != ACT_NONE) {
                g *= act_grad(aux[k], act);
            }
            if (dz != 0) {
                dz[k] = g;
            }
            s += g;
        }
    }
    if (partial == 0) {
        return;
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        float t = 0.0f;
        for (int r = 0; r < 8; r++) {
            t += sh[r][threadIdx.x];
        }
        partial[(long long)blockIdx.y * n + j] = t;
    }
}

// colsum_final writes db[j] = sum over r in [0, rows) of partial[r*n + j],
// in order of r (deterministic).
extern "C" __global__ void colsum_final(float* db, const float* partial, int rows, int n) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) {
        return;
    }
    float s = 0.0f;
    for (int r = 0; r < rows; r++) {
        s += partial[(long long)r * n + j];
    }
    db[j] = s;
}

// cast_f32_bf16 rounds n floats to bfloat16 (round to nearest even, NaN
// stays a quiet NaN), the same rounding as tensor.BF16FromF32. bf16 is
// carried as its raw 16-bit pattern.
extern "C" __global__ void cast_f32_bf16(gpukit_bf16* out, const float* in, long long n) {
    GPUKIT_GRID_STRIDE(k, n) {
        out[k] = gpukit_f32_to_bf16(in[k]);
    }
}

// relu_mask writes the ReLU bit-mask of the row-major y[m,n] (ops.ReLUMaskCols):
// row i has ld_bytes = ceil(n/128)*16 bytes, and bit j%8 (least significant
// first) of byte [i, j/8] is 1 exactly when y[i,j] > 0; bits for j >= n are
// 0. This is the layout of cuBLASLt's RELU_AUX bit-mask for the column-major
// D = y^T (n x m) with a leading dimension of ld_bytes*8 bits, so a mask
// written here when the RELU_AUX_BIAS epilogue was not available can be
// read by a fused DRELU(_BGRAD) GEMM. One thread per byte, grid-stride.
extern "C" __global__ void relu_mask(unsigned char* mask, const float* y,
                                     long long m, int n, int ld_bytes) {
    long long total = m * (long long)ld_bytes;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        long long i = k / ld_bytes;
        int j0 = (int)(k % ld_bytes) * 8;
        unsigned int bits = 0;
        for (int b = 0; b < 8; b++) {
            int j = j0 + b;
            if (j < n && y[i * n + j] > 0.0f) {
                bits |= 1u << b;
            }
        }
        mask[k] = (unsigned char)bits;
    }
}
