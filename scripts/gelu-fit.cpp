// gelu-fit.cpp: derives the polynomial of libgpu/kernels/gelu.cu's erf-form
// GELU. Q(t) = ½·erfc(t/√2) (the normal upper tail) is computed there as
// 2^P(t) for t in [0, T]; P is the Chebyshev interpolant of log₂ Q on
// [0, T] (degree n, in long double), converted to monomials in t and
// rounded to f32. The program prints P's coefficients (highest first, in
// the order gelu_q uses them) and Q's relative error by band of t when P
// is evaluated by Horner in f32 (fmaf) and 2^P is exact.
//
//   g++ -O2 -o /tmp/gelu-fit scripts/gelu-fit.cpp && /tmp/gelu-fit 11 5.5
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

typedef long double ld;

static ld logQ(ld t) { return log2l(0.5L * erfcl(t / sqrtl(2.0L))); }

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 11;
  const ld T = argc > 2 ? strtold(argv[2], nullptr) : 5.5L;
  const int N = n + 1;
  // Chebyshev coefficients from the values at the Chebyshev nodes.
  std::vector<ld> f(N), c(N);
  for (int k = 0; k < N; k++) f[k] = logQ(T / 2 * (cosl(M_PIl * (k + 0.5L) / N) + 1));
  for (int j = 0; j < N; j++) {
    ld s = 0;
    for (int k = 0; k < N; k++) s += f[k] * cosl(M_PIl * j * (k + 0.5L) / N);
    c[j] = 2 * s / N;
  }
  c[0] /= 2;
  // Σ c_j T_j(u) with u = (2/T)t − 1, as monomials in u, then in t.
  std::vector<std::vector<ld>> Tp(N, std::vector<ld>(N, 0));
  Tp[0][0] = 1;
  if (N > 1) Tp[1][1] = 1;
  for (int j = 2; j < N; j++)
    for (int i = 0; i < N; i++) Tp[j][i] = (i > 0 ? 2 * Tp[j - 1][i - 1] : 0) - Tp[j - 2][i];
  std::vector<ld> a(N, 0), b(N, 0);
  for (int j = 0; j < N; j++)
    for (int i = 0; i < N; i++) a[i] += c[j] * Tp[j][i];
  const ld s = 2 / T;
  for (int i = 0; i < N; i++) {
    ld binom = 1;
    for (int k = 0; k <= i; k++) {
      b[k] += a[i] * binom * powl(s, k) * (((i - k) % 2) ? -1 : 1);
      binom = binom * (i - k) / (k + 1);
    }
  }
  std::vector<float> bf(N);
  for (int i = 0; i < N; i++) bf[i] = (float)b[i];
  for (int i = N - 1; i >= 0; i--) printf("  %.9ef\n", (double)bf[i]);
  const double edges[] = {0, 1, 2, 4, (double)T};
  double err[4] = {0, 0, 0, 0};
  for (int st = 0; st <= 300000; st++) {
    const float t = (float)(T * st / 300000);
    float p = bf[N - 1];
    for (int i = N - 2; i >= 0; i--) p = fmaf(p, t, bf[i]);
    const ld q = exp2l((ld)p), ref = 0.5L * erfcl((ld)t / sqrtl(2.0L));
    int band = 0;
    while (band < 3 && t >= edges[band + 1]) band++;
    err[band] = fmax(err[band], (double)fabsl(q / ref - 1));
  }
  for (int i = 0; i < 4; i++) printf("t in [%g, %g): max relative error of Q %.3g\n", edges[i], edges[i + 1], err[i]);
}
