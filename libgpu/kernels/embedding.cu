// embedding.cu: the embedding family (libgpu/ops/embedding.go): a row
// gather for the forward and a deterministic scatter-add for the backward.
//
// Two-dtype kernels are named <kernel>_<a>_<b> with the dtypes of their two
// float operands in the order the name gives (embed_fwd_<table>_<y>,
// embed_bwd_chunk_<dy>_<dtable>).
//
// The backward (dtable[v] += Σ_{n: idx[n] = v} dy[n]) uses no float
// atomics: the indices are sorted (a stable LSD radix sort of the keys,
// 8 bits a pass, the position n riding along as the value), so the rows of
// dy that add into one row of dtable are adjacent and in increasing n. The
// sorted positions are cut into chunks of EMB_P; each (chunk, column block)
// sums the runs of equal keys inside it in position order (embed_bwd_chunk)
// and writes a run that lies wholly in the chunk straight into dtable, and
// the part of a run that crosses a chunk boundary into a per-chunk partial;
// embed_bwd_span then adds the partials of each crossing run in chunk order.
// Every row of dtable has exactly one writer, and every sum a fixed order,
// so the result is bitwise reproducible.
#include "common.cuh"

// EMB_TILE keys per radix-sort block (EMB_SORT_THREADS threads, EMB_TILE /
// EMB_SORT_THREADS rounds); EMB_P sorted positions per backward chunk.
#define EMB_SORT_THREADS 256
#define EMB_TILE 1024
#define EMB_P 32

// ---- vector loads and stores of 4 consecutive elements (f32 or bf16) ----

__device__ __forceinline__ void emb_ld4(const float* p, float* v) {
  float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}
__device__ __forceinline__ void emb_ld4(const gpukit_bf16* p, float* v) {
  uint2 t = *reinterpret_cast<const uint2*>(p);
  v[0] = __uint_as_float(t.x << 16);
  v[1] = __uint_as_float(t.x & 0xffff0000u);
  v[2] = __uint_as_float(t.y << 16);
  v[3] = __uint_as_float(t.y & 0xffff0000u);
}
__device__ __forceinline__ void emb_st4(float* p, const float* v) {
  float4 t;
  t.x = v[0];
  t.y = v[1];
  t.z = v[2];
  t.w = v[3];
  *reinterpret_cast<float4*>(p) = t;
}
__device__ __forceinline__ void emb_st4(gpukit_bf16* p, const float* v) {
  uint2 t;
  t.x = (unsigned int)gpukit_f32_to_bf16(v[0]) | ((unsigned int)gpukit_f32_to_bf16(v[1]) << 16);
  t.y = (unsigned int)gpukit_f32_to_bf16(v[2]) | ((unsigned int)gpukit_f32_to_bf16(v[3]) << 16);
  *reinterpret_cast<uint2*>(p) = t;
}

// emb_ldv/emb_stv move VEC (1 or 4) consecutive elements; with VEC 4 the
// address must be aligned to 4 elements (checked by the launcher).
template <int VEC, typename T>
__device__ __forceinline__ void emb_ldv(const T* p, float* v) {
  if (VEC == 4) {
    emb_ld4(p, v);
  } else {
    v[0] = gpukit_ld(p);
  }
}
template <int VEC, typename T>
__device__ __forceinline__ void emb_stv(T* p, const float* v) {
  if (VEC == 4) {
    emb_st4(p, v);
  } else {
    gpukit_st(p, v[0]);
  }
}

// ---- forward ----

// embed_fwd: y[r, :] = table[idx[r], :] for r in [0, n), or zeros when
// idx[r] is outside [0, vocab) (the host backend reports such an index as
// ops.ErrLabel; the GPU cannot, so it reads nothing out of bounds and
// writes a zero row). table is [vocab, c] contiguous, y has row stride ldy.
// Block (32, 8): 8 rows a block, a warp per row, VEC columns a thread.
template <int VEC, typename TT, typename TY>
__device__ void embed_fwd(TY* y, const TT* table, const int* idx, long long n, int c, long long ldy,
                          int vocab) {
  for (long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y; r < n;
       r += (long long)gridDim.x * blockDim.y) {
    int k = idx[r];
    bool ok = k >= 0 && k < vocab;
    const TT* src = table + (long long)(ok ? k : 0) * c;
    TY* dst = y + r * ldy;
    for (int j = threadIdx.x * VEC; j < c; j += 32 * VEC) {
      float v[VEC];
      if (ok) {
        emb_ldv<VEC>(src + j, v);
      } else {
        for (int i = 0; i < VEC; i++) v[i] = 0.0f;
      }
      emb_stv<VEC>(dst + j, v);
    }
  }
}

