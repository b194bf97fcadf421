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
//     wait_group N: each copy is done either at once or at the wait that
//     covers its group (chosen at random), so reading a tile before
//     waiting, or overwriting one that another warp still reads, shows up
//     (wait_group 0 also lands copies not committed yet).
//   - wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (sm_90a), A from
//     shared memory (descriptor) or registers, B from shared memory, with
//     wgmma.fence, commit_group and wait_group N: a warpgroup collective
//     (its 128 threads meet, their descriptors must agree); the product is
//     computed at the issue but lands in the accumulator registers only at
//     the thread's wait_group that retires its group. At that wait the
//     emulator checks that the accumulators were not written meanwhile,
//     that the thread's A registers (register-A form) still hold what was
//     issued, and that the shared memory the product read is unchanged. Only
//     the 128-byte swizzle with the repeating pattern on 1024-byte boundaries
//     (descriptor base offset 0) is modelled: K-major and MN-major operands
//     in the canonical layouts of the PTX ISA ("Asynchronous Warpgroup Level
//     Matrix Shared Memory Layout"; CUTLASS's make_gmma_desc states the same
//     in units of 16 bytes: K-major ((8,m),(8,2)):((8,SBO),(1,LBO)) and
//     MN-major ((8,n),(8,k)):((1,LBO),(8,SBO)), rows of 128 bytes), the
//     swizzle XORing byte-address bits [4,7) with bits [7,10) of the
//     absolute shared address.
//   - fence.proxy.async.shared::cta: shared memory written by cp.async is
//     marked as written by its thread through the generic proxy until that
//     thread's next proxy fence after the copy landed; a wgmma that reads
//     such bytes fails (HOPPER.md: the tensor cores read through the async
//     proxy).
//
//   - bar.sync / bar.arrive with a barrier id and a thread count (named
//     barriers: one warpgroup signalling another);
//   - mbarrier.init, arrive and try_wait.parity (the mbarrier object is
//     the 8 bytes at its shared address, modelled beside them: pending
//     arrivals, pending transaction bytes and completed phases),
//     mbarrier.arrive.expect_tx, and TMA's tensor copies
//     (cp.async.bulk.tensor, kernels/tma.cuh: a 2-D tile and a 4-D im2col
//     gather, both 128-byte swizzled, from a tensor map made by
//     emu::tmap_tiled / emu::tmap_im2col), which land, and complete their
//     bytes on the barrier, at a random later round like the cp.async
//     arrivals below, and
//     cp.async.mbarrier.arrive.noinc: the thread's cp.async copies issued
//     so far land, and then count as one arrival, at a random later
//     scheduling round (never before), so a consumer that reads a tile
//     without waiting on its barrier, or a producer that refills a buffer
//     a consumer has not released, shows up. Bytes landed that way count
//     as fenced by a thread that saw the phase complete (try_wait) and
//     then ran fence.proxy.async.
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
  bool parked = false;      // sits out the rest of this scheduling round (mbar_arrive)
  bool at_barrier = false;  // waiting in __syncthreads for generation barrier_gen to pass
  long barrier_gen = 0;
  struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    bool zero;
    long group;  // the commit group it belongs to (cp_group when issued)
  };
  std::vector<Copy> pending;  // cp.async copies not yet done
  long cp_group = 0;          // the open (uncommitted) cp.async group's number
  std::vector<unsigned> fresh;  // shared offsets of landed copies not yet behind a proxy fence
  struct WgOp {  // an issued wgmma.mma_async not yet retired by wait_group
    float* d;
    int n;  // accumulator registers of this thread: N/2
    long group;
    bool chained;  // an earlier pending op of this thread writes the same d
    float before[128], result[128];
    const unsigned* areg;  // register-A form: this thread's A registers
    unsigned asnap[4];
    uint64_t da, db, hash;
    int trans_a, trans_b, N;
  };
  std::vector<WgOp> wg;  // pending wgmma ops, in issue order
  long wg_group = 0;     // the open (uncommitted) group's number
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
  std::vector<long> wg_gen;   // warpgroup barriers (wgmma)
  std::vector<int> wg_count;
  std::vector<uint16_t> owner;  // per shared byte: 1 + the thread whose cp.async wrote it, not yet fenced
  long progress = 0;
  std::vector<std::pair<const unsigned char*, size_t>> tracked;
  // named barriers (bar.sync / bar.arrive id, count)
  long bar_gen[16] = {};
  int bar_count[16] = {};
  // mbarriers by shared address
  struct MBar {
    int expected = 0, pending = 0;
    long tx = 0;                      // transaction bytes expected and not yet landed (may be < 0)
    unsigned phase = 0;               // completed phases
    std::vector<unsigned> landed[2];  // offsets landed by deferred copies in the phase of each parity
  };
  std::vector<std::pair<unsigned, MBar>> mbars;
  struct Deferred {  // cp.async.mbarrier.arrive.noinc: copies to land, then an arrival
    std::vector<Thread::Copy> copies;
    unsigned mbar;
    std::vector<unsigned> early;  // the thread's copies that had landed already, unfenced
    long tx = 0;                  // > 0: a TMA copy, completing tx bytes instead of arriving
  };
  std::vector<Deferred> deferred;
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

