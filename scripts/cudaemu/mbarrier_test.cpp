// mbarrier_test.cpp: checks libgpu/kernels/mbarrier.cuh under the host
// emulation (emu.h) on the structure of a warp-specialised kernel: one
// producer warp fills a two-stage ring of shared-memory tiles with cp.async
// and completes each stage's "full" mbarrier through
// cp.async.mbarrier.arrive.noinc; four consumer warps wait on it, read the
// tile, and arrive on the stage's "empty" mbarrier, which the producer
// waits on before it refills the stage; the consumers' two halves take
// turns through two named barriers (half 0 finishes a tile before half 1
// starts it, and half 1 before half 0 starts the next, as
// FlashAttention-3's ping-pong orders its warpgroups). Each
// check also runs with one synchronisation removed (the consumers' wait,
// the producer's wait, the named barriers) and must then fail for some
// scheduling seed (wrong sums or order, or the emulation's deadlock
// check), so the emulation does catch each omission.
// Usage: scripts/cuda-emu.sh mbarrier
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/mma.cuh"
#include "../../libgpu/kernels/mbarrier.cuh"
// clang-format on
#include "emutest.h"

#include <sys/wait.h>
#include <unistd.h>

constexpr int ROWS = 32, COLS = 16;                // a tile: 32 rows of 16 f32 (64 bytes, 4 chunks)
constexpr int TILE = ROWS * COLS * 4;              // bytes
constexpr int PRODUCERS = 32, CONSUMERS = 128;     // warp 0; warps 1-4
constexpr int SMEM = 2 * TILE + 4 * 8 + 4 * 64;    // two stages, full[2], empty[2], the turn log

enum Drop { NONE, FULL_WAIT, EMPTY_WAIT, TURN };

// ring: out[c·4 + e] = Σ_t (t+1)·x[t][c/4][4·(c%4) + e] for consumer c.
static void ring(const float* x, float* out, int nt, Drop drop) {
  ATTN_DYN_SMEM(smem);
  const unsigned base = gpukit_smem_addr(smem);
  const unsigned full = base + 2 * TILE, empty = full + 16;
  int* log = (int*)(smem + 2 * TILE + 32);  // [0]: next slot; then (tile·2 + half) in order
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < 2; s++) {
      gpukit_mbar_init(full + 8 * s, PRODUCERS);
      gpukit_mbar_init(empty + 8 * s, CONSUMERS);
    }
    log[0] = 1;
  }
  __syncthreads();
  if (tid < PRODUCERS) {
    for (int t = 0; t < nt; t++) {
      const int s = t & 1, k = t >> 1;
      if (t >= 2 && drop != EMPTY_WAIT) gpukit_mbar_wait(empty + 8 * s, (k - 1) & 1);
      for (int i = 0; i < ROWS * COLS / 4 / PRODUCERS; i++) {
        const int c = tid + i * PRODUCERS;  // 16-byte chunk of the tile
        gpukit_cp16(base + s * TILE + 16 * c, x + (long long)t * ROWS * COLS + 4 * c, true);
      }
      gpukit_cp_mbar_arrive(full + 8 * s);
    }
    return;
  }
  const int c = tid - PRODUCERS, half = c / 64;
  float acc[4] = {0, 0, 0, 0};
  for (int t = 0; t < nt; t++) {
    const int s = t & 1, k = t >> 1;
    // The turns: half 1 takes tile t after half 0 is done with it (barrier
    // 1), half 0 takes tile t after half 1 is done with t − 1 (barrier 2),
    // so neither arrives twice in one barrier's generation.
    if (drop != TURN) {
      if (half == 1) gpukit_bar_sync(1, CONSUMERS);
      if (half == 0 && t > 0) gpukit_bar_sync(2, CONSUMERS);
    }
    if (drop != FULL_WAIT) gpukit_mbar_wait(full + 8 * s, k & 1);
    const float* tile = (const float*)(smem + s * TILE);
    for (int e = 0; e < 4; e++) acc[e] += (t + 1) * tile[4 * c + e];
    if (c % 64 == 0) log[log[0]++] = 2 * t + half;
    gpukit_mbar_arrive(empty + 8 * s);
    if (drop != TURN) {
      if (half == 0) gpukit_bar_arrive(1, CONSUMERS);
      if (half == 1 && t + 1 < nt) gpukit_bar_arrive(2, CONSUMERS);
    }
  }
  for (int e = 0; e < 4; e++) out[4 * c + e] = acc[e];
}

// run returns whether one launch gives the reference sums and the turn order.
static bool run(int nt, Drop drop, uint64_t sd) {
  Buf x, out;
  x.alloc((size_t)nt * ROWS * COLS, false);
  out.alloc(CONSUMERS * 4, false);
  for (size_t i = 0; i < (size_t)nt * ROWS * COLS; i++) x.set(i, randn());
  emu::track(x.ptr(), (size_t)nt * ROWS * COLS * 4);
  emu::launch({1, 1, 1}, {PRODUCERS + CONSUMERS, 1, 1}, SMEM, sd, [&] { ring(x.f(), out.f(), nt, drop); });
  emu::untrack();
  bool ok = true;
  for (int c = 0; c < CONSUMERS; c++)
    for (int e = 0; e < 4; e++) {
      double want = 0;
      for (int t = 0; t < nt; t++) want += (t + 1) * x.get((size_t)t * ROWS * COLS + 4 * c + e);
      const double got = out.get(4 * c + e);
      if (!(fabs(got - want) <= 1e-4 * (1 + fabs(want)))) ok = false;
    }
  // The turn log is read after the launch from the block's shared memory.
  const int* log = (const int*)(emu::g.smem.data() + 2 * TILE + 32);
  int n = log[0] - 1;
  if (n != 2 * nt) ok = false;
  std::vector<int> seen0(nt, 0);
  for (int i = 1; i <= n && i < 64; i++) {
    const int t = log[i] / 2, h = log[i] % 2;
    if (h == 0) seen0[t] = 1;
    if (h == 1 && !seen0[t]) ok = false;  // half 1 took tile t before half 0 was done with it
  }
  return ok;
}

// survives runs one launch in a child process: true when it ends with the
// right sums and order, false when they are wrong or the emulation stops
// (a deadlock: the producer that does not wait can lap the consumers).
static bool survives(int nt, Drop drop, uint64_t sd) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    freopen("/dev/null", "w", stderr);
    _exit(run(nt, drop, sd) ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main() {
  (void)seed;  // emutest.h's launch seed: the seeds here are the loops'
  const int nt = 7;  // odd: the stages' phases wrap unevenly
  for (uint64_t sd = 1; sd <= 20; sd++)
    if (!run(nt, NONE, sd)) {
      printf("FAIL ring nt=%d seed %llu\n", nt, (unsigned long long)sd);
      failures++;
    }
  if (!failures) printf("ok   ring of 2 stages, %d tiles, 20 scheduling seeds\n", nt);
  const char* names[] = {"", "consumers' full wait", "producer's empty wait", "named-barrier turns"};
  for (Drop d : {FULL_WAIT, EMPTY_WAIT, TURN}) {
    int caught = 0;
    for (uint64_t sd = 1; sd <= 40; sd++) caught += !survives(nt, d, sd);
    printf("%s without the %s: wrong in %d of 40 seeds\n", caught ? "ok  " : "FAIL", names[d], caught);
    if (!caught) failures++;
  }
  if (failures) {
    printf("FAIL (%d)\n", failures);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
