// groupedgemm_test.cpp: runs libgpu/kernels/groupedgemm.cu under the host
// emulation (emu.h) with the launch geometry of libgpu/ops/groupedgemm.go
// (a persistent grid smaller than the tile count, so blocks take several
// tiles and the cp.async ring runs across tile boundaries) and checks the
// forward, dX, dW and bias-gradient kernels — wgmma (bf16, both tile
// widths) and CUDA-core (f32 and bf16) — against float64 grouped products:
// groups with no rows, one group holding every row, sizes that are not
// multiples of any tile, edges that are not multiples of 64, f32 and bf16
// outputs, accumulation, and offsets outside [0, rows] (clamped).
// Outputs start NaN-poisoned; rows outside the groups must stay untouched.
// Usage: scripts/cuda-emu.sh groupedgemm [quick]
#include "emu.h"
struct float2 {
  float x, y;
};
#define GG_DYN_SMEM(name) unsigned char* name = emu::g.smem.data()
// clang-format off
#include "../../libgpu/kernels/groupedgemm.cu"
// clang-format on
#include "emutest.h"

#include <cstddef>
#include <functional>
#include <string>

static_assert(offsetof(gg_args, lda) == 40, "gg_args");
static_assert(offsetof(gg_args, E) == 80, "gg_args");
static_assert(offsetof(gg_args, acc) == 100, "gg_args");

// Problem is one grouped product: T rows, E groups with offsets off, W [E,
// N, K].
struct Problem {
  int E, T, N, K;
  std::vector<int> off;  // E+1 entries as given to the kernel
  std::vector<int> lo, hi;  // the effective (clamped) group bounds
};

static Problem problem(std::vector<int> raw, int T, int N, int K) {
  Problem p{(int)raw.size() - 1, T, N, K, raw, {}, {}};
  int prev = std::min(std::max(raw[0], 0), T);
  for (int e = 0; e < p.E; e++) {
    int nx = std::max(prev, std::min(std::max(raw[e + 1], 0), T));
    p.lo.push_back(prev);
    p.hi.push_back(nx);
    prev = nx;
  }
  return p;
}

// Launch geometry of ops/groupedgemm.go: 256 threads, grid blocks.
static void run(const std::string& kernel, gg_args a, int grid, bool wg, int bn) {
  std::function<void()> body;
#define K(NAME)                             \
  if (kernel == #NAME) body = [a] { NAME(a); };
  K(gg_wg_fwd_256_f32) K(gg_wg_fwd_256_bf16) K(gg_wg_dx_256_f32) K(gg_wg_dx_256_bf16) K(gg_wg_dw_256_f32)
  K(gg_wg_dw_256_bf16) K(gg_wg_fwd_128_f32) K(gg_wg_fwd_128_bf16) K(gg_wg_dx_128_f32) K(gg_wg_dx_128_bf16)
  K(gg_wg_dw_128_f32) K(gg_wg_dw_128_bf16) K(gg_simt_fwd_f32_f32) K(gg_simt_fwd_bf16_f32) K(gg_simt_fwd_bf16_bf16)
  K(gg_simt_dx_f32_f32) K(gg_simt_dx_bf16_f32) K(gg_simt_dx_bf16_bf16) K(gg_simt_dw_f32_f32)
  K(gg_simt_dw_bf16_f32) K(gg_simt_dw_bf16_bf16)
#undef K
  if (!body) emu::fail(("no kernel " + kernel).c_str());
  size_t smem = wg ? (bn == 256 ? 4 : 6) * (128 * 64 * 2 + bn * 64 * 2) + 1024 : 0;
  emu::launch({(unsigned)grid, 1, 1}, {GG_THREADS, 1, 1}, smem, seed++, body);
}

// check compares got with want relative to the norm of the terms summed
// (floor) or of want, whichever is larger (opstest.RelErrFloor).
static void check_floor(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                        double floor, double tol) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double d = got[i] - want[i];
    if (std::isnan(d)) {
      num = INFINITY;
      break;
    }
    num += d * d;
    den += want[i] * want[i];
  }
  double e = sqrt(num) / std::max(sqrt(den), floor);
  bool ok = e <= tol;
  printf("%-4s %-72s relerr %.3g (tol %.3g)\n", ok ? "ok" : "FAIL", what.c_str(), e, tol);
  if (!ok) failures++;
}