inline Global::MBar& mbar(unsigned addr) {
  for (auto& m : g.mbars)
    if (m.first == addr) return m.second;
  fail("mbarrier used before mbarrier.init");
}

// mbar_complete ends m's phase once its arrivals and transaction bytes are
// all in.
inline void mbar_complete(Global::MBar& m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase++;
    m.pending = m.expected;
    m.landed[m.phase & 1].clear();  // the phase now starting
  }
}

// mbar_arrive counts one arrival on the mbarrier at addr (with expect_tx,
// after adding tx transaction bytes); the last one of a phase completes it
// once its bytes have landed.
inline void mbar_arrive(unsigned addr, long tx = 0) {
  Global::MBar& m = mbar(addr);
  if (m.pending <= 0) fail("mbarrier arrival beyond its count");
  g.progress++;
  m.tx += tx;
  --m.pending;
  mbar_complete(m);
  // The arriving thread sits out the rest of the scheduling round, so the
  // other warps (a producer waiting on this barrier) run and deferred
  // copies may land before it goes on: an arrival made before the reads it
  // releases are done (a wgmma still in flight) then shows up as the
  // buffer changing under that wgmma, which its wait reports.
  if (g.cur) {
    g.cur->parked = true;
    yield();
  }
}

// land_deferred performs cp.async.mbarrier.arrive.noinc's work, in issue
// order: each pending entry's copies land and its arrival counts, each with
// probability 1/2 a round (all of them when nothing else progressed).
inline void land_deferred(bool all) {
  std::vector<Global::Deferred> keep;
  for (auto& d : g.deferred) {
    if (!all && (g.rng() & 1)) {
      keep.push_back(d);
      continue;
    }
    Global::MBar& m = mbar(d.mbar);
    for (unsigned off : d.early) m.landed[m.phase & 1].push_back(off);
    for (auto& c : d.copies) {
      if (c.zero)
        memset(c.dst, 0, 16);
      else
        memcpy(c.dst, c.src, 16);
      unsigned off = (unsigned)(c.dst - g.smem.data());
      for (int i = 0; i < 16; i++) g.owner[off + i] = 0xffff;  // unfenced, landed through an mbarrier
      m.landed[m.phase & 1].push_back(off);
    }
    if (d.tx > 0) {
      g.progress++;
      m.tx -= d.tx;
      mbar_complete(m);
      continue;
    }
    mbar_arrive(d.mbar);
  }
  g.deferred.swap(keep);
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
  g.wg_gen.assign((nt + 127) / 128, 0);
  g.wg_count.assign((nt + 127) / 128, 0);
  for (auto& t : g.threads) t.stack.resize(256 << 10);
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        g.bidx = {bx, by, bz};
        g.smem.assign(smem, 0xff);
        g.owner.assign(smem, 0);
        g.blk_gen = 0;
        g.blk_count = 0;
        std::fill(g.warp_gen.begin(), g.warp_gen.end(), 0);
        std::fill(g.warp_count.begin(), g.warp_count.end(), 0);
        std::fill(g.wg_gen.begin(), g.wg_gen.end(), 0);
        std::fill(g.wg_count.begin(), g.wg_count.end(), 0);
        std::fill(g.bar_gen, g.bar_gen + 16, 0);
        std::fill(g.bar_count, g.bar_count + 16, 0);
        g.mbars.clear();
        g.deferred.clear();
        for (int i = 0; i < nt; i++) {
          Thread& t = g.threads[i];
          t.done = false;
          t.at_barrier = false;
          t.parked = false;
          t.pending.clear();
          t.fresh.clear();
          t.wg.clear();
          t.wg_group = 0;
          t.cp_group = 0;
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
                if (t.done || t.parked || (t.at_barrier && t.barrier_gen == g.blk_gen)) continue;
                g.cur = &t;
                long p0 = g.progress;
                swapcontext(&g.sched, &t.ctx);
                g.cur = nullptr;
                ran = ran || g.progress != p0;
              }
            }
          }
          for (auto& t : g.threads) t.parked = false;
          land_deferred(g.progress == before);
          for (auto& t : g.threads) live = live || !t.done;
          if (!live) {
            for (auto& t : g.threads)
              if (!t.wg.empty()) fail("thread ended with a wgmma.mma_async not retired by wgmma.wait_group");
            break;
          }
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

