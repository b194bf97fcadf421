// crossentropy.cu: softmax cross-entropy over rows of logits, forward and
// backward fused (libgpu/ops/crossentropy.go).
//
// For row r with logits x (V of them) and target t:
//
//	M = max_j x_j,  S = Σ_j exp(x_j − M),  lse = M + log S
//	rowloss_r = lse − x_t          (0 when t < 0: ignored)
//	dlogits_rj = (exp(x_j − M)/S − [j = t]) / n_valid
//
// n_valid is the number of rows with t ≥ 0, counted on the device
// (xent_count) before the main kernel, so no host sync is needed. M and S
// are found in one read of the row (an online max/sum: each thread keeps a
// running (m, s) and rescales s when m grows; the block combines the
// threads' pairs), the gradient in a second read and one write. The mean
// loss is summed by the last block to finish (a ticket on a device
// counter) over the per-row losses in row order, in double: bitwise
// reproducible, no float atomics.
//
// A target ≥ V cannot be reported from the GPU: the row's loss is NaN (so
// is the mean) and its gradient has no one-hot term. Two-dtype kernels are
// named <kernel>_<logits>_<dlogits>.
#include "common.cuh"

#define XENT_LOG2E 1.4426950408889634f
#define XENT_NEG_INF (-__int_as_float(0x7f800000))

// xent_count: state[0] = 0 (the ticket counter of the main kernel) and
// state[1] = the number of targets ≥ 0. One block of 1024 threads.
extern "C" __global__ void __launch_bounds__(1024) xent_count(unsigned int* state, const int* targets, int n) {
  __shared__ int sh[32];
  int cnt = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) cnt += targets[i] >= 0;
  for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = cnt;
  __syncthreads();
  if (threadIdx.x < 32) {
    int t = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (threadIdx.x == 0) {
      state[0] = 0u;
      state[1] = (unsigned int)t;
    }
  }
}

// xent_upd folds value x into the running (m, s). −∞ contributes nothing
// (and never meets m = −∞ in a subtraction).
__device__ __forceinline__ void xent_upd(float& m, float& s, float x) {
  if (x > m) {
    s = s * exp2f((m - x) * XENT_LOG2E) + 1.0f;
    m = x;
  } else if (x != XENT_NEG_INF) {
    s += exp2f((x - m) * XENT_LOG2E);
  }
}

// xent_upd_vec folds W values whose maximum is lm into (m, s) with one
// rescale.
template <int W>
__device__ __forceinline__ void xent_upd_vec(float& m, float& s, const float* x) {
  float lm = x[0];
#pragma unroll
  for (int i = 1; i < W; i++) lm = fmaxf(lm, x[i]);
  if (lm == XENT_NEG_INF) return;
  if (lm > m) {
    s *= exp2f((m - lm) * XENT_LOG2E);
    m = lm;
  }
#pragma unroll
  for (int i = 0; i < W; i++) s += exp2f((x[i] - m) * XENT_LOG2E);
}

// Vectors: 16 bytes of T, unpacked to f32.
template <typename T>
struct XentVec;
template <>
struct XentVec<float> {
  static const int W = 4;
  static __device__ __forceinline__ void unpack(uint4 u, float* v) {
    v[0] = __uint_as_float(u.x);
    v[1] = __uint_as_float(u.y);
    v[2] = __uint_as_float(u.z);
    v[3] = __uint_as_float(u.w);
  }
  static __device__ __forceinline__ uint4 pack(const float* v) {
    uint4 u;
    u.x = __float_as_uint(v[0]);
    u.y = __float_as_uint(v[1]);
    u.z = __float_as_uint(v[2]);
    u.w = __float_as_uint(v[3]);
    return u;
  }
};
template <>
struct XentVec<gpukit_bf16> {
  static const int W = 8;
  static __device__ __forceinline__ void unpack(uint4 u, float* v) {
    unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  static __device__ __forceinline__ unsigned int pair(float a, float b) {
    return (unsigned int)gpukit_f32_to_bf16(a) | ((unsigned int)gpukit_f32_to_bf16(b) << 16);
  }
  static __device__ __forceinline__ uint4 pack(const float* v) {
    uint4 u;
    u.x = pair(v[0], v[1]);
    u.y = pair(v[2], v[3]);
    u.z = pair(v[4], v[5]);
    u.w = pair(v[6], v[7]);
    return u;
  }
};

// xent_head is the number of elements of T before the first 16-byte
// boundary at or after p (at most n).
template <typename T>
__device__ __forceinline__ int xent_head(const T* p, int n) {
  unsigned int mis = (unsigned int)((unsigned long long)p & 15ull);
  int h = (int)(((16u - mis) & 15u) / sizeof(T));
  return min(h, n);
}

// xent_grad_at is element j's gradient (see the top), added to old when acc.
__device__ __forceinline__ float xent_grad_at(float x, int j, float mx, float scale, int t, float invn) {
  float g = exp2f((x - mx) * XENT_LOG2E) * scale;
  return j == t ? g - invn : g;
}

// xent_finish: after every block has written its rows' losses, the last
// block to take a ticket sums rowloss[0, n) in row order (in double) and
// writes loss[0] = sum / n_valid (0 when no row is valid). Called by every
// thread of every block.
__device__ void xent_finish(float* loss, const float* rowloss, unsigned int* state, int n) {
  __shared__ bool last;
  __shared__ double dsh[32];
  __threadfence();  // this block's rowloss writes before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&state[0], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  const volatile float* rl = rowloss;
  double t = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) t += (double)rl[i];
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if ((threadIdx.x & 31) == 0) dsh[threadIdx.x >> 5] = t;
  __syncthreads();
  if (threadIdx.x < 32) {
    double u = threadIdx.x < (blockDim.x >> 5) ? dsh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
    if (threadIdx.x == 0) {
      unsigned int nv = state[1];
      loss[0] = nv == 0 ? 0.0f : (float)(u / (double)nv);
      state[0] = 0u;
    }
  }
}