// One case: pass (fwd, dx, dw), input dtype, output dtype, path.
static void run_case(const Problem& p, const std::string& pass, bool bf_in, bool bf_out, bool wg, int bn, bool acc,
                     bool bias, int grid) {
  const int E = p.E, T = p.T, N = p.N, K = p.K;
  Buf x, w, dy, out, bb, offs;
  x.alloc((size_t)T * K, bf_in);
  w.alloc((size_t)E * N * K, bf_in);
  dy.alloc((size_t)T * N, bf_in);
  bb.alloc((size_t)E * N, bf_in);
  offs.mem.assign(4 * (E + 1) + 16, 0);
  int* off = (int*)offs.base();
  for (int e = 0; e <= E; e++) off[e] = p.off[e];
  auto xv = x.fill((size_t)T * K, 1), wv = w.fill((size_t)E * N * K, 1), dyv = dy.fill((size_t)T * N, 1);
  auto bv = bb.fill((size_t)E * N, 1);
  size_t on = pass == "fwd" ? (size_t)T * N : pass == "dx" ? (size_t)T * K : (size_t)E * N * K;
  out.alloc(on, bf_out);
  std::vector<double> old(on, 0.0);
  if (acc) old = out.fill(on, 1);
  x.track();
  w.track();
  dy.track();
  bb.track();
  out.track();
  emu::track(offs.mem.data(), offs.mem.size());

  gg_args a{};
  a.offsets = off;
  a.E = E;
  a.rows = T;
  a.N = pass == "fwd" ? N : K;  // columns of C
  a.acc = acc;
  if (pass == "fwd") {
    a.a = x.ptr(), a.b = w.ptr(), a.c = out.ptr(), a.lda = K, a.ldb = K, a.ldc = N, a.sb = (long long)N * K, a.K = K;
    if (bias) a.bias = bb.ptr();
  } else if (pass == "dx") {
    a.a = dy.ptr(), a.b = w.ptr(), a.c = out.ptr(), a.lda = N, a.ldb = K, a.ldc = K, a.sb = (long long)N * K, a.K = N;
  } else {
    a.a = dy.ptr(), a.b = x.ptr(), a.c = out.ptr(), a.lda = N, a.ldb = K, a.ldc = K, a.sc = (long long)N * K, a.M = N;
  }
  std::string name = wg ? "gg_wg_" + pass + "_" + std::to_string(bn) + (bf_out ? "_bf16" : "_f32")
                        : std::string("gg_simt_") + pass + (bf_in ? "_bf16" : "_f32") + (bf_out ? "_bf16" : "_f32");
  run(name, a, grid, wg, bn);
  emu::untrack();

  std::vector<double> want(on), mag(on);
  std::vector<char> touched(on, 0);
  for (int e = 0; e < E; e++) {
    int r0 = p.lo[e], r1 = p.hi[e];
    if (pass == "fwd") {
      for (int r = r0; r < r1; r++)
        for (int n = 0; n < N; n++) {
          double s = 0, m = 0;
          for (int k = 0; k < K; k++) {
            double t = xv[(size_t)r * K + k] * wv[((size_t)e * N + n) * K + k];
            s += t, m += fabs(t);
          }
          if (bias) s += bv[(size_t)e * N + n], m += fabs(bv[(size_t)e * N + n]);
          want[(size_t)r * N + n] = s, mag[(size_t)r * N + n] = m, touched[(size_t)r * N + n] = 1;
        }
    } else if (pass == "dx") {
      for (int r = r0; r < r1; r++)
        for (int k = 0; k < K; k++) {
          double s = 0, m = 0;
          for (int n = 0; n < N; n++) {
            double t = dyv[(size_t)r * N + n] * wv[((size_t)e * N + n) * K + k];
            s += t, m += fabs(t);
          }
          want[(size_t)r * K + k] = s, mag[(size_t)r * K + k] = m, touched[(size_t)r * K + k] = 1;
        }
    } else {
      for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
          double s = 0, m = 0;
          for (int r = r0; r < r1; r++) {
            double t = dyv[(size_t)r * N + n] * xv[(size_t)r * K + k];
            s += t, m += fabs(t);
          }
          size_t i = ((size_t)e * N + n) * K + k;
          want[i] = s, mag[i] = m, touched[i] = 1;
        }
    }
  }
  std::vector<double> got = out.read(on), g2, w2;
  double floor = 0;
  int untouched_bad = 0;
  for (size_t i = 0; i < on; i++) {
    if (!touched[i]) {  // rows outside every group: left as they were (NaN unless acc)
      bool same = acc ? got[i] == (bf_out ? out.get(i) : got[i]) && !std::isnan(got[i]) : std::isnan(got[i]);
      if (!same) untouched_bad++;
      continue;
    }
    g2.push_back(got[i]);
    w2.push_back(want[i] + old[i]);
    floor += (mag[i] + fabs(old[i])) * (mag[i] + fabs(old[i]));
  }
  if (acc) {  // untouched rows must keep their old value
    untouched_bad = 0;
    for (size_t i = 0; i < on; i++)
      if (!touched[i] && got[i] != old[i]) untouched_bad++;
  }
  char what[200];
  snprintf(what, sizeof what, "%s %s in=%s out=%s E=%d T=%d N=%d K=%d acc=%d bias=%d grid=%d", name.c_str(),
           wg ? "" : "", bf_in ? "bf16" : "f32", bf_out ? "bf16" : "f32", E, T, N, K, acc, bias, grid);
  double tol = bf_out ? 1e-2 : bf_in ? 1e-5 : 1e-5;
  check_floor(what, g2, w2, sqrt(floor), tol);
  if (untouched_bad) {
    printf("FAIL %s: %d elements outside the groups changed\n", what, untouched_bad);
    failures++;
  }
}