// land performs a cp.async copy and marks its bytes as written through
// the generic proxy by the current thread (see fence_proxy_async).
inline void land(const Thread::Copy& c) {
  if (c.zero)
    memset(c.dst, 0, 16);
  else
    memcpy(c.dst, c.src, 16);
  unsigned off = (unsigned)(c.dst - g.smem.data());
  for (int i = 0; i < 16; i++) g.owner[off + i] = (uint16_t)(g.cur->index + 1);
  g.cur->fresh.push_back(off);
}

inline void cp16(unsigned saddr, const void* src, bool ok) {
  void* s = smem_ptr(saddr);
  if (ok) {
    if ((uintptr_t)src % 16) fail("cp.async source unaligned");
    check_global(src, 16);
  }
  Thread::Copy c{(unsigned char*)s, (const unsigned char*)src, !ok, g.cur->cp_group};
  if (g.rng() & 1) {
    land(c);
  } else {
    g.cur->pending.push_back(c);
  }
}

inline void cp_wait0() {
  for (auto& c : g.cur->pending) land(c);
  g.cur->pending.clear();
  g.progress++;
  yield();  // let others run between a wait and what follows
}

inline void cp_commit() { g.cur->cp_group++; }

// cp_wait lands this thread's copies of every committed group but the n
// most recent (cp.async.wait_group n).
inline void cp_wait(int n) {
  std::vector<Thread::Copy> keep;
  for (auto& c : g.cur->pending) {
    if (c.group < g.cur->cp_group - n)
      land(c);
    else
      keep.push_back(c);
  }
  g.cur->pending.swap(keep);
  g.progress++;
  yield();
}

// fence_proxy_async (fence.proxy.async.shared::cta): the copies this
// thread has landed so far, and those landed through an mbarrier phase it
// has seen complete, become visible to the async proxy (wgmma).
inline void fence_proxy_async() {
  uint16_t me = (uint16_t)(g.cur->index + 1);
  for (unsigned off : g.cur->fresh)
    for (int i = 0; i < 16; i++)
      if (g.owner[off + i] == me || g.owner[off + i] == 0xffff) g.owner[off + i] = 0;
  g.cur->fresh.clear();
  g.progress++;
  yield();
}

// bar_sync / bar_arrive: named barrier id (0-15) of count threads (a
// multiple of 32): bar.sync arrives and waits for the count to be reached,
// bar.arrive only arrives.
inline void bar_arrive_n(int id, int count, bool wait) {
  if (id < 0 || id > 15 || count <= 0 || count % 32 || count > (int)g.threads.size()) fail("named barrier id or count");
  long gen = g.bar_gen[id];
  g.progress++;
  if (++g.bar_count[id] == count) {
    g.bar_count[id] = 0;
    g.bar_gen[id]++;
    return;
  }
  if (!wait) return;
  while (g.bar_gen[id] == gen) yield();
}