// xent_rows: one block per row (blockDim.x a multiple of 32, ≤ 1024:
// launch bounds keep registers within what 1024 threads may have),
// 16-byte vector loads from each row's first 16-byte boundary on, the
// elements before it and after the last whole vector one by one.
//
// logits x [n, V] with row stride ldx; targets [n]; rowloss [n] (scratch
// of the mean, or the caller's per-row output); dl (null: no gradient)
// [n, V] with row stride ldg, written, or added to when acc; loss (null:
// per-row only, no ticket) the mean; state from xent_count.
template <typename TX, typename TG>
__device__ void xent_rows(float* loss, float* rowloss, TG* dl, long long ldg, const TX* x, long long ldx,
                          const int* targets, int n, int V, unsigned int* state, int acc) {
  typedef XentVec<TX> VX;
  const int W = VX::W;
  __shared__ float sh[32];
  int row = blockIdx.x;
  const TX* xr = x + (long long)row * ldx;
  int head = xent_head(xr, V);
  int nv = (V - head) / W;
  int tail = head + nv * W;
  const uint4* xv = reinterpret_cast<const uint4*>(xr + head);
  int tid = threadIdx.x, bs = blockDim.x;
  // The target's logit is read before the first barrier (in gpukit_blk_max),
  // so dl may be x itself: every element is read before any is written.
  int t = targets[row];
  float xt = 0.0f;
  if (tid == 0 && t >= 0 && t < V) xt = gpukit_ld(xr + t);

  // Pass 1: online max and sum.
  float m = XENT_NEG_INF, s = 0.0f;
  for (int j = tid; j < head; j += bs) xent_upd(m, s, gpukit_ld(xr + j));
  for (int j = tail + tid; j < V; j += bs) xent_upd(m, s, gpukit_ld(xr + j));
  int k = tid;
  for (; k + 3 * bs < nv; k += 4 * bs) {
    uint4 u0 = xv[k], u1 = xv[k + bs], u2 = xv[k + 2 * bs], u3 = xv[k + 3 * bs];
    float f[W];
    VX::unpack(u0, f);
    xent_upd_vec<W>(m, s, f);
    VX::unpack(u1, f);
    xent_upd_vec<W>(m, s, f);
    VX::unpack(u2, f);
    xent_upd_vec<W>(m, s, f);
    VX::unpack(u3, f);
    xent_upd_vec<W>(m, s, f);
  }
  for (; k < nv; k += bs) {
    float f[W];
    VX::unpack(xv[k], f);
    xent_upd_vec<W>(m, s, f);
  }
  float mx = gpukit_blk_max(m, sh);
  s = m == XENT_NEG_INF ? 0.0f : s * exp2f((m - mx) * XENT_LOG2E);
  float S = gpukit_blk_sum(s, sh);

  if (tid == 0) {
    float l = 0.0f;
    if (t >= V) {
      l = __int_as_float(0x7fffffff);
    } else if (t >= 0) {
      l = (mx - xt) + logf(S);
    }
    rowloss[row] = l;
  }
  if (dl != 0) {
    TG* gr = dl + (long long)row * ldg;
    if (t < 0) {
      if (!acc) {
        for (int j = tid; j < V; j += bs) gpukit_st(gr + j, 0.0f);
      }
    } else {
      unsigned int nvalid = state[1];
      float invn = 1.0f / (float)nvalid;
      float scale = invn / S;
      for (int j = tid; j < head; j += bs) {
        float g = xent_grad_at(gpukit_ld(xr + j), j, mx, scale, t, invn);
        gpukit_st(gr + j, acc ? gpukit_ld(gr + j) + g : g);
      }
      for (int j = tail + tid; j < V; j += bs) {
        float g = xent_grad_at(gpukit_ld(xr + j), j, mx, scale, t, invn);
        gpukit_st(gr + j, acc ? gpukit_ld(gr + j) + g : g);
      }
      // Vector stores when dl has TX's type and dl's row is 16-byte
      // aligned where x's vectors start (the same layout: the usual case).
      bool gvec = sizeof(TG) == sizeof(TX) && ((unsigned long long)(gr + head) & 15ull) == 0;
      uint4* gv = reinterpret_cast<uint4*>(gr + head);
      for (k = tid; k < nv; k += bs) {
        float f[W];
        VX::unpack(xv[k], f);
        int j0 = head + k * W;
#pragma unroll
        for (int i = 0; i < W; i++) f[i] = xent_grad_at(f[i], j0 + i, mx, scale, t, invn);
        if (gvec) {
          if (acc) {
            float o[W];
            VX::unpack(gv[k], o);
#pragma unroll
            for (int i = 0; i < W; i++) f[i] += o[i];
          }
          gv[k] = VX::pack(f);
        } else {
#pragma unroll
          for (int i = 0; i < W; i++) gpukit_st(gr + j0 + i, acc ? gpukit_ld(gr + j0 + i) + f[i] : f[i]);
        }
      }
    }
  }
  if (loss != 0) xent_finish(loss, rowloss, state, n);
}

