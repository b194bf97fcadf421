// emu.h: a host emulation of the CUDA subset gpukit's kernels use, so a
// kernel can be RUN (slowly, but faithfully in its indexing) on a machine
// without a GPU: include this header, then the .cu file, compile with a
// host C++ compiler and call emu::launch. A developer tool beside
// scripts/cuda-check.sh (which only compiles); NVRTC on a GPU machine
// remains the real compiler.
//
// Model: one block at a time; its threads are coroutines (ucontext) that
// switch at every synchronisation point (__syncthreads, shuffles,
// ldmatrix, mma, cp.async waits). The scheduler runs one warp at a time,
// in an order drawn from a seed, until all its lanes wait at __syncthreads:
// warps drift as far apart as the barriers allow, so a missing
// __syncthreads shows up as a wrong result. Warp collectives are exchanges
// through per-warp slots. Emulated instructions (the semantics of the PTX ISA):
//
//   - ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16;
//   - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (products and
//     sums in double, rounded to f32: the hardware's order differs);
//   - cp.async 16-byte copies with zero fill, commit_group and
//     wait_group 0: each copy is done either at once or at the wait
//     (chosen at random), so reading a tile before waiting, or overwriting
//     one that another warp still reads, shows up.
//
// Checks: dynamic shared memory is poisoned (0xff: NaN) at every block
// start; ldmatrix and cp.async addresses must be 16-byte aligned and
// inside the dynamic shared memory; cp.async sources inside a buffer
// registered with emu::track (the driver's global allocations); a
// deadlock (threads waiting on a barrier others never reach) aborts.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#define GPUKIT_EMU 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)
#define __restrict__ __restrict
#define ATTN_DYN_SMEM(name) unsigned char* name = emu::g.smem.data()
#define LN_DYN_SMEM(name) float* name = (float*)emu::g.smem.data()

struct emu_dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace emu {

struct Thread {
  ucontext_t ctx;
  std::vector<char> stack;
  emu_dim3 tid;
  int lane = 0, warp = 0, index = 0;
  bool done = false;
  bool at_barrier = false;  // waiting in __syncthreads for generation barrier_gen to pass
  long barrier_gen = 0;
  struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    bool zero;
  };
  std::vector<Copy> pending;  // cp.async copies not yet done
};

struct Slot {  // one lane's contribution to a warp collective
  uint32_t w[8];
  const void* p;
};

struct Global {
  emu_dim3 grid, block, bidx;
  std::vector<Thread> threads;
  std::vector<unsigned char> smem;
  Thread* cur = nullptr;
  ucontext_t sched;
  std::mt19937_64 rng{1};
  std::function<void()> body;
  // barriers: generation counters
  long blk_gen = 0;  // __syncthreads generation
  int blk_count = 0;
  std::vector<long> warp_gen;
  std::vector<int> warp_count;
  std::vector<Slot> slots;  // [warps][32]
  long progress = 0;
  std::vector<std::pair<const unsigned char*, size_t>> tracked;
};
inline Global g;

[[noreturn]] inline void fail(const char* what) {
  fprintf(stderr, "emu: %s (block %u,%u,%u thread %d)\n", what, g.bidx.x, g.bidx.y, g.bidx.z,
          g.cur ? g.cur->index : -1);
  abort();
}

inline void yield() { swapcontext(&g.cur->ctx, &g.sched); }

inline void syncthreads() {
  long gen = g.blk_gen;
  g.progress++;
  if (++g.blk_count == (int)g.threads.size()) {
    g.blk_count = 0;
    g.blk_gen++;
    return;
  }
  g.cur->at_barrier = true;
  g.cur->barrier_gen = gen;
  while (g.blk_gen == gen) yield();
  g.cur->at_barrier = false;
}

inline void warp_barrier() {
  int w = g.cur->warp;
  long gen = g.warp_gen[w];
  g.progress++;
  if (++g.warp_count[w] == 32) {
    g.warp_count[w] = 0;
    g.warp_gen[w]++;
    return;
  }
  while (g.warp_gen[w] == gen) yield();
}

inline Slot& slot(int lane) { return g.slots[g.cur->warp * 32 + lane]; }

inline void track(const void* p, size_t n) { g.tracked.push_back({(const unsigned char*)p, n}); }
inline void untrack() { g.tracked.clear(); }

inline bool in_smem(const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p;
  return c >= g.smem.data() && c + n <= g.smem.data() + g.smem.size();
}