// mbar_init (mbarrier.init.shared::cta.b64): count arrivals a phase.
inline void mbar_init(unsigned addr, int count) {
  if (addr % 8 || (size_t)addr + 8 > g.smem.size()) fail("mbarrier address unaligned or outside shared memory");
  if (count <= 0) fail("mbarrier count");
  for (auto& m : g.mbars)
    if (m.first == addr) {
      m.second = Global::MBar{};
      m.second.expected = m.second.pending = count;
      return;
    }
  Global::MBar m;
  m.expected = m.pending = count;
  g.mbars.push_back({addr, m});
}

// mbar_try_wait (mbarrier.try_wait.parity): whether the phase of that
// parity has completed; when it has, the bytes landed in it through
// cp.async.mbarrier.arrive.noinc join this thread's unfenced copies.
inline bool mbar_try_wait(unsigned addr, unsigned parity) {
  Global::MBar& m = mbar(addr);
  if ((m.phase & 1) == (parity & 1)) {
    yield();
    return false;
  }
  for (unsigned off : m.landed[parity & 1]) g.cur->fresh.push_back(off);
  g.progress++;
  return true;
}

// A tensor map as the emulator reads it (in the 128 bytes of a
// gpukit_tmap): emu::tmap_tiled and emu::tmap_im2col write it, the TMA
// copies below read it. Only what kernels/tma.cuh's copies use: bf16
// elements, 128-byte swizzle, rows of 128 bytes.
struct Tmap {
  const unsigned char* base;
  int64_t dims[4];     // innermost first
  int64_t strides[4];  // bytes; strides[0] = 2
  int box0, box1;      // tiled: the box (elements innermost, rows)
  int lower[2], upper[2], elem[4];  // im2col: W, H corners; traversal strides
  int channels, pixels;
};
static_assert(sizeof(Tmap) <= 128, "emu::Tmap must fit a CUtensorMap");

// tmap_tiled describes a 2-D bf16 tensor [rows, cols] (row stride in
// elements) for tiled copies of box (cols_box ≤ 64, rows_box) boxes.
inline void tmap_tiled(void* map, const void* base, int64_t cols, int64_t rows, int64_t stride, int cols_box, int rows_box) {
  Tmap t{};
  t.base = (const unsigned char*)base;
  t.dims[0] = cols;
  t.dims[1] = rows;
  t.strides[0] = 2;
  t.strides[1] = 2 * stride;
  t.box0 = cols_box;
  t.box1 = rows_box;
  memcpy(map, &t, sizeof t);
}

// tmap_im2col describes a bf16 NHWC tensor for im2col copies (the
// arguments of cuTensorMapEncodeIm2col, W before H).
inline void tmap_im2col(void* map, const void* base, int n, int h, int w, int c, int lower_w, int lower_h, int upper_w,
                        int upper_h, int channels, int pixels, int stride_w, int stride_h) {
  Tmap t{};
  t.base = (const unsigned char*)base;
  t.dims[0] = c;
  t.dims[1] = w;
  t.dims[2] = h;
  t.dims[3] = n;
  t.strides[0] = 2;
  t.strides[1] = 2LL * c;
  t.strides[2] = 2LL * c * w;
  t.strides[3] = 2LL * c * w * h;
  t.lower[0] = lower_w;
  t.lower[1] = lower_h;
  t.upper[0] = upper_w;
  t.upper[1] = upper_h;
  t.elem[0] = 1;
  t.elem[1] = stride_w;
  t.elem[2] = stride_h;
  t.elem[3] = 1;
  t.channels = channels;
  t.pixels = pixels;
  memcpy(map, &t, sizeof t);
}

// tma_queue queues a TMA copy's 16-byte chunks (src null: zeros) into
// shared memory at dst + row·128 with the 128-byte swizzle, completing
// their bytes on the mbarrier at bar at a later round.
inline void tma_queue(unsigned bar, std::vector<Thread::Copy>& copies, long bytes) {
  mbar(bar);
  Global::Deferred d{{}, bar, {}};
  d.copies.swap(copies);
  d.tx = bytes;
  g.deferred.push_back(d);
  g.progress++;
}