static void colsum_case(const Problem& p, bool bf_in, bool bf_out, bool acc) {
  const int E = p.E, T = p.T, N = p.N;
  Buf dy, db, offs;
  dy.alloc((size_t)T * N, bf_in);
  db.alloc((size_t)E * N, bf_out);
  offs.mem.assign(4 * (E + 1) + 16, 0);
  int* off = (int*)offs.base();
  for (int e = 0; e <= E; e++) off[e] = p.off[e];
  auto dyv = dy.fill((size_t)T * N, 1);
  std::vector<double> old((size_t)E * N, 0.0);
  if (acc) old = db.fill((size_t)E * N, 1);
  dy.track();
  db.track();
  emu::track(offs.mem.data(), offs.mem.size());
  std::string name = std::string("gg_colsum") + (bf_in ? "_bf16" : "_f32") + (bf_out ? "_bf16" : "_f32");
  void* dbp = db.ptr();
  const void* dyp = dy.ptr();
  int accv = acc;
  std::function<void()> body;
  if (!bf_in)
    body = [=] { gg_colsum_f32_f32((float*)dbp, (const float*)dyp, off, T, N, N, accv); };
  else if (!bf_out)
    body = [=] { gg_colsum_bf16_f32((float*)dbp, (const gpukit_bf16*)dyp, off, T, N, N, accv); };
  else
    body = [=] { gg_colsum_bf16_bf16((gpukit_bf16*)dbp, (const gpukit_bf16*)dyp, off, T, N, N, accv); };
  emu::launch({(unsigned)((N + 31) / 32), (unsigned)E, 1}, {32, 8, 1}, 0, seed++, body);
  emu::untrack();
  std::vector<double> want((size_t)E * N);
  double floor = 0;
  for (int e = 0; e < E; e++)
    for (int n = 0; n < N; n++) {
      double s = old[(size_t)e * N + n], m = fabs(s);
      for (int r = p.lo[e]; r < p.hi[e]; r++) s += dyv[(size_t)r * N + n], m += fabs(dyv[(size_t)r * N + n]);
      want[(size_t)e * N + n] = s;
      floor += m * m;
    }
  check_floor(name + (acc ? " acc" : "") + " E=" + std::to_string(E), db.read((size_t)E * N), want, sqrt(floor),
              bf_out ? 1e-2 : 1e-5);
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "quick";
  // Groups: an empty one, sizes off every tile, one holding every row,
  // offsets past the ends (clamped), and rows outside every group.
  std::vector<Problem> ps = {
      problem({0, 0, 130, 137, 300}, 300, 136, 72),   // empty group, odd sizes, K not a multiple of 64
      problem({0, 200, 200, 200}, 200, 64, 128),      // one group takes every row; two empty
      problem({5, 40, 40, 9999}, 150, 72, 64),        // rows 0..4 in no group; last offset past T (clamped)
  };
  for (size_t i = 0; i < ps.size(); i++) {
    const Problem& p = ps[i];
    for (const char* pass : {"fwd", "dx", "dw"}) {
      for (int bn : {256, 128}) {
        if (quick && bn == 128) continue;
        run_case(p, pass, true, true, true, bn, i == 2, std::string(pass) == "fwd" && i == 0, 3);
        if (!quick) run_case(p, pass, true, false, true, bn, i == 1, false, 2);
      }
      run_case(p, pass, false, false, false, 0, i == 2, std::string(pass) == "fwd", 3);
      run_case(p, pass, true, true, false, 0, false, false, 5);
      if (!quick) run_case(p, pass, true, false, false, 0, true, std::string(pass) == "fwd", 2);
    }
    colsum_case(p, false, false, false);
    colsum_case(p, true, true, i == 1);
    colsum_case(p, true, false, true);
  }
  return finish();
}