inline void check_global(const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p;
  for (auto& t : g.tracked)
    if (c >= t.first && c + n <= t.first + t.second) return;
  fail("global access outside every tracked buffer");
}

inline void entry() {
  g.body();
  g.cur->done = true;
  g.progress++;
  swapcontext(&g.cur->ctx, &g.sched);
}

// launch runs kernel over grid × block with smem bytes of dynamic shared
// memory; seed picks the scheduling orders and cp.async timings.
inline void launch(emu_dim3 grid, emu_dim3 block, size_t smem, uint64_t seed, std::function<void()> kernel) {
  int nt = block.x * block.y * block.z;
  if (nt % 32) fail("block size not a multiple of 32");
  g.grid = grid;
  g.block = block;
  g.rng.seed(seed);
  g.body = kernel;
  g.threads.assign(nt, Thread());
  g.slots.assign(nt, Slot());
  g.warp_gen.assign(nt / 32, 0);
  g.warp_count.assign(nt / 32, 0);
  for (auto& t : g.threads) t.stack.resize(256 << 10);
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        g.bidx = {bx, by, bz};
        g.smem.assign(smem, 0xff);
        g.blk_gen = 0;
        g.blk_count = 0;
        std::fill(g.warp_gen.begin(), g.warp_gen.end(), 0);
        std::fill(g.warp_count.begin(), g.warp_count.end(), 0);
        for (int i = 0; i < nt; i++) {
          Thread& t = g.threads[i];
          t.done = false;
          t.at_barrier = false;
          t.pending.clear();
          t.index = i;
          t.tid = {(unsigned)(i % block.x), (unsigned)(i / block.x % block.y), (unsigned)(i / (block.x * block.y))};
          t.lane = i & 31;
          t.warp = i >> 5;
          getcontext(&t.ctx);
          t.ctx.uc_stack.ss_sp = t.stack.data();
          t.ctx.uc_stack.ss_size = t.stack.size();
          t.ctx.uc_link = nullptr;
          makecontext(&t.ctx, entry, 0);
        }
        // Warp by warp, in a random order: each warp runs until every lane
        // waits at __syncthreads (or is done), so warps drift as far apart
        // as the barriers allow and a missing one shows.
        std::vector<int> warps(nt / 32), lanes(32);
        for (int w = 0; w < nt / 32; w++) warps[w] = w;
        for (int i = 0; i < 32; i++) lanes[i] = i;
        for (;;) {
          std::shuffle(warps.begin(), warps.end(), g.rng);
          long before = g.progress;
          bool live = false;
          for (int w : warps) {
            for (bool ran = true; ran;) {
              ran = false;
              std::shuffle(lanes.begin(), lanes.end(), g.rng);
              for (int ln : lanes) {
                Thread& t = g.threads[w * 32 + ln];
                if (t.done || (t.at_barrier && t.barrier_gen == g.blk_gen)) continue;
                g.cur = &t;
                long p0 = g.progress;
                swapcontext(&g.sched, &t.ctx);
                g.cur = nullptr;
                ran = ran || g.progress != p0;
              }
            }
          }
          for (auto& t : g.threads) live = live || !t.done;
          if (!live) break;
          if (g.progress == before) fail("deadlock: threads wait on a barrier others never reach");
        }
      }
}

// ---- emulated instructions ----