inline unsigned char* tma_dst(unsigned dst, int row, int chunk) {
  unsigned off = dst + row * 128 + ((chunk ^ (row & 7)) << 4);
  if (dst % 1024 || !in_smem(g.smem.data() + off, 16)) fail("TMA destination unaligned (128-byte swizzle: 1024) or outside shared memory");
  return g.smem.data() + off;
}

// tma_tile_2d: cp.async.bulk.tensor.2d ... .tile of the box at element
// (x, y) of the map into dst; chunks outside the tensor read zeros.
inline void tma_tile_2d(unsigned dst, const void* map, unsigned bar, int x, int y) {
  Tmap t;
  memcpy(&t, map, sizeof t);
  if (t.box0 * 2 != 128 || x % 8) fail("emulated TMA tile: rows of 128 bytes at 16-byte boundaries only");
  std::vector<Thread::Copy> cs;
  for (int r = 0; r < t.box1; r++)
    for (int c = 0; c < 8; c++) {
      const int64_t col = x + 8 * c, row = y + r;
      const bool in = col >= 0 && col + 8 <= t.dims[0] && row >= 0 && row < t.dims[1];
      if (!in && col < t.dims[0] && col + 8 > t.dims[0]) fail("emulated TMA tile: a chunk straddles the tensor's edge");
      const unsigned char* src = in ? t.base + row * t.strides[1] + col * 2 : nullptr;
      if (src) check_global(src, 16);
      cs.push_back({tma_dst(dst, r, c), src, !in, 0});
    }
  tma_queue(bar, cs, (long)t.box1 * 128);
}

// tma_im2col_4d: cp.async.bulk.tensor.4d ... .im2col: t.pixels pixels from
// the base position (w, h, n), walking W by its traversal stride within
// the bounding box [lower, dim − 1 + upper], then H, then N, each pixel's
// channels c.. read at (w + ow, h + oh, n) (zeros outside the tensor) into
// a 128-byte row of dst.
inline void tma_im2col_4d(unsigned dst, const void* map, unsigned bar, int c, int w, int h, int n, int ow, int oh) {
  Tmap t;
  memcpy(&t, map, sizeof t);
  if (t.channels * 2 != 128 || c % 8) fail("emulated TMA im2col: 64 bf16 channels a pixel at 16-byte boundaries only");
  if (w < t.lower[0] || w > t.dims[1] - 1 + t.upper[0] || h < t.lower[1] || h > t.dims[2] - 1 + t.upper[1])
    fail("emulated TMA im2col: the start outside the bounding box");
  std::vector<Thread::Copy> cs;
  for (int p = 0; p < t.pixels; p++) {
    const int64_t iw = w + ow, ih = h + oh;
    const bool in = iw >= 0 && iw < t.dims[1] && ih >= 0 && ih < t.dims[2] && n >= 0 && n < t.dims[3] && c + 64 <= t.dims[0];
    for (int k = 0; k < 8; k++) {
      const unsigned char* src = in ? t.base + n * t.strides[3] + ih * t.strides[2] + iw * t.strides[1] + (c + 8 * k) * 2 : nullptr;
      if (src) check_global(src, 16);
      cs.push_back({tma_dst(dst, p, k), src, !in, 0});
    }
    w += t.elem[1];
    if (w > t.dims[1] - 1 + t.upper[0]) {
      w = t.lower[0];
      h += t.elem[2];
      if (h > t.dims[2] - 1 + t.upper[1]) {
        h = t.lower[1];
        n++;
      }
    }
  }
  tma_queue(bar, cs, (long)t.pixels * 128);
}

