// gelu_test.cpp: runs libgpu/kernels/gelu.cu under the host emulation
// (emu.h) with the launch geometry of libgpu/ops/gelu.go (geluGrid) and
// checks forward and backward, both forms, f32 and bf16, vectorised and
// scalar instances, against float64 references; then sweeps x over
// [−9, 9] in f32 and reports the erf form's element-wise relative error
// by band (the bounds gelu.cu states). Usage: scripts/cuda-emu.sh gelu
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/gelu.cu"
// clang-format on
#include "emutest.h"

static double ref(double x, int form) {
  if (form == 0) {
    const double c = 0.7978845608028654, a = 0.044715;
    return x / (1 + exp(-2 * c * (x + a * x * x * x)));
  }
  return 0.5 * x * erfc(-x / sqrt(2.0));
}

static double refGrad(double x, int form) {
  if (form == 0) {
    const double c = 0.7978845608028654, a = 0.044715;
    double e = exp(-2 * c * (x + a * x * x * x));
    return 1 / (1 + e) + 2 * x / (2 + e + 1 / e) * c * (1 + 3 * a * x * x);
  }
  return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

// grid mirrors ops.geluGrid.
static unsigned grid(long long n, bool vec) {
  if (vec) n /= 8;
  long long b = ((n + 1) / 2 + 255) / 256;
  return (unsigned)std::min(std::max(b, 1LL), 65535LL);
}

static void fwd(Buf& y, Buf& x, long long n, int form, bool vec) {
  emu::launch({grid(n, vec), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
    if (x.bf) {
      if (vec)
        gelu_fwd_v_bf16(y.h(), x.h(), n, form);
      else
        gelu_fwd_s_bf16(y.h(), x.h(), n, form);
    } else {
      if (vec)
        gelu_fwd_v_f32(y.f(), x.f(), n, form);
      else
        gelu_fwd_s_f32(y.f(), x.f(), n, form);
    }
  });
}

static void bwd(Buf& dx, Buf& dy, Buf& x, long long n, int form, bool vec, int acc) {
  emu::launch({grid(n, vec), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
    if (x.bf) {
      if (vec)
        gelu_bwd_v_bf16(dx.h(), dy.h(), x.h(), n, form, acc);
      else
        gelu_bwd_s_bf16(dx.h(), dy.h(), x.h(), n, form, acc);
    } else {
      if (vec)
        gelu_bwd_v_f32(dx.f(), dy.f(), x.f(), n, form, acc);
      else
        gelu_bwd_s_f32(dx.f(), dy.f(), x.f(), n, form, acc);
    }
  });
}

static void run(long long n, bool bf16, int form, size_t off, double scale) {
  char name[128];
  snprintf(name, sizeof name, "n=%lld %s %s off=%zu scale=%g", n, bf16 ? "bf16" : "f32", form ? "erf" : "tanh", off,
           scale);
  emu::untrack();
  Buf x, y, dy, dx;
  x.alloc(n, bf16, off);
  y.alloc(n, bf16, off);
  dy.alloc(n, bf16, off);
  dx.alloc(n, bf16, off);
  for (Buf* b : {&x, &y, &dy, &dx}) b->track();
  bool vec = off == 0;
  std::vector<double> xv = x.fill(n, scale), dyv = dy.fill(n, 1);
  fwd(y, x, n, form, vec);
  std::vector<double> want(n), wantd(n);
  for (long long i = 0; i < n; i++) {
    want[i] = ref(xv[i], form);
    wantd[i] = dyv[i] * refGrad(xv[i], form);
  }
  double tol = bf16 ? 1e-2 : 1e-5;
  check(std::string(name) + " y", y.read(n), want, tol);
  bwd(dx, dy, x, n, form, vec, 0);
  check(std::string(name) + " dx", dx.read(n), wantd, tol);
  std::vector<double> old = dx.fill(n, 1);
  bwd(dx, dy, x, n, form, vec, 1);
  for (long long i = 0; i < n; i++) wantd[i] += old[i];
  check(std::string(name) + " dx (acc)", dx.read(n), wantd, tol);
}

// sweep: the erf form in f32 over a grid of x, element-wise relative error
// by band of |x| (x < 0 and x ≥ 0 apart), forward and backward.
static void sweep() {
  emu::untrack();
  const long long n = 36001;
  Buf x, y, dy, dx;
  x.alloc(n, false);
  y.alloc(n, false);
  dy.alloc(n, false);
  dx.alloc(n, false);
  for (Buf* b : {&x, &y, &dy, &dx}) b->track();
  for (long long i = 0; i < n; i++) {
    x.set(i, -9.0 + 18.0 * i / (n - 1));
    dy.set(i, 1.0);
  }
  fwd(y, x, n, 1, true);
  bwd(dx, dy, x, n, 1, true, 0);
  const double edges[] = {0, 1, 2, 4, 5.5, 9.01};
  double ey[2][5] = {}, ed[2][5] = {};
  for (long long i = 0; i < n; i++) {
    double xv = x.get(i), t = fabs(xv);
    int band = 0;
    while (t >= edges[band + 1]) band++;
    int neg = xv < 0;
    double ry = ref(xv, 1), rd = refGrad(xv, 1);
    if (ry != 0) ey[neg][band] = std::max(ey[neg][band], fabs(y.get(i) / ry - 1));
    // GELU' = Φ + xφ has a zero near x = −0.7518 (the terms cancel, in
    // any formulation): relative to max(|GELU'|, 0.1).
    ed[neg][band] = std::max(ed[neg][band], fabs(dx.get(i) - rd) / std::max(fabs(rd), 0.1));
  }
  for (int neg = 0; neg < 2; neg++)
    for (int b = 0; b < 5; b++)
      printf("     erf f32 %s |x| in [%g, %g): max rel err y %.3g, dy/dx %.3g\n", neg ? "x<0 " : "x>=0", edges[b],
             edges[b + 1], ey[neg][b], ed[neg][b]);
  // The bounds gelu.cu states for Q (plus the product's rounding); past
  // 5.5, erfcf's argument t/√2 is rounded to f32, which costs a relative
  // error of about t²·2⁻²⁴ (as the old erfcf-only kernel had).
  const double bound[5] = {4e-7, 8e-7, 2e-6, 4e-6, 6e-6};
  for (int neg = 0; neg < 2; neg++)
    for (int b = 0; b < 5; b++) {
      bool ok = ey[neg][b] <= bound[b] && ed[neg][b] <= 4 * bound[b];
      if (!ok) {
        printf("FAIL sweep band %d %s: %.3g / %.3g > %.3g\n", b, neg ? "neg" : "pos", ey[neg][b], ed[neg][b], bound[b]);
        failures++;
      }
    }
}

int main(int argc, char** argv) {
  for (int form : {0, 1})
    for (bool bf16 : {false, true}) {
      for (long long n : {1LL, 7LL, 8LL, 1003LL, 4096LL, 20011LL}) run(n, bf16, form, 0, 2);
      run(1003, bf16, form, 1, 2);
      run(5000, bf16, form, 0, 5);  // the tails, x beyond ±5.5
    }
  sweep();
  return finish();
}