#define EMB_FWD(NAME, TT, TY)                                                                  \
  extern "C" __global__ void NAME(TY* y, const TT* table, const int* idx, long long n, int c, \
                                  long long ldy, int vocab, int vec) {                         \
    if (vec == 4) {                                                                            \
      embed_fwd<4>(y, table, idx, n, c, ldy, vocab);                                           \
    } else {                                                                                   \
      embed_fwd<1>(y, table, idx, n, c, ldy, vocab);                                           \
    }                                                                                          \
  }
EMB_FWD(embed_fwd_f32_f32, float, float)
EMB_FWD(embed_fwd_f32_bf16, float, gpukit_bf16)
EMB_FWD(embed_fwd_bf16_f32, gpukit_bf16, float)
EMB_FWD(embed_fwd_bf16_bf16, gpukit_bf16, gpukit_bf16)

// ---- backward: stable radix sort of the indices ----

// emb_key is the sort key of index k: k itself, or vocab (sorting after
// every valid key) when k is outside [0, vocab).
__device__ __forceinline__ int emb_key(int k, int vocab) { return (k >= 0 && k < vocab) ? k : vocab; }

// embed_sort_hist: hist[d * tiles + t] = number of keys of tile t (EMB_TILE
// consecutive positions) whose digit (key >> shift) & 255 is d. With first,
// the keys are emb_key(idx[i]); else keys[i]. Grid: tiles blocks of
// EMB_SORT_THREADS threads.
extern "C" __global__ void embed_sort_hist(int* hist, const int* keys, const int* idx, int n, int vocab,
                                           int shift, int tiles, int first) {
  __shared__ int cnt[256];
  int t = blockIdx.x;
  cnt[threadIdx.x] = 0;
  __syncthreads();
  for (int r = 0; r < EMB_TILE / EMB_SORT_THREADS; r++) {
    int i = t * EMB_TILE + r * EMB_SORT_THREADS + threadIdx.x;
    if (i < n) {
      int key = first ? emb_key(idx[i], vocab) : keys[i];
      atomicAdd(&cnt[(key >> shift) & 255], 1);  // integer counts: order-free
    }
  }
  __syncthreads();
  hist[threadIdx.x * tiles + t] = cnt[threadIdx.x];
}