// cp_mbar_arrive (cp.async.mbarrier.arrive.noinc.shared::cta.b64): this
// thread's cp.async copies issued so far land, then count as one arrival
// on the mbarrier at addr, later (land_deferred).
inline void cp_mbar_arrive(unsigned addr) {
  mbar(addr);
  Global::Deferred d{{}, addr, {}};
  d.copies.swap(g.cur->pending);
  // Copies that landed at their issue are seen through the barrier too.
  uint16_t me = (uint16_t)(g.cur->index + 1);
  std::vector<unsigned> rest;
  for (unsigned off : g.cur->fresh) {
    if (g.owner[off] == me) {
      for (int i = 0; i < 16; i++) g.owner[off + i] = 0xffff;
      d.early.push_back(off);
    } else {
      rest.push_back(off);
    }
  }
  g.cur->fresh.swap(rest);
  g.deferred.push_back(d);
  g.progress++;
}

// shfl exchanges values of up to 32 bytes (a double, as __shfl_sync's
// 64-bit overloads take) through the lanes' slots.
template <typename T>
inline T shfl(T v, int src) {
  static_assert(sizeof(T) <= sizeof(Slot::w), "shfl of a value wider than a slot");
  int lane = g.cur->lane;
  memcpy(slot(lane).w, &v, sizeof(T));
  warp_barrier();
  T out;
  memcpy(&out, slot(src & 31).w, sizeof(T));
  warp_barrier();
  return out;
}


// ---- wgmma (sm_90a) ----

inline void wg_barrier() {
  if (g.threads.size() % 128) fail("wgmma in a block whose size is not a multiple of 128");
  int w = g.cur->warp >> 2;
  long gen = g.wg_gen[w];
  g.progress++;
  if (++g.wg_count[w] == 128) {
    g.wg_count[w] = 0;
    g.wg_gen[w]++;
    return;
  }
  while (g.wg_gen[w] == gen) yield();
}

struct Desc {
  unsigned start, lbo, sbo;
};

// decode reads a wgmma matrix descriptor (PTX ISA, "Matrix Descriptor
// Format"): bits 0-13 start address >> 4, 16-29 leading dimension byte
// offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 base offset,
// 62-63 swizzle mode (1: 128-byte).
inline Desc decode(uint64_t d) {
  Desc r;
  r.start = (unsigned)(d & 0x3fff) << 4;
  r.lbo = (unsigned)((d >> 16) & 0x3fff) << 4;
  r.sbo = (unsigned)((d >> 32) & 0x3fff) << 4;
  if (((d >> 49) & 7) != 0) fail("wgmma descriptor base offset not 0 (not emulated)");
  if ((d >> 62) != 1) fail("wgmma descriptor swizzle mode not 128-byte (the only one emulated)");
  if (d & 0x3ff1c000c000c000ull) fail("wgmma descriptor reserved bits set");
  // With base offset 0 the swizzle pattern must repeat from a 1024-byte
  // boundary: bits 7-9 of the start address are 0 (a start inside a
  // 128-byte row, bits 4-6, is how K advances within the atom).
  if (r.start & 0x380) fail("wgmma descriptor start address not on a 1024-byte swizzle row 0 (base offset not emulated)");
  return r;
}

// The byte offset (before swizzling) of element (mn, k), k < 16, of a
// 16-bit operand in the canonical layouts (K-major: rows of mn, each 128
// bytes of k; MN-major: rows of k, each 128 bytes of mn).
inline unsigned wg_off_k(const Desc& d, int mn, int k) {
  return d.start + (mn & 7) * 128 + (mn >> 3) * d.sbo + (k >> 3) * 16 + (k & 7) * 2;
}
inline unsigned wg_off_mn(const Desc& d, int mn, int k) {
  return d.start + (mn & 63) * 2 + (mn >> 6) * d.lbo + (k & 7) * 128 + (k >> 3) * d.sbo;
}

// wg_ld reads the bf16 at a pre-swizzle offset (128-byte swizzle: bits
// [4,7) ^= bits [7,10)), folding it into hash.
inline double wg_ld(unsigned off, uint64_t& hash) {
  unsigned a = off ^ (((off >> 7) & 7) << 4);
  if ((size_t)a + 2 > g.smem.size()) fail("wgmma reads outside the dynamic shared memory");
  if (g.owner[a] || g.owner[a + 1])
    fail("wgmma reads shared memory written by cp.async without a fence.proxy.async after it landed");
  uint16_t v = ld16(g.smem.data() + a);
  hash = (hash ^ (v | (uint64_t)a << 16)) * 0x100000001b3ull;
  return bf(v, 0);
}

