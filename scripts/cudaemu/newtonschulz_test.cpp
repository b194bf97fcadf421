// newtonschulz_test.cpp: runs libgpu/kernels/newtonschulz.cu's multi-tensor
// Muon steps — muon_momentum_multi, muon_scale_multi and
// muon_normalize_multi (f32 and bf16 outputs, plain and transposed), then
// muon_apply_multi with and without a device learning-rate scale — under
// the host emulation (emu.h) with libgpu/ops's plan (mtPlan: MUON_MT_CHUNK
// elements per block, 256 threads) over three weights in one launch, one
// of them more than a chunk, and checks every element against float64
// references. Usage: scripts/cuda-emu.sh newtonschulz
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/newtonschulz.cu"
// clang-format on
#include "emutest.h"

static const int nt = 3;
static const int dims[nt][3] = {{6, 10, 0}, {10, 6, 1}, {40, 70, 0}};  // m, n, transposed

int main() {
  const float mu = 0.95f, eps = 1e-7f;
  for (int bf = 0; bf < 2; bf++) {
    for (int nesterov = 0; nesterov < 2; nesterov++) {
      Buf g[nt], buf[nt], x[nt], p[nt], part, inv, ls;
      std::vector<double> gv[nt], b0[nt], p0[nt];
      emu::untrack();
      muon_args a;
      memset(&a, 0, sizeof a);
      long long blocks = 0;
      for (int i = 0; i < nt; i++) {
        long long mn = (long long)dims[i][0] * dims[i][1];
        g[i].alloc(mn, false);
        buf[i].alloc(mn, false);
        x[i].alloc(mn, bf);
        p[i].alloc(mn, false);
        gv[i] = g[i].fill(mn, 1);
        b0[i] = buf[i].fill(mn, 0.5);
        p0[i] = p[i].fill(mn, 1);
        a.t[i] = {g[i].f(), buf[i].f(), p[i].f(), x[i].ptr(), dims[i][0], dims[i][1], dims[i][2],
                  (float)sqrt(std::max(1.0, (double)dims[i][0] / dims[i][1]))};
        a.start[i] = (int)blocks;
        blocks += (mn + MUON_MT_CHUNK - 1) / MUON_MT_CHUNK;
      }
      a.start[nt] = (int)blocks;
      part.alloc(blocks, false);
      inv.alloc(nt, false);
      ls.alloc(1, false);
      ls.set(0, 0.5);
      for (int i = 0; i < nt; i++)
        for (auto* b : {&g[i], &buf[i], &x[i], &p[i]}) b->track();
      for (auto* b : {&part, &inv, &ls}) b->track();
      a.count = nt;
      a.mu = mu;
      a.eps = eps;
      a.nesterov = nesterov;
      a.part = part.f();
      a.inv = inv.f();
      a.lr = 0.02f;
      a.decay = 0.1f;
      a.lr_scale = nesterov ? ls.f() : nullptr;  // both ways, once each
      unsigned grid = (unsigned)blocks;
      emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { muon_momentum_multi(a); });
      emu::launch({1, 1, 1}, {32, 1, 1}, 0, seed++, [&] { muon_scale_multi(a); });
      if (bf)
        emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { muon_normalize_multi_bf16(a); });
      else
        emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { muon_normalize_multi_f32(a); });
      std::vector<std::vector<double>> xs(nt);
      for (int i = 0; i < nt; i++) {
        int m = dims[i][0], n = dims[i][1], tr = dims[i][2];
        long long mn = (long long)m * n;
        std::vector<double> wb(mn), u(mn), wx(mn);
        double ss = 0;
        for (long long k = 0; k < mn; k++) {
          double gg = (float)gv[i][k];
          wb[k] = mu * b0[i][k] + gg;
          u[k] = nesterov ? gg + mu * wb[k] : wb[k];
          ss += u[k] * u[k];
        }
        for (long long k = 0; k < mn; k++) {
          long long o = tr ? (k % n) * m + k / n : k;
          wx[o] = u[k] / (sqrt(ss) + eps);
        }
        char what[80];
        snprintf(what, sizeof what, "muon prep %s nesterov %d weight %d", bf ? "bf16" : "f32", nesterov, i);
        check(std::string(what) + " buf", buf[i].read(mn), wb, 1e-6);
        check(std::string(what) + " X", x[i].read(mn), wx, bf ? 8e-3 : 1e-5);
        xs[i] = x[i].read(mn);
      }
      emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          muon_apply_multi_bf16(a);
        else
          muon_apply_multi_f32(a);
      });
      double lr = a.lr * (nesterov ? 0.5 : 1.0);
      for (int i = 0; i < nt; i++) {
        int m = dims[i][0], n = dims[i][1], tr = dims[i][2];
        long long mn = (long long)m * n;
        std::vector<double> want(mn);
        for (long long k = 0; k < mn; k++) {
          long long o = tr ? (k % n) * m + k / n : k;
          want[k] = p0[i][k] * (1 - lr * a.decay) - lr * a.t[i].scale * xs[i][o];
        }
        char what[80];
        snprintf(what, sizeof what, "muon apply %s lr_scale %d weight %d", bf ? "bf16" : "f32", nesterov, i);
        check(what, p[i].read(mn), want, 1e-6);
      }
    }
  }
  return finish();
}