// xent_warp: one warp per row (8 rows a block of 256 threads), for
// V ≤ 1024: element loads, lane j reading j, j+32, ... (coalesced).
// Arguments as xent_rows.
template <typename TX, typename TG>
__device__ void xent_warp(float* loss, float* rowloss, TG* dl, long long ldg, const TX* x, long long ldx,
                          const int* targets, int n, int V, unsigned int* state, int acc) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row < n) {
    const TX* xr = x + (long long)row * ldx;
    int t = targets[row];
    float xt = 0.0f;
    if (lane == 0 && t >= 0 && t < V) xt = gpukit_ld(xr + t);  // before the shuffles: dl may be x
    float m = XENT_NEG_INF, s = 0.0f;
    for (int j = lane; j < V; j += 32) xent_upd(m, s, gpukit_ld(xr + j));
    float mx = gpukit_warp_max(m);
    s = m == XENT_NEG_INF ? 0.0f : s * exp2f((m - mx) * XENT_LOG2E);
    float S = gpukit_warp_sum(s);
    if (lane == 0) {
      float l = 0.0f;
      if (t >= V) {
        l = __int_as_float(0x7fffffff);
      } else if (t >= 0) {
        l = (mx - xt) + logf(S);
      }
      rowloss[row] = l;
    }
    if (dl != 0) {
      TG* gr = dl + (long long)row * ldg;
      if (t < 0) {
        if (!acc) {
          for (int j = lane; j < V; j += 32) gpukit_st(gr + j, 0.0f);
        }
      } else {
        float invn = 1.0f / (float)state[1];
        float scale = invn / S;
        for (int j = lane; j < V; j += 32) {
          float g = xent_grad_at(gpukit_ld(xr + j), j, mx, scale, t, invn);
          gpukit_st(gr + j, acc ? gpukit_ld(gr + j) + g : g);
        }
      }
    }
  }
  if (loss != 0) xent_finish(loss, rowloss, state, n);
}

#define XENT(SUF, TX, TG)                                                                                 \
  extern "C" __global__ void __launch_bounds__(1024) xent_rows_##SUF(float* loss, float* rowloss, TG* dl, long long ldg,          \
                                             const TX* x, long long ldx, const int* targets, int n, int V, \
                                             unsigned int* state, int acc) {                              \
    xent_rows<TX, TG>(loss, rowloss, dl, ldg, x, ldx, targets, n, V, state, acc);                         \
  }                                                                                                       \
  extern "C" __global__ void xent_warp_##SUF(float* loss, float* rowloss, TG* dl, long long ldg,          \
                                             const TX* x, long long ldx, const int* targets, int n, int V, \
                                             unsigned int* state, int acc) {                              \
    xent_warp<TX, TG>(loss, rowloss, dl, ldg, x, ldx, targets, n, V, state, acc);                         \
  }
XENT(f32_f32, float, float)
XENT(f32_bf16, float, gpukit_bf16)
XENT(bf16_f32, gpukit_bf16, float)
XENT(bf16_bf16, gpukit_bf16, gpukit_bf16)