// wg_compute computes this thread's accumulators of op (base: the input
// accumulators, or null for zero) and the hash of the shared memory read;
// with a null out only the hash (the register A operand is skipped).
inline uint64_t wg_compute(const Thread::WgOp& op, const float* base, float* out) {
  int lane = g.cur->lane, wq = g.cur->warp & 3, wgbase = (g.cur->index / 128) * 128;
  Desc da = op.areg ? Desc{} : decode(op.da), db = decode(op.db);
  uint64_t hash = 1469598103934665603ull;
  for (int j = 0; j < op.N / 8; j++)
    for (int e = 0; e < 4; e++) {
      int row = 16 * wq + (lane >> 2) + 8 * (e >> 1), col = 8 * j + 2 * (lane & 3) + (e & 1);
      double acc = base ? base[4 * j + e] : 0.0;
      for (int k = 0; k < 16; k++) {
        double A = 0;
        if (!op.areg) {
          A = wg_ld(op.trans_a ? wg_off_mn(da, row, k) : wg_off_k(da, row, k), hash);
        } else if (out) {
          // register A (PTX ISA, "Register Fragments" for wgmma .m64nNk16):
          // the mma.m16n8k16 A layout per warp, warp w holding rows 16w..
          int r = row & 15, src = wgbase + (row >> 4) * 32 + (r & 7) * 4 + ((k & 7) >> 1);
          int reg = (r >> 3) + 2 * (k >> 3);
          A = bf(g.slots[src].w[reg], k & 1);
        }
        double B = wg_ld(op.trans_b ? wg_off_mn(db, col, k) : wg_off_k(db, col, k), hash);
        acc += A * B;
      }
      if (out) out[4 * j + e] = (float)acc;
    }
  return hash;
}

// wgmma issues d (+)= A·B for a 64×N×16 product (areg null: A from the
// descriptor da). d holds this thread's N/2 accumulators in the layout of
// the PTX ISA's wgmma .m64nNk16 D fragments: d[4j+e] is row
// 16·(warp%4) + lane/4 + 8·(e/2), column 8j + 2·(lane%4) + e%2.
inline void wgmma(float* d, int N, const unsigned* areg, uint64_t da, uint64_t db, int scale_d, int trans_a,
                  int trans_b) {
  if (N % 8 || N < 8 || N > 256) fail("wgmma N not a multiple of 8 in [8, 256]");
  Thread* me = g.cur;
  Slot& sl = slot(me->lane);
  for (int i = 0; i < 4; i++) sl.w[i] = areg ? areg[i] : 0;
  memcpy(&sl.w[4], &da, 8);
  memcpy(&sl.w[6], &db, 8);
  wg_barrier();
  const Slot& s0 = g.slots[(me->index / 128) * 128];
  if (memcmp(&s0.w[4], &sl.w[4], 16) != 0) fail("wgmma descriptors differ across the warpgroup");
  Thread::WgOp op{};
  op.d = d;
  op.N = N;
  op.n = N / 2;
  op.group = me->wg_group;
  op.areg = areg;
  if (areg) memcpy(op.asnap, areg, 16);
  op.da = da;
  op.db = db;
  op.trans_a = trans_a;
  op.trans_b = trans_b;
  memcpy(op.before, d, 4 * op.n);
  const float* base = nullptr;
  for (auto it = me->wg.rbegin(); it != me->wg.rend(); ++it)
    if (it->d == d) {
      if (it->N != N) fail("wgmma chained on one accumulator with different N");
      op.chained = true;
      base = it->result;
      break;
    }
  if (!op.chained) base = d;
  op.hash = wg_compute(op, scale_d ? base : nullptr, op.result);
  me->wg.push_back(op);
  wg_barrier();  // the slots are read; they may be reused
}

inline void wg_fence() {
  g.progress++;
  yield();
}

inline void wg_commit() { g.cur->wg_group++; }

