// precond_test.cpp: runs libgpu/kernels/precond.cu's multi-tensor
// element-wise steps — shampoo_prep_multi (bias corrections as arguments,
// and read from the device as a step counter's kernel leaves them),
// block_apply_multi (with and without a device learning-rate scale and
// bias-corrected coefficient), soap_prep_multi and soap_adam_multi — under
// the host emulation (emu.h) with libgpu/ops's plan (mtPlan: PC_MT_CHUNK
// elements per block, 256 threads) over three parameters of different
// blockings in one launch, blocks that do not tile them, one parameter
// larger than a chunk; every element is checked against float64
// references, padding included. Usage: scripts/cuda-emu.sh precond
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/precond.cu"
// clang-format on
#include "emutest.h"

struct Shape {
  int m, n, br, bc;
  int rows() const { return (m + br - 1) / br; }
  int cols() const { return (n + bc - 1) / bc; }
  long long blocked() const { return (long long)rows() * cols() * br * bc; }
  long long mn() const { return (long long)m * n; }
  pc_geom geo() const { return {m, n, br, bc, cols()}; }
  // blockedIndex of element (i, j).
  long long at(int i, int j) const {
    int bi = i / br, bj = j / bc;
    return ((long long)(bi * cols() + bj) * br + i % br) * bc + j % bc;
  }
};

static const Shape shapes[] = {{7, 10, 3, 4}, {50, 60, 25, 30}, {5, 3, 5, 3}};
static const int nt = 3;

// plan fills start[] (blocks of PC_MT_CHUNK over each tensor's range) and
// returns the grid size.
static unsigned plan(int* start, const long long* total) {
  long long blocks = 0;
  for (int i = 0; i < nt; i++) {
    start[i] = (int)blocks;
    blocks += (total[i] + PC_MT_CHUNK - 1) / PC_MT_CHUNK;
  }
  start[nt] = (int)blocks;
  return (unsigned)blocks;
}

