// precond_test.cpp: runs libgpu/kernels/precond.cu's shampoo_prep (bias
// corrections as arguments, and read from the device as a step counter's
// kernel leaves them) and block_apply (with and without a device
// learning-rate scale) under the host emulation (emu.h) with
// libgpu/ops/precond.go's launch geometry (256 threads, grid over the
// elements) on a matrix whose blocks do not tile it, and checks every
// element against float64 references, padding included. Usage:
//   scripts/cuda-emu.sh precond
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/precond.cu"
// clang-format on
#include "emutest.h"

int main() {
  const int m = 7, n = 10, br = 3, bc = 4;
  const int rows = (m + br - 1) / br, cols = (n + bc - 1) / bc;
  pc_geom geo = {m, n, br, bc, cols};
  const long long total = (long long)rows * cols * br * bc, mn = (long long)m * n;
  const float b1 = 0.9f, b2 = 0.99f, eps = 1e-8f;
  const int t = 3;
  const double c1 = 1 - pow(b1, t), c2 = 1 - pow(b2, t);
  for (int dev = 0; dev < 2; dev++) {
    for (int adagrad = 0; adagrad < 2; adagrad++) {
      Buf g, mm, v, gs, gb, ga, bcb;
      emu::untrack();
      g.alloc(mn, false);
      mm.alloc(mn, false);
      v.alloc(mn, false);
      gs.alloc(total, false);
      gb.alloc(total, false);
      ga.alloc(total, false);
      bcb.alloc(2, false);
      std::vector<double> gv = g.fill(mn, 1), m0 = mm.fill(mn, 0.5), v0 = v.fill(mn, 0.1, 1);
      bcb.set(0, c1);
      bcb.set(1, c2);
      for (auto* b : {&g, &mm, &v, &gs, &gb, &ga, &bcb}) b->track();
      // With the device's corrections the arguments are poison: NaN.
      float a1 = dev ? NAN : (float)c1, a2 = dev ? NAN : adagrad ? 1.0f : (float)c2;  // as ops.ShampooPrep passes them
      const float* bcp = dev ? bcb.f() : nullptr;
      emu::launch({(unsigned)((total + 255) / 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        shampoo_prep(geo, g.f(), mm.f(), v.f(), gs.f(), gb.f(), ga.f(), total, b1, b2, a1, a2, bcp, eps, adagrad);
      });
      std::vector<double> wm(mn), wv(mn), wgs(total, 0), wgb(total, 0), wga(total, 0);
      for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
          long long k = (long long)i * n + j;
          int bi = i / br, bj = j / bc;
          long long e = ((long long)(bi * cols + bj) * br + i % br) * bc + j % bc;
          double gg = (float)gv[k];
          wm[k] = b1 * m0[k] + (1 - b1) * gg;
          wv[k] = adagrad ? v0[k] + gg * gg : b2 * v0[k] + (1 - b2) * gg * gg;
          double mh = wm[k] / c1;
          wgs[e] = gg;
          wgb[e] = mh;
          wga[e] = mh / (sqrt(wv[k] / (adagrad ? 1 : c2)) + eps);
        }
      char what[96];
      snprintf(what, sizeof what, "shampoo_prep bc %s adagrad %d", dev ? "device" : "args", adagrad);
      check(std::string(what) + " m", mm.read(mn), wm, 1e-6);
      check(std::string(what) + " v", v.read(mn), wv, 1e-6);
      check(std::string(what) + " gs", gs.read(total), wgs, 1e-6);
      check(std::string(what) + " gb", gb.read(total), wgb, 1e-6);
      check(std::string(what) + " ga", ga.read(total), wga, 1e-6);
    }
    // block_apply: p ← p − lr·s·(coef·c·scale[b]·d + wd·p), s the device
    // scale, c = √bc[1]/bc[0] from the device's bias corrections.
    Buf p, d, sc, ls, cb;
    emu::untrack();
    p.alloc(mn, false);
    d.alloc(total, false);
    sc.alloc(rows * cols, false);
    ls.alloc(1, false);
    cb.alloc(2, false);
    cb.set(0, c1);
    cb.set(1, c2);
    std::vector<double> p0 = p.fill(mn, 1), dv = d.fill(total, 1), sv = sc.fill(rows * cols, 0.3, 1);
    ls.set(0, 0.25);
    for (auto* b : {&p, &d, &sc, &ls, &cb}) b->track();
    const float lr = 0.1f, coef = 0.7f, wd = 0.01f;
    emu::launch({(unsigned)((mn + 255) / 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      block_apply(geo, p.f(), d.f(), sc.f(), mn, lr, dev ? ls.f() : nullptr, coef, dev ? cb.f() : nullptr, wd);
    });
    std::vector<double> want(mn);
    double l = lr * (dev ? 0.25 : 1.0), cf = coef * (dev ? sqrt((double)(float)c2) / (double)(float)c1 : 1.0);
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        long long k = (long long)i * n + j;
        int b = (i / br) * cols + j / bc;
        long long e = ((long long)b * br + i % br) * bc + j % bc;
        want[k] = p0[k] - l * (cf * sv[b] * dv[e] + wd * p0[k]);
      }
    check(dev ? "block_apply lr_scale, bc" : "block_apply", p.read(mn), want, 1e-6);
  }
  return finish();
}