// wg_wait retires this thread's ops of every group but the n most recent.
inline void wg_wait(int n) {
  Thread* me = g.cur;
  size_t done = 0;
  for (auto& op : me->wg) {
    if (op.group >= me->wg_group) fail("wgmma.wait_group with a wgmma.mma_async not committed");
    if (op.group >= me->wg_group - n) break;
    if (op.areg && memcmp(op.asnap, op.areg, 16) != 0)
      fail("wgmma A registers changed before wgmma.wait_group retired the wgmma reading them");
    if (!op.chained && memcmp(op.before, op.d, 4 * op.n) != 0)
      fail("wgmma accumulators written before wgmma.wait_group retired the wgmma writing them");
    if (wg_compute(op, nullptr, nullptr) != op.hash)
      fail("shared memory read by a wgmma changed before wgmma.wait_group retired it");
    memcpy(op.d, op.result, 4 * op.n);
    done++;
  }
  me->wg.erase(me->wg.begin(), me->wg.begin() + done);
  g.progress++;
  yield();
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
// __any_sync: whether the predicate holds in some lane (a butterfly of
// shuffles, so the warp meets as for __shfl_sync).
inline bool __any_sync(unsigned, bool p) {
  int v = p;
  for (int m = 1; m < 32; m <<= 1) v |= emu::shfl(v, (emu::g.cur->lane ^ m) & 31);
  return v != 0;
}
// __shfl_up_sync: lanes below delta keep their own value.
template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  int lane = emu::g.cur->lane;
  return emu::shfl(v, lane >= (int)delta ? lane - (int)delta : lane);
}
// __shfl_down_sync: lanes whose source is past lane 31 keep their own value.
template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta) {
  int lane = emu::g.cur->lane;
  return emu::shfl(v, lane + (int)delta < 32 ? lane + (int)delta : lane);
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier(); }
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
inline double __longlong_as_double(long long u) {
  double f;
  memcpy(&f, &u, 8);
  return f;
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
inline int atomicAdd(int* p, int v) {
  int old = *p;
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
inline void gpukit_emu_cp_commit() { emu::cp_commit(); }
inline void gpukit_emu_cp_wait(int n) { emu::cp_wait(n); }
inline void gpukit_emu_cp_wait0() { emu::cp_wait0(); }
inline void gpukit_emu_fence_proxy_async() { emu::fence_proxy_async(); }
inline void gpukit_emu_wgmma(float* d, int N, const unsigned* areg, uint64_t da, uint64_t db, int scale_d, int trans_a,
                             int trans_b) {
  emu::wgmma(d, N, areg, da, db, scale_d, trans_a, trans_b);
}
inline void gpukit_emu_wg_fence() { emu::wg_fence(); }
inline void gpukit_emu_bar(int id, int count, bool wait) { emu::bar_arrive_n(id, count, wait); }
inline void gpukit_emu_mbar_init(unsigned addr, int count) { emu::mbar_init(addr, count); }
inline void gpukit_emu_mbar_arrive(unsigned addr) { emu::mbar_arrive(addr); }
inline bool gpukit_emu_mbar_try_wait(unsigned addr, unsigned parity) { return emu::mbar_try_wait(addr, parity); }
inline void gpukit_emu_cp_mbar_arrive(unsigned addr) { emu::cp_mbar_arrive(addr); }
inline void gpukit_emu_mbar_expect_tx(unsigned addr, unsigned bytes) { emu::mbar_arrive(addr, bytes); }
inline void gpukit_emu_tma_tile_2d(unsigned dst, const void* map, unsigned bar, int x, int y) {
  emu::tma_tile_2d(dst, map, bar, x, y);
}
inline void gpukit_emu_tma_im2col_4d(unsigned dst, const void* map, unsigned bar, int c, int w, int h, int n, int ow, int oh) {
  emu::tma_im2col_4d(dst, map, bar, c, w, h, n, ow, oh);
}
inline void gpukit_emu_wg_commit() { emu::wg_commit(); }
inline void gpukit_emu_wg_wait(int n) { emu::wg_wait(n); }