int main() {
  const float b1 = 0.9f, b2 = 0.99f, eps = 1e-8f;
  const int t = 3;
  const double c1 = 1 - pow(b1, t), c2 = 1 - pow(b2, t);
  for (int dev = 0; dev < 2; dev++) {
    for (int adagrad = 0; adagrad < 2; adagrad++) {
      Buf g[nt], mm[nt], v[nt], gs[nt], gb[nt], ga[nt], bcb;
      std::vector<double> gv[nt], m0[nt], v0[nt];
      emu::untrack();
      pc_prep_args a;
      memset(&a, 0, sizeof a);
      long long total[nt];
      for (int i = 0; i < nt; i++) {
        const Shape& s = shapes[i];
        g[i].alloc(s.mn(), false);
        mm[i].alloc(s.mn(), false);
        v[i].alloc(s.mn(), false);
        gs[i].alloc(s.blocked(), false);
        gb[i].alloc(s.blocked(), false);
        ga[i].alloc(s.blocked(), false);
        gv[i] = g[i].fill(s.mn(), 1);
        m0[i] = mm[i].fill(s.mn(), 0.5);
        v0[i] = v[i].fill(s.mn(), 0.1, 1);
        total[i] = s.blocked();
        a.t[i] = {s.geo(), g[i].f(), mm[i].f(), v[i].f(), gs[i].f(), gb[i].f(), ga[i].f(), total[i]};
      }
      bcb.alloc(2, false);
      bcb.set(0, c1);
      bcb.set(1, c2);
      for (int i = 0; i < nt; i++)
        for (auto* b : {&g[i], &mm[i], &v[i], &gs[i], &gb[i], &ga[i]}) b->track();
      bcb.track();
      a.count = nt;
      a.beta1 = b1;
      a.beta2 = b2;
      // With the device's corrections the arguments are poison: NaN.
      a.bc1 = dev ? NAN : (float)c1;
      a.bc2 = dev ? NAN : adagrad ? 1.0f : (float)c2;  // as ops.ShampooPreps passes them
      a.bc = dev ? bcb.f() : nullptr;
      a.eps = eps;
      a.adagrad = adagrad;
      unsigned grid = plan(a.start, total);
      emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { shampoo_prep_multi(a); });
      for (int p = 0; p < nt; p++) {
        const Shape& s = shapes[p];
        std::vector<double> wm(s.mn()), wv(s.mn()), wgs(s.blocked(), 0), wgb(s.blocked(), 0), wga(s.blocked(), 0);
        for (int i = 0; i < s.m; i++)
          for (int j = 0; j < s.n; j++) {
            long long k = (long long)i * s.n + j, e = s.at(i, j);
            double gg = (float)gv[p][k];
            wm[k] = b1 * m0[p][k] + (1 - b1) * gg;
            wv[k] = adagrad ? v0[p][k] + gg * gg : b2 * v0[p][k] + (1 - b2) * gg * gg;
            double mh = wm[k] / c1;
            wgs[e] = gg;
            wgb[e] = mh;
            wga[e] = mh / (sqrt(wv[k] / (adagrad ? 1 : c2)) + eps);
          }
        char what[96];
        snprintf(what, sizeof what, "shampoo_prep_multi bc %s adagrad %d tensor %d", dev ? "device" : "args", adagrad, p);
        check(std::string(what) + " m", mm[p].read(s.mn()), wm, 1e-6);
        check(std::string(what) + " v", v[p].read(s.mn()), wv, 1e-6);
        check(std::string(what) + " gs", gs[p].read(s.blocked()), wgs, 1e-6);
        check(std::string(what) + " gb", gb[p].read(s.blocked()), wgb, 1e-6);
        check(std::string(what) + " ga", ga[p].read(s.blocked()), wga, 1e-6);
      }
    }
    // block_apply_multi: p ← p − lr·s·(coef·c·scale[b]·d + wd·p), s the
    // device scale, c = √bc[1]/bc[0] from the device's bias corrections.
    {
      Buf p[nt], d[nt], sc[nt], ls, cb;
      std::vector<double> p0[nt], dv[nt], sv[nt];
      emu::untrack();
      pc_apply_args a;
      memset(&a, 0, sizeof a);
      long long total[nt];
      for (int i = 0; i < nt; i++) {
        const Shape& s = shapes[i];
        int nb = s.rows() * s.cols();
        p[i].alloc(s.mn(), false);
        d[i].alloc(s.blocked(), false);
        sc[i].alloc(nb, false);
        p0[i] = p[i].fill(s.mn(), 1);
        dv[i] = d[i].fill(s.blocked(), 1);
        sv[i] = sc[i].fill(nb, 0.3, 1);
        total[i] = s.mn();
        a.t[i] = {s.geo(), p[i].f(), d[i].f(), i == 2 ? nullptr : sc[i].f(), total[i]};  // tensor 2: no scale
      }
      ls.alloc(1, false);
      ls.set(0, 0.25);
      cb.alloc(2, false);
      cb.set(0, c1);
      cb.set(1, c2);
      for (int i = 0; i < nt; i++)
        for (auto* b : {&p[i], &d[i], &sc[i]}) b->track();
      ls.track();
      cb.track();
      const float lr = 0.1f, coef = 0.7f, wd = 0.01f;
      a.count = nt;
      a.lr = lr;
      a.coef = coef;
      a.wd = wd;
      a.lr_scale = dev ? ls.f() : nullptr;
      a.bc = dev ? cb.f() : nullptr;
      unsigned grid = plan(a.start, total);
      emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { block_apply_multi(a); });
      double l = lr * (dev ? 0.25 : 1.0), cf = coef * (dev ? sqrt((double)(float)c2) / (double)(float)c1 : 1.0);
      for (int q = 0; q < nt; q++) {
        const Shape& s = shapes[q];
        std::vector<double> want(s.mn());
        for (int i = 0; i < s.m; i++)
          for (int j = 0; j < s.n; j++) {
            long long k = (long long)i * s.n + j;
            int b = (i / s.br) * s.cols() + j / s.bc;
            double scale = q == 2 ? 1.0 : sv[q][b];
            want[k] = p0[q][k] - l * (cf * scale * dv[q][s.at(i, j)] + wd * p0[q][k]);
          }
        char what[64];
        snprintf(what, sizeof what, "block_apply_multi%s tensor %d", dev ? " lr_scale, bc" : "", q);
        check(what, p[q].read(s.mn()), want, 1e-6);
      }
    }
  }
  // soap_prep_multi, then soap_adam_multi on the blocked outputs.
  {
    Buf g[nt], mm[nt], gs[nt], gm[nt], v[nt], out[nt];
    std::vector<double> gv[nt], m0[nt], v0[nt];
    emu::untrack();
    pc_soap_args a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    long long total[nt];
    for (int i = 0; i < nt; i++) {
      const Shape& s = shapes[i];
      g[i].alloc(s.mn(), false);
      mm[i].alloc(s.mn(), false);
      gs[i].alloc(s.blocked(), false);
      gm[i].alloc(s.blocked(), false);
      v[i].alloc(s.blocked(), false);
      out[i].alloc(s.blocked(), false);
      gv[i] = g[i].fill(s.mn(), 1);
      m0[i] = mm[i].fill(s.mn(), 0.5);
      v0[i] = v[i].fill(s.blocked(), 0.1, 1);
      total[i] = s.blocked();
      a.t[i] = {s.geo(), g[i].f(), nullptr, mm[i].f(), gs[i].f(), gm[i].f(), total[i]};
      // Adam on the blocked gradient and moment as if already rotated.
      b.t[i] = {s.geo(), gs[i].f(), gm[i].f(), v[i].f(), out[i].f(), nullptr, total[i]};
    }
    for (int i = 0; i < nt; i++)
      for (auto* x : {&g[i], &mm[i], &gs[i], &gm[i], &v[i], &out[i]}) x->track();
    a.count = b.count = nt;
    a.beta = b1;
    b.beta = b2;
    b.eps = eps;
    unsigned grid = plan(a.start, total);
    plan(b.start, total);
    emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { soap_prep_multi(a); });
    emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] { soap_adam_multi(b); });
    for (int p = 0; p < nt; p++) {
      const Shape& s = shapes[p];
      std::vector<double> wm(s.mn()), wgs(s.blocked(), 0), wgm(s.blocked(), 0), wv = v0[p], wout(s.blocked(), 0);
      for (int i = 0; i < s.m; i++)
        for (int j = 0; j < s.n; j++) {
          long long k = (long long)i * s.n + j, e = s.at(i, j);
          double gg = (float)gv[p][k];
          wm[k] = b1 * m0[p][k] + (1 - b1) * gg;
          wgs[e] = gg;
          wgm[e] = (float)wm[k];
          wv[e] = b2 * v0[p][e] + (1 - b2) * gg * gg;
          wout[e] = wgm[e] / (sqrt(wv[e]) + eps);
        }
      char what[64];
      snprintf(what, sizeof what, "soap multi tensor %d", p);
      check(std::string(what) + " m", mm[p].read(s.mn()), wm, 1e-6);
      check(std::string(what) + " gs", gs[p].read(s.blocked()), wgs, 1e-6);
      check(std::string(what) + " gm", gm[p].read(s.blocked()), wgm, 1e-6);
      check(std::string(what) + " out", out[p].read(s.blocked()), wout, 1e-6);
      // v of the padding keeps its value: only real elements update.
      check(std::string(what) + " v", v[p].read(s.blocked()), wv, 1e-6);
    }
  }
  return finish();
}