// embed_sort_scan: exclusive prefix sum of hist[0, m) in place, one block
// of 1024 threads (each scans a contiguous segment; segment totals are
// scanned through shared memory).
extern "C" __global__ void __launch_bounds__(1024) embed_sort_scan(int* hist, int m) {
  __shared__ int sh[1024];
  int per = (m + 1023) / 1024;
  int lo = min(m, (int)threadIdx.x * per), hi = min(m, lo + per);
  int s = 0;
  for (int i = lo; i < hi; i++) s += hist[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  // Hillis–Steele inclusive scan of the 1024 segment totals.
  for (int o = 1; o < 1024; o <<= 1) {
    int v = threadIdx.x >= (unsigned)o ? sh[threadIdx.x - o] : 0;
    __syncthreads();
    sh[threadIdx.x] += v;
    __syncthreads();
  }
  int run = sh[threadIdx.x] - s;  // exclusive
  for (int i = lo; i < hi; i++) {
    int v = hist[i];
    hist[i] = run;
    run += v;
  }
}

// embed_sort_scatter: the stable scatter of one radix pass. Tile t's keys
// with digit d go to outKeys/outVals from hist[d * tiles + t] (the scanned
// histogram) on, in position order: rounds of EMB_SORT_THREADS keys, each
// ranked within its warp (ballots) and across warps through
// per-warp digit counts in shared memory. With first, keys are
// emb_key(idx[i]) and values the positions i; else keys[i] and vals[i].
extern "C" __global__ void embed_sort_scatter(int* outKeys, int* outVals, const int* keys,
                                              const int* vals, const int* idx, const int* hist, int n,
                                              int vocab, int shift, int tiles, int first) {
  const int W = EMB_SORT_THREADS / 32;
  __shared__ int base[256];
  __shared__ int wcnt[W][256];
  int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  base[threadIdx.x] = hist[threadIdx.x * tiles + t];
  for (int r = 0; r < EMB_TILE / EMB_SORT_THREADS; r++) {
    int i = t * EMB_TILE + r * EMB_SORT_THREADS + threadIdx.x;
    bool ok = i < n;
    int key = 0, val = 0, d = 0;
    if (ok) {
      key = first ? emb_key(idx[i], vocab) : keys[i];
      val = first ? i : vals[i];
      d = (key >> shift) & 255;
    }
    for (int w = 0; w < W; w++) wcnt[w][threadIdx.x] = 0;
    __syncthreads();  // also orders base's first write and the last round's reads
    // peers: the lanes of this warp with a key whose digit is d (eight
    // ballots, one a bit).
    unsigned peers = __ballot_sync(0xffffffffu, ok);
#pragma unroll
    for (int b = 0; b < 8; b++) {
      bool bit = (d >> b) & 1;
      unsigned m = __ballot_sync(0xffffffffu, bit);
      peers &= bit ? m : ~m;
    }
    int below = __popc(peers & ((1u << lane) - 1u));
    if (ok && below == 0) wcnt[warp][d] = __popc(peers);
    __syncthreads();
    // Thread d turns the per-warp counts of digit d into start offsets.
    int run = base[threadIdx.x];
    for (int w = 0; w < W; w++) {
      int c = wcnt[w][threadIdx.x];
      wcnt[w][threadIdx.x] = run;
      run += c;
    }
    base[threadIdx.x] = run;
    __syncthreads();
    if (ok) {
      int pos = wcnt[warp][d] + below;
      outKeys[pos] = key;
      outVals[pos] = val;
    }
    __syncthreads();
  }
}

// ---- backward: sums of the sorted runs ----

// embed_zero_bf16: p[i] = 0 for i in [0, n) (bf16 gradients of odd size,
// which a 32-bit memset cannot clear).
extern "C" __global__ void embed_zero_bf16(gpukit_bf16* p, long long n) {
  GPUKIT_GRID_STRIDE(i, n) { p[i] = 0; }
}

// emb_add adds VEC sums into dtable's row k at column j.
template <int VEC, typename TT>
__device__ __forceinline__ void emb_add(TT* dtable, int k, int c, int j, const float* acc) {
  TT* p = dtable + (long long)k * c + j;
  float v[VEC];
  emb_ldv<VEC>(p, v);
  for (int i = 0; i < VEC; i++) v[i] += acc[i];
  emb_stv<VEC>(p, v);
}

// embed_bwd_chunk: for chunk blockIdx.x (sorted positions [p0, p0+EMB_P)
// ∩ [0, n)) and the columns of blockIdx.y (blockDim.x·VEC of them), sums
// dy[vals[p], :] over each run of equal keys in position order. A run
// that starts and ends in the chunk is added into dtable[key] (its only
// writer); the part of a run that crosses the chunk's start or end is
// written to partial[(chunk·2 + slot)·c + column], slot 0 for the chunk's
// first run, 1 for its last (embed_bwd_span adds them). Keys ≥ vocab
// (invalid indices, sorted last) are skipped. dtable was zeroed (or holds
// the gradient to add to).
template <int VEC, typename TY, typename TT>
__device__ void embed_bwd_chunk(TT* dtable, const TY* dy, long long ldy, const int* skeys, const int* svals,
                                float* partial, int n, int c, int vocab) {
  __shared__ int kk[EMB_P], vv[EMB_P];
  int chunk = blockIdx.x;
  int p0 = chunk * EMB_P, cnt = min(EMB_P, n - p0);
  if (threadIdx.x < cnt) {
    kk[threadIdx.x] = skeys[p0 + threadIdx.x];
    vv[threadIdx.x] = svals[p0 + threadIdx.x];
  }
  __syncthreads();
  int prevKey = p0 > 0 ? skeys[p0 - 1] : -1;
  int nextKey = p0 + cnt < n ? skeys[p0 + cnt] : -1;
  int j = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (j >= c) return;
  float acc[VEC];
  for (int i = 0; i < VEC; i++) acc[i] = 0.0f;
  int cur = kk[0], start = 0;
  // Rows are loaded 8 at a time so several loads are in flight.
  for (int b = 0; b < cnt; b += 8) {
    float x[8][VEC];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      int p = b + u;
      if (p < cnt && kk[p] < vocab) {
        emb_ldv<VEC>(dy + (long long)vv[p] * ldy + j, x[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
      int p = b + u;
      int k = p < cnt ? kk[p] : cur;
      if (k != cur) {
        // Flush the run [start, p) of key cur.
        if (cur < vocab) {
          bool before = start == 0 && prevKey == cur;
          if (!before) {
            emb_add<VEC>(dtable, cur, c, j, acc);
          } else {
            float* q = partial + ((long long)chunk * 2) * c + j;
            for (int i = 0; i < VEC; i++) q[i] = acc[i];
          }
        }
        cur = k;
        start = p;
        for (int i = 0; i < VEC; i++) acc[i] = 0.0f;
      }
      if (p < cnt && k < vocab) {
        for (int i = 0; i < VEC; i++) acc[i] += x[u][i];
      }
    }
  }
  // The last run [start, cnt).
  if (cur < vocab) {
    bool before = start == 0 && prevKey == cur;
    bool after = nextKey == cur;
    if (!before && !after) {
      emb_add<VEC>(dtable, cur, c, j, acc);
    } else {
      float* q = partial + ((long long)chunk * 2 + (start == 0 ? 0 : 1)) * c + j;
      for (int i = 0; i < VEC; i++) q[i] = acc[i];
    }
  }
}

// embed_bwd_span: for each run of equal keys that crosses a chunk boundary,
// the blocks of the chunk where it starts add the run's partials and add
// the total into dtable[key]; other blocks return at once. Block (32, 8):
// 32 columns (blockIdx.y picks which), and 8 lanes that each sum every 8th
// of the run's partials in chunk order, combined in lane order: a fixed
// order, so the total is reproducible. The partials are the start chunk's
// slot (1, or 0 when the run covers that chunk's start) and slot 0 of each
// later chunk up to the one where the run ends.
template <typename TT>
__device__ void embed_bwd_span(TT* dtable, const int* skeys, const float* partial, int n, int c, int vocab) {
  __shared__ float sh[8][33];
  int chunk = blockIdx.x;
  int p0 = chunk * EMB_P, last = min(p0 + EMB_P, n) - 1;
  // Independent loads, so an early exit costs one round trip.
  int k = skeys[last];
  int next = last + 1 < n ? skeys[last + 1] : -1;
  int first = skeys[p0];
  int before = p0 > 0 ? skeys[p0 - 1] : -1;
  if (k >= vocab || next != k) return;  // no run leaves this chunk
  int slot = 1;
  if (first == k) {
    if (before == k) return;  // the run started in an earlier chunk
    slot = 0;
  }
  // The run ends before lo: the first position with a key > k (binary
  // search: keys are sorted).
  int lo = last + 1, hi = n;
  while (lo < hi) {
    int mid = lo + ((hi - lo) >> 1);
    if (skeys[mid] <= k) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  int items = (lo - 1) / EMB_P - chunk + 1;  // partials: chunks chunk .. chunk+items-1
  int j = blockIdx.y * 32 + threadIdx.x;
  float s = 0.0f;
  if (j < c) {
    int i = threadIdx.y;
    if (i == 0) {
      s = partial[((long long)chunk * 2 + slot) * c + j];
      i = 8;
    }
    for (; i + 24 < items; i += 32) {
      float a0 = partial[((long long)(chunk + i) * 2) * c + j];
      float a1 = partial[((long long)(chunk + i + 8) * 2) * c + j];
      float a2 = partial[((long long)(chunk + i + 16) * 2) * c + j];
      float a3 = partial[((long long)(chunk + i + 24) * 2) * c + j];
      s += a0;
      s += a1;
      s += a2;
      s += a3;
    }
    for (; i < items; i += 8) s += partial[((long long)(chunk + i) * 2) * c + j];
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float t = sh[0][threadIdx.x];
    for (int l = 1; l < 8; l++) t += sh[l][threadIdx.x];
    TT* p = dtable + (long long)k * c + j;
    gpukit_st(p, gpukit_ld(p) + t);
  }
}

#define EMB_BWD(SUF, TY, TT)                                                                          \
  extern "C" __global__ void embed_bwd_chunk_##SUF(TT* dtable, const TY* dy, long long ldy,           \
                                                   const int* skeys, const int* svals, float* partial, \
                                                   int n, int c, int vocab, int vec) {                \
    if (vec == 4) {                                                                                   \
      embed_bwd_chunk<4>(dtable, dy, ldy, skeys, svals, partial, n, c, vocab);                        \
    } else {                                                                                          \
      embed_bwd_chunk<1>(dtable, dy, ldy, skeys, svals, partial, n, c, vocab);                        \
    }                                                                                                 \
  }
EMB_BWD(f32_f32, float, float)
EMB_BWD(f32_bf16, float, gpukit_bf16)
EMB_BWD(bf16_f32, gpukit_bf16, float)
EMB_BWD(bf16_bf16, gpukit_bf16, gpukit_bf16)

extern "C" __global__ void embed_bwd_span_f32(float* dtable, const int* skeys, const float* partial, int n,
                                              int c, int vocab) {
  embed_bwd_span<float>(dtable, skeys, partial, n, c, vocab);
}
extern "C" __global__ void embed_bwd_span_bf16(gpukit_bf16* dtable, const int* skeys, const float* partial,
                                               int n, int c, int vocab) {
  embed_bwd_span<gpukit_bf16>(dtable, skeys, partial, n, c, vocab);
}