inline uint16_t ld16(const void* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

// Shared addresses (what cvta.to.shared gives) are offsets into g.smem.
inline unsigned smem_addr(const void* p) {
  if (!in_smem(p, 0)) fail("shared address of a pointer outside shared memory");
  return (unsigned)((const unsigned char*)p - g.smem.data());
}
inline unsigned char* smem_ptr(unsigned a) {
  if (a % 16 || (size_t)a + 16 > g.smem.size()) fail("shared address unaligned or outside shared memory");
  return g.smem.data() + a;
}

inline void ldsm_x4(unsigned r[4], unsigned addr, bool trans) {
  const void* p = smem_ptr(addr);
  int lane = g.cur->lane;
  slot(lane).p = p;
  warp_barrier();
  for (int i = 0; i < 4; i++) {
    uint16_t lo, hi;
    if (!trans) {
      const unsigned char* row = (const unsigned char*)slot(8 * i + (lane >> 2)).p;
      lo = ld16(row + 2 * (2 * (lane & 3)));
      hi = ld16(row + 2 * (2 * (lane & 3) + 1));
    } else {
      const unsigned char* r0 = (const unsigned char*)slot(8 * i + 2 * (lane & 3)).p;
      const unsigned char* r1 = (const unsigned char*)slot(8 * i + 2 * (lane & 3) + 1).p;
      lo = ld16(r0 + 2 * (lane >> 2));
      hi = ld16(r1 + 2 * (lane >> 2));
    }
    r[i] = (unsigned)lo | ((unsigned)hi << 16);
  }
  warp_barrier();
}

inline double bf(uint32_t w, int half) { 
  uint32_t u = half ? (w & 0xffff0000u) : (w << 16);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline void mma16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  int lane = g.cur->lane;
  Slot& s = slot(lane);
  for (int i = 0; i < 4; i++) s.w[i] = a[i];
  s.w[4] = b0;
  s.w[5] = b1;
  warp_barrier();
  // A(row, col) and B(k, n) from the fragments (PTX ISA, "Matrix Fragments
  // for mma.m16n8k16 with floating point type").
  auto A = [](int row, int col) {
    int gq = row & 7, hi8 = row >> 3, ck = col >> 3, cc = col & 7;
    int ln = gq * 4 + (cc >> 1);
    int reg = hi8 + 2 * ck;  // a0a1: rows g, k<8; a2a3: g+8; a4a5: g, k≥8; a6a7: g+8, k≥8
    return bf(slot(ln).w[reg], cc & 1);
  };
  auto B = [](int k, int n) {
    int ln = n * 4 + ((k & 7) >> 1);
    int reg = k >> 3;
    return bf(slot(ln).w[4 + reg], k & 1);
  };
  int gq = lane >> 2, t = lane & 3;
  float d[4];
  for (int e = 0; e < 4; e++) {
    int row = gq + (e >> 1) * 8, col = 2 * t + (e & 1);
    double acc = c[e];
    for (int k = 0; k < 16; k++) acc += A(row, k) * B(k, col);
    d[e] = (float)acc;
  }
  warp_barrier();
  for (int e = 0; e < 4; e++) c[e] = d[e];
}

inline void cp16(unsigned saddr, const void* src, bool ok) {
  void* s = smem_ptr(saddr);
  if (ok) {
    if ((uintptr_t)src % 16) fail("cp.async source unaligned");
    check_global(src, 16);
  }
  Thread::Copy c{(unsigned char*)s, (const unsigned char*)src, !ok};
  if (g.rng() & 1) {
    if (c.zero)
      memset(c.dst, 0, 16);
    else
      memcpy(c.dst, c.src, 16);
  } else {
    g.cur->pending.push_back(c);
  }
}

inline void cp_wait0() {
  for (auto& c : g.cur->pending) {
    if (c.zero)
      memset(c.dst, 0, 16);
    else
      memcpy(c.dst, c.src, 16);
  }
  g.cur->pending.clear();
  g.progress++;
  yield();  // let others run between a wait and what follows
}

template <typename T>
inline T shfl(T v, int src) {
  int lane = g.cur->lane;
  uint32_t w;
  memcpy(&w, &v, 4);
  slot(lane).w[0] = w;
  warp_barrier();
  uint32_t r = slot(src & 31).w[0];
  warp_barrier();
  T out;
  memcpy(&out, &r, 4);
  return out;
}

}  // namespace emu

#define threadIdx (emu::g.cur->tid)
#define blockIdx (emu::g.bidx)
#define blockDim (emu::g.block)
#define gridDim (emu::g.grid)
#define __shared__ static

inline void __syncthreads() { emu::syncthreads(); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int m) {
  return emu::shfl(v, (emu::g.cur->lane ^ m) & 31);
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int src) {
  return emu::shfl(v, src);
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) {
  int u;
  memcpy(&u, &f, 4);
  return u;
}
inline int __ffs(int x) { return x ? __builtin_ctz((unsigned)x) + 1 : 0; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// Blocks run one at a time and threads switch only at synchronisation
// points, so atomics are plain read-modify-writes and fences do nothing.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  unsigned old = *p;
  *p = old + v;
  return old;
}
inline void __threadfence() {}
using std::max;
using std::min;

inline unsigned gpukit_emu_smem_addr(const void* p) { return emu::smem_addr(p); }
inline void gpukit_emu_ldsm_x4(unsigned r[4], unsigned addr, bool trans) { emu::ldsm_x4(r, addr, trans); }
inline void gpukit_emu_mma_bf16_16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  emu::mma16816(c, a, b0, b1);
}
inline void gpukit_emu_cp16(unsigned s, const void* src, bool ok) { emu::cp16(s, src, ok); }
inline void gpukit_emu_cp_commit() {}
inline void gpukit_emu_cp_wait0() { emu::cp_wait0(); }
