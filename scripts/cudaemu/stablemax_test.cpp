// stablemax_test.cpp: runs libgpu/kernels/stablemax.cu under the host
// emulation (emu.h) with the launches of libgpu/ops/stablemax.go
// (smx_count, smx_rows, smx_reduce) and checks the loss, the row losses and
// the gradient (written and accumulated, f32 and bf16 logits, strided
// [B, T, V] views, ignored rows, per-sequence groups) against float64
// references. Usage: scripts/cuda-emu.sh stablemax
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/stablemax.cu"
// clang-format on
#include <cmath>
#include <cstddef>

#include "emutest.h"

static_assert(offsetof(smx_args, B) == 56, "smx_args");
static_assert(offsetof(smx_args, group) == 104, "smx_args");
static_assert(offsetof(smx_args, V) == 112, "smx_args");
static_assert(offsetof(smx_args, scale) == 120, "smx_args");

static double s_(double x) { return x >= 0 ? x + 1 : 1 / (1 - x); }
static double ds_(double x) { return x >= 0 ? 1 : 1 / ((1 - x) * (1 - x)); }

static void run(long long B, long long T, int V, long long group, bool bf, bool acc, long long tpad) {
  char name[160];
  snprintf(name, sizeof name, "%lldx%lldx%d group=%lld %s acc=%d tpad=%lld", B, T, V, group, bf ? "bf16" : "f32", acc, tpad);
  const long long rows = B * T, Tp = T + tpad;  // a [B, T, V] view of [B, T + tpad, V]
  Buf x, dl, loss, rowloss, rl, counts, tg;
  x.alloc(B * Tp * V, bf);
  dl.alloc(B * Tp * V, bf);
  loss.alloc(1, false);
  rowloss.alloc(rows, false);
  rl.alloc(rows * 2, false);  // doubles
  counts.alloc(rows, false);
  tg.alloc(rows, false);
  std::vector<double> xv(rows * V), old(rows * V);
  int* t = (int*)tg.ptr();
  for (long long i = 0; i < rows; i++) {
    t[i] = rng() % 4 == 0 ? -100 : (int)(rng() % V);
    for (int j = 0; j < V; j++) {
      long long k = ((i / T) * Tp + i % T) * V + j;
      x.set(k, 2 * randn());
      xv[i * V + j] = x.get(k);
      if (acc) {
        dl.set(k, randn());
        old[i * V + j] = dl.get(k);
      }
    }
  }
  smx_args a{};
  a.loss = loss.f();
  a.rl = (double*)rl.ptr();
  a.rowloss = rowloss.f();
  a.dl = dl.ptr();
  a.x = x.ptr();
  a.targets = t;
  a.counts = (int*)counts.ptr();
  a.B = B, a.T = T, a.xs0 = a.ds0 = Tp * V, a.xs1 = a.ds1 = V;
  a.group = group;
  a.V = V;
  a.ngroups = (int)(rows / group);
  a.scale = 0.7f;
  a.acc = acc;
  emu::launch({(unsigned)std::min<long long>(a.ngroups, 65535), 1, 1}, {256, 1, 1}, 0, seed++, [&] { smx_count(a); });
  emu::launch({(unsigned)std::min<long long>((rows + 7) / 8, 65535), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
    if (bf) {
      smx_rows_bf16_bf16(a);
    } else {
      smx_rows_f32_f32(a);
    }
  });
  emu::launch({1, 1, 1}, {1024, 1, 1}, 0, seed++, [&] { smx_reduce(a); });
  std::vector<double> wrow(rows), wg(rows * V), gotg(rows * V);
  double wl = 0;
  for (long long g0 = 0; g0 < rows; g0 += group) {
    int n = 0;
    for (long long i = g0; i < g0 + group; i++) n += t[i] >= 0;
    double w = 0.7 / std::max(n, 1);
    for (long long i = g0; i < g0 + group; i++) {
      for (int j = 0; j < V; j++) wg[i * V + j] = acc ? old[i * V + j] : 0;
      if (t[i] < 0) continue;
      double S = 0;
      for (int j = 0; j < V; j++) S += s_(xv[i * V + j]);
      double xt = xv[i * V + t[i]];
      wrow[i] = log(S) - log(s_(xt));
      wl += w * wrow[i];
      for (int j = 0; j < V; j++) wg[i * V + j] += w * (ds_(xv[i * V + j]) / S - (j == t[i] ? ds_(xt) / s_(xt) : 0));
    }
  }
  for (long long i = 0; i < rows; i++)
    for (int j = 0; j < V; j++) gotg[i * V + j] = dl.get(((i / T) * Tp + i % T) * V + j);
  check(std::string(name) + " loss", loss.read(1), {wl}, 1e-6);
  check(std::string(name) + " row losses", rowloss.read(rows), wrow, 1e-6);
  check(std::string(name) + " dlogits", gotg, wg, bf ? 1e-2 : 1e-5);
  bool untouched = true;
  for (long long b = 0; b < B; b++)
    for (long long k = T * V; k < Tp * V; k++) untouched = untouched && std::isnan(dl.get(b * Tp * V + k));
  if (!untouched) {
    printf("FAIL %s: dlogits written outside the view\n", name);
    failures++;
  }
}

int main() {
  run(1, 1, 1, 1, false, false, 0);
  run(2, 81, 11, 81, false, false, 1);  // HRM: per-sequence groups, the puzzle position dropped
  run(2, 81, 11, 81, true, true, 1);
  run(3, 5, 40, 15, false, true, 0);
  run(2, 6, 1000, 4, true, false, 2);
  run(4, 9, 11, 1, false, false, 0);
  return finish();
}
