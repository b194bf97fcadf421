// ops_argmax.cu: row-wise argmax (ops.Argmax; launched by libgpu/ops/cuda_misc.go).
#include "common.cuh"

// argmax_rows: one warp per row of x[m,n] (row-major f32); out[i] (i32) is
// the first index of the row's maximum. Each lane scans j = lane, lane+32,
// ... keeping its first strict maximum; the lanes then combine pairwise,
// preferring the larger value and, on equal values, the smaller index, which
// gives the first maximum overall. Rows holding NaN give an unspecified
// index. blockDim.x is a multiple of 32.
extern "C" __global__ void argmax_rows(int* out, const float* x, int m, int n) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= m) {
        return;  // the whole warp leaves together
    }
    const float* r = x + warp * n;
    float bv = 0.0f;
    int bi = -1;
    for (int j = lane; j < n; j += 32) {
        float v = r[j];
        if (bi < 0 || v > bv) {
            bv = v;
            bi = j;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        out[warp] = bi;
    }
}
