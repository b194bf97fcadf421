// rmsnorm_test.cpp: runs libgpu/kernels/rmsnorm.cu under the host
// emulation (emu.h) with the launch geometry of libgpu/ops/rmsnorm.go
// (rwPlanRows: a warp per row caching 8, 16 or 32 elements per lane, or a
// block per row, re-reading rows wider than its cache) and checks RMSNorm
// and AddRMSNorm, forward and backward (dx, dr, the dw rows, accumulated),
// f32 and bf16, scalar and vectorised instances, row-strided, against
// float64 references. Usage: scripts/cuda-emu.sh rmsnorm
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/rmsnorm.cu"
// clang-format on
#include <cmath>
#include <cstddef>
#include <map>

#include "emutest.h"

static_assert(offsetof(rms_args, gw) == 72, "rms_args");
static_assert(offsetof(rms_args, rows) == 80, "rms_args");
static_assert(offsetof(rms_args, C) == 144, "rms_args");
static_assert(offsetof(rms_args, eps) == 152, "rms_args");
static_assert(offsetof(rms_args, acc_dr) == 160, "rms_args");

typedef void (*rmsk)(const rms_args);
#define RMS_REG(DT)                                                                              \
  {"rms_fwd_e8s_" #DT, rms_fwd_e8s_##DT}, {"rms_fwd_e16s_" #DT, rms_fwd_e16s_##DT},             \
      {"rms_fwd_e32s_" #DT, rms_fwd_e32s_##DT}, {"rms_fwd_e8v_" #DT, rms_fwd_e8v_##DT},         \
      {"rms_fwd_e16v_" #DT, rms_fwd_e16v_##DT}, {"rms_fwd_e32v_" #DT, rms_fwd_e32v_##DT},       \
      {"rms_bwd_e8s_" #DT, rms_bwd_e8s_##DT}, {"rms_bwd_e16s_" #DT, rms_bwd_e16s_##DT},         \
      {"rms_bwd_e32s_" #DT, rms_bwd_e32s_##DT}, {"rms_bwd_e8v_" #DT, rms_bwd_e8v_##DT},         \
      {"rms_bwd_e16v_" #DT, rms_bwd_e16v_##DT}, {"rms_bwd_e32v_" #DT, rms_bwd_e32v_##DT}
static std::map<std::string, rmsk> kernels = {RMS_REG(f32), RMS_REG(bf16)};

struct plan {  // ops.rwPlanRows
  std::string inst;
  bool block;
  unsigned threads, groups;
};
static plan plan_rows(long long C, bool vec) {
  std::string v = vec ? "v" : "s";
  if (C <= 1024) {
    int e = 8;
    while (32 * e < C) e *= 2;
    return {"e" + std::to_string(e) + v, false, 128, 4};
  }
  return {"e8" + v, true, (unsigned)std::min<long long>(1024, (C + 255) / 256 * 32), 1};
}

static void launch(const std::string& name, const plan& p, long long rows, const rms_args& a) {
  auto it = kernels.find(name);
  if (it == kernels.end()) emu::fail(("no kernel " + name).c_str());
  unsigned grid = (unsigned)std::min<long long>((rows + p.groups - 1) / p.groups, 1 << 20);
  emu::launch({grid, 1, 1}, {p.threads, 1, 1}, 0, seed++, [&] { it->second(a); });
}

// check_floor is check with the error relative to max(‖want‖, floor): dx
// of a one-column row is 0 up to rounding (x̂² = x²/(x² + eps) ≈ 1), so
// its scale is ‖dy‖·rstd, not ‖dx‖ (opstest's NearFloor).
static void check_floor(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                        double floor, double tol) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double d = got[i] - want[i];
    num += std::isnan(d) ? INFINITY : d * d;
    den += want[i] * want[i];
  }
  double e = sqrt(num) / std::max(sqrt(den), floor);
  bool ok = e <= tol;
  printf("%-4s %-64s relerr %.3g (tol %.3g)\n", ok ? "ok" : "FAIL", what.c_str(), e, tol);
  if (!ok) failures++;
}

static double rnd(double v, bool bf) { return bf ? gpukit_bf16_to_f32(gpukit_f32_to_bf16((float)v)) : (double)(float)v; }

// Rows of C elements with row stride ld, as Buf; the padding stays NaN.
static std::vector<double> fill_rows(Buf& b, long long rows, long long C, long long ld, double scale) {
  std::vector<double> v;
  for (long long i = 0; i < rows; i++)
    for (long long j = 0; j < C; j++) {
      b.set(i * ld + j, scale * randn());
      v.push_back(b.get(i * ld + j));
    }
  return v;
}
static std::vector<double> read_rows(Buf& b, long long rows, long long C, long long ld) {
  std::vector<double> v;
  for (long long i = 0; i < rows; i++)
    for (long long j = 0; j < C; j++) v.push_back(b.get(i * ld + j));
  return v;
}
static bool pad_nan(Buf& b, long long rows, long long C, long long ld) {
  for (long long i = 0; i < rows; i++)
    for (long long j = C; j < ld; j++)
      if (!std::isnan(b.get(i * ld + j))) return false;
  return true;
}

static void run(long long rows, long long C, bool bf, bool add, bool weight, long long pad, size_t off) {
  char name[160];
  snprintf(name, sizeof name, "%lldx%lld %s %s weight=%d pad=%lld off=%zu", rows, C, bf ? "bf16" : "f32",
           add ? "add" : "rms", weight, pad, off);
  const long long ld = C + pad;
  Buf x, r, sum, y, dy, dx, dr, w, rstd, gw;
  for (Buf* b : {&x, &r, &sum, &y, &dy, &dx, &dr}) b->alloc(rows * ld, bf, off);
  w.alloc(C, false);
  rstd.alloc(rows, false);
  gw.alloc(rows * C, false);
  std::vector<double> xv = fill_rows(x, rows, C, ld, 1.5), rv, wv;
  if (add) rv = fill_rows(r, rows, C, ld, 1);
  if (weight) wv = w.fill(C, 1);
  rms_args a{};
  a.y = y.ptr();
  a.x = x.ptr();
  a.w = weight ? w.f() : nullptr;
  a.rstd = rstd.f();
  a.rows = rows;
  a.ldy = a.ldx = a.ldr = a.lds = a.lddy = a.lddx = a.lddr = ld;
  a.C = (int)C;
  a.eps = 1e-5f;
  if (add) {
    a.r = r.ptr();
    a.sum = sum.ptr();
  }
  bool vec = (uintptr_t)x.ptr() % 16 == 0 && C % 8 == 0 && ld % 8 == 0;
  plan p = plan_rows(C, vec);
  a.block = p.block;
  launch("rms_fwd_" + p.inst + (bf ? "_bf16" : "_f32"), p, rows, a);
  // Reference from the stored input (x, or x + r rounded to the dtype).
  std::vector<double> s(rows * C), wy(rows * C), wr(rows);
  for (size_t i = 0; i < s.size(); i++) s[i] = add ? rnd(xv[i] + rv[i], bf) : xv[i];
  for (long long i = 0; i < rows; i++) {
    double q = 0;
    for (long long j = 0; j < C; j++) q += s[i * C + j] * s[i * C + j];
    wr[i] = 1 / sqrt(q / C + 1e-5);
    for (long long j = 0; j < C; j++) wy[i * C + j] = s[i * C + j] * wr[i] * (weight ? wv[j] : 1);
  }
  double tol = bf ? 1e-2 : 1e-5;
  if (add) check(std::string(name) + " sum", read_rows(sum, rows, C, ld), s, 0);
  check(std::string(name) + " y", read_rows(y, rows, C, ld), wy, tol);
  check(std::string(name) + " rstd", rstd.read(rows), wr, 1e-5);
  if (!pad_nan(y, rows, C, ld)) {
    printf("FAIL %s: y written outside its rows\n", name);
    failures++;
  }
  // Backward from the normalised input, dx written, dr accumulated, dw rows.
  std::vector<double> dyv = fill_rows(dy, rows, C, ld, 1);
  std::vector<double> dr0 = fill_rows(dr, rows, C, ld, 1);
  rms_args b{};
  b.x = add ? sum.ptr() : x.ptr();
  b.dy = dy.ptr();
  b.dx = dx.ptr();
  b.dr = dr.ptr();
  b.w = a.w;
  b.rstd = rstd.f();
  b.gw = gw.f();
  b.rows = rows;
  b.ldx = b.lddy = b.lddx = b.lddr = ld;
  b.C = (int)C;
  b.acc_dr = 1;
  plan pb = plan_rows(C, vec);
  b.block = pb.block;
  launch("rms_bwd_" + pb.inst + (bf ? "_bf16" : "_f32"), pb, rows, b);
  std::vector<double> wdx(rows * C), wgw(rows * C), wdr(rows * C);
  for (long long i = 0; i < rows; i++) {
    double rs = rstd.get(i), sg = 0;
    for (long long j = 0; j < C; j++) sg += dyv[i * C + j] * (weight ? wv[j] : 1) * s[i * C + j] * rs;
    for (long long j = 0; j < C; j++) {
      double xh = s[i * C + j] * rs, g = dyv[i * C + j] * (weight ? wv[j] : 1);
      wdx[i * C + j] = rs * (g - xh * sg / C);
      wgw[i * C + j] = dyv[i * C + j] * xh;
      wdr[i * C + j] = dr0[i * C + j] + wdx[i * C + j];
    }
  }
  double floor = 0, wmax = 1, rmax = 0;
  for (double v : dyv) floor += v * v;
  for (double v : wv) wmax = std::max(wmax, fabs(v));
  for (double v : wr) rmax = std::max(rmax, v);
  floor = sqrt(floor) * wmax * rmax;
  check_floor(std::string(name) + " dx", read_rows(dx, rows, C, ld), wdx, floor, tol);
  check_floor(std::string(name) + " dr (acc)", read_rows(dr, rows, C, ld), wdr, floor, tol);
  check(std::string(name) + " dw rows", gw.read(rows * C), wgw, 1e-5);
}

int main() {
  // Every instance: warp rows caching 8, 16, 32 (scalar and vectorised),
  // block rows, and rows wider than the block's cache (re-read).
  const long long shapes[][2] = {{5, 1}, {9, 7}, {6, 64}, {5, 200}, {4, 512}, {3, 1000}, {2, 1032}, {2, 3001}, {2, 8200}};
  for (auto& sh : shapes)
    for (bool bf : {false, true})
      for (bool add : {false, true}) run(sh[0], sh[1], bf, add, sh[1] % 3 != 0, 0, 0);
  run(7, 64, false, true, true, 8, 0);    // strided rows, vectorised
  run(7, 64, true, false, false, 5, 1);   // strided, misaligned: scalar
  run(3, 2048, true, true, true, 16, 0);  // block rows, strided
  return finish();
}
