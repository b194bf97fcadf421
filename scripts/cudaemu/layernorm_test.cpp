// layernorm_test.cpp: runs libgpu/kernels/layernorm.cu under the host
// emulation (emu.h) with the launch geometry of libgpu/ops/layernorm.go
// (lnFast, rwPlanRows, the backward's blocks, rows per block and fold
// groups; a small "GPU" of a few resident blocks so warps loop over rows
// and folds have several groups) and checks LayerNorm and AddLayerNorm,
// forward and backward (dx, dr, dw, db, with and without dsum,
// accumulated), f32 and bf16, fast and general kernels, against float64
// references; a second backward must give the same bits and leave the
// tickets zero. Usage: scripts/cuda-emu.sh layernorm [quick]
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/layernorm.cu"
// clang-format on
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>

#include "emutest.h"

// The C side of libgpu/ops/layernorm_layout_test.go (NVRTC rejects
// offsetof in static_assert; the host compiler's LP64 layout is NVPTX's).
static_assert(offsetof(ln_args, part) == 112, "ln_args");
static_assert(offsetof(ln_args, rows) == 128, "ln_args");
static_assert(offsetof(ln_args, lddr) == 192, "ln_args");
static_assert(offsetof(ln_args, rpb) == 200, "ln_args");
static_assert(offsetof(ln_args, C) == 208, "ln_args");
static_assert(offsetof(ln_args, eps) == 216, "ln_args");
static_assert(offsetof(ln_args, acc_dx) == 220, "ln_args");
static_assert(offsetof(ln_args, group) == 236, "ln_args");

typedef void (*lnk)(const ln_args);

#define LNF_REG(DT, T)                                                                  \
  {"ln_fwdf_v4n1_" #DT, ln_fwdf_v4n1_##DT}, {"ln_fwdf_v4n2_" #DT, ln_fwdf_v4n2_##DT},   \
      {"ln_fwdf_v4n3_" #DT, ln_fwdf_v4n3_##DT}, {"ln_fwdf_v4n4_" #DT, ln_fwdf_v4n4_##DT}, \
      {"ln_fwdf_v8n1_" #DT, ln_fwdf_v8n1_##DT}, {"ln_fwdf_v8n2_" #DT, ln_fwdf_v8n2_##DT}, \
      {"ln_fwdf_v8n3_" #DT, ln_fwdf_v8n3_##DT}, {"ln_fwdf_v8n4_" #DT, ln_fwdf_v8n4_##DT}, \
      {"ln_addf_v4n1_" #DT, ln_addf_v4n1_##DT}, {"ln_addf_v4n2_" #DT, ln_addf_v4n2_##DT}, \
      {"ln_addf_v4n3_" #DT, ln_addf_v4n3_##DT}, {"ln_addf_v4n4_" #DT, ln_addf_v4n4_##DT}, \
      {"ln_addf_v8n1_" #DT, ln_addf_v8n1_##DT}, {"ln_addf_v8n2_" #DT, ln_addf_v8n2_##DT}, \
      {"ln_addf_v8n3_" #DT, ln_addf_v8n3_##DT}, {"ln_addf_v8n4_" #DT, ln_addf_v8n4_##DT}, \
      {"ln_bwdf_v4n1_" #DT, ln_bwdf_v4n1_##DT}, {"ln_bwdf_v4n2_" #DT, ln_bwdf_v4n2_##DT}, \
      {"ln_bwdf_v4n3_" #DT, ln_bwdf_v4n3_##DT}, {"ln_bwdf_v4n4_" #DT, ln_bwdf_v4n4_##DT}, \
      {"ln_bwdf_v8n1_" #DT, ln_bwdf_v8n1_##DT}, {"ln_bwdf_v8n2_" #DT, ln_bwdf_v8n2_##DT}, \
      {"ln_bwdf_v8n3_" #DT, ln_bwdf_v8n3_##DT}, {"ln_bwdf_v8n4_" #DT, ln_bwdf_v8n4_##DT}
#define LN_REG(DT)                                                                          \
  {"ln_fwd_e8s_" #DT, ln_fwd_e8s_##DT}, {"ln_fwd_e16s_" #DT, ln_fwd_e16s_##DT},             \
      {"ln_fwd_e32s_" #DT, ln_fwd_e32s_##DT}, {"ln_fwd_e8v_" #DT, ln_fwd_e8v_##DT},         \
      {"ln_fwd_e16v_" #DT, ln_fwd_e16v_##DT}, {"ln_fwd_e32v_" #DT, ln_fwd_e32v_##DT},       \
      {"ln_bwd_e8s_" #DT, ln_bwd_e8s_##DT}, {"ln_bwd_e16s_" #DT, ln_bwd_e16s_##DT},         \
      {"ln_bwd_e32s_" #DT, ln_bwd_e32s_##DT}, {"ln_bwd_e8v_" #DT, ln_bwd_e8v_##DT},         \
      {"ln_bwd_e16v_" #DT, ln_bwd_e16v_##DT}, {"ln_bwd_e32v_" #DT, ln_bwd_e32v_##DT}

static std::map<std::string, lnk> kernels = {LNF_REG(f32, float), LNF_REG(bf16, gpukit_bf16), LN_REG(f32),
                                             LN_REG(bf16)};

static int resident = 6;  // blocks the "GPU" holds at once (ops: residentGrid)

// fast mirrors ops.lnFast: the instance for rows of C elements when the
// layout allows (row pointers aligned to V elements, the f32 parameters
// w, b — the last two of ptrs — to 16 bytes, C and strides multiples of
// V).
static std::string fast(int C, bool bf, const std::vector<void*>& ptrs, const std::vector<long long>& counts) {
  const int shapes[8][2] = {{4, 1}, {8, 1}, {4, 2}, {4, 3}, {8, 2}, {4, 4}, {8, 3}, {8, 4}};
  for (auto& sh : shapes) {
    int v = sh[0], nv = sh[1];
    if (C > 32 * v * nv || C % v) continue;
    bool ok = true;
    for (size_t i = 0; i < ptrs.size(); i++) {
      size_t align = i + 2 >= ptrs.size() ? 16 : std::min(16, v * (bf ? 2 : 4));
      if (ptrs[i] && (uintptr_t)ptrs[i] % align) ok = false;
    }
    for (long long n : counts)
      if (n % v) ok = false;
    if (ok) return "v" + std::to_string(v) + "n" + std::to_string(nv);
  }
  return "";
}

struct plan {  // ops.rwPlanRows
  std::string inst;
  bool block;
  int threads, groups;
};
static plan general(int C, bool vec) {
  std::string v = vec ? "v" : "s";
  if (C <= 1024) {
    int e = 8;
    while (32 * e < C) e *= 2;
    return {"e" + std::to_string(e) + v, false, 128, 4};
  }
  return {"e8" + v, true, std::min(1024, (C + 255) / 256 * 32), 1};
}

static bool aligned16(const std::vector<void*>& ptrs, const std::vector<long long>& counts) {
  for (void* p : ptrs)
    if (p && (uintptr_t)p % 16) return false;
  for (long long n : counts)
    if (n % 8) return false;
  return true;
}

static void launch(const std::string& name, unsigned grid, unsigned threads, size_t smem, const ln_args& a) {
  auto it = kernels.find(name);
  if (it == kernels.end()) emu::fail(("no kernel " + name).c_str());
  emu::launch({grid, 1, 1}, {threads, 1, 1}, smem, seed++, [&] { it->second(a); });
}

static std::string dts(bool bf) { return bf ? "_bf16" : "_f32"; }

// forward mirrors cudaImpl.layerNorm; returns the kernel used.
static std::string forward(ln_args a, bool bf) {
  std::vector<void*> ptrs = {(void*)a.x, a.y, (void*)a.r, a.sum, (void*)a.w, (void*)a.b};
  std::vector<long long> counts = {a.C, a.ldx, a.ldy, a.ldr, a.lds};
  std::string inst = fast(a.C, bf, ptrs, counts);
  if (!inst.empty()) {
    std::string name = (a.r ? "ln_addf_" : "ln_fwdf_") + inst + dts(bf);
    launch(name, (unsigned)std::min<long long>(resident, (a.rows + 7) / 8), 256, 0, a);
    return name;
  }
  plan p = general(a.C, aligned16(ptrs, counts));
  a.block = p.block;
  std::string name = "ln_fwd_" + p.inst + dts(bf);
  launch(name, (unsigned)std::min<long long>((a.rows + p.groups - 1) / p.groups, 1 << 20), p.threads, 0, a);
  return name;
}

// backward mirrors cudaImpl.layerNormBackward (a.part and a.tickets are
// scratch the caller gives; set to null when neither dw nor db is wanted).
static std::string backward(ln_args a, bool bf, float* part, unsigned* tickets) {
  std::vector<void*> ptrs = {(void*)a.x, (void*)a.dy, (void*)a.gsum, a.dx, a.dr, (void*)a.w, nullptr};
  std::vector<long long> counts = {a.C, a.ldx, a.lddy};
  if (a.gsum) counts.push_back(a.ldg);
  if (a.dx) counts.push_back(a.lddx);
  if (a.dr) counts.push_back(a.lddr);
  std::string inst = fast(a.C, bf, ptrs, counts), name;
  long long nb;
  unsigned threads;
  size_t smem = 0;
  if (!inst.empty()) {
    name = "ln_bwdf_" + inst + dts(bf);
    threads = 256;
    smem = 8 * 2 * a.C * 4;
    nb = std::min<long long>(resident, (a.rows + 7) / 8);
  } else {
    plan p = general(a.C, aligned16(ptrs, counts));
    name = "ln_bwd_" + p.inst + dts(bf);
    threads = p.threads;
    a.block = p.block;
    nb = std::min<long long>((a.rows + p.groups - 1) / p.groups, 512);
  }
  long long rpb = (a.rows + nb - 1) / nb;
  nb = (a.rows + rpb - 1) / rpb;
  a.rpb = rpb;
  if (a.dw || a.db) {
    int s = (int)ceil(sqrt((double)nb));
    a.group = s;
    a.part = part;
    a.tickets = tickets;
  } else {
    a.part = nullptr;
    a.tickets = nullptr;
  }
  launch(name, (unsigned)nb, threads, smem, a);
  return name;
}

// Rows of C elements with row stride ld (ld ≥ C; the columns between are
// NaN and must stay so), off elements into an aligned buffer.
struct Rows {
  Buf b;
  long long rows, C, ld;
  void alloc(long long r, long long c, long long l, bool bf, size_t off) {
    rows = r, C = c, ld = l;
    b.alloc(rows * ld, bf, off);
  }
  std::vector<double> fill(double scale, double shift) {
    std::vector<double> v;
    for (long long i = 0; i < rows; i++)
      for (long long j = 0; j < C; j++) {
        b.set(i * ld + j, shift + scale * randn());
        v.push_back(b.get(i * ld + j));
      }
    return v;
  }
  std::vector<double> read() {
    std::vector<double> v;
    for (long long i = 0; i < rows; i++)
      for (long long j = 0; j < C; j++) v.push_back(b.get(i * ld + j));
    return v;
  }
  bool untouched() {
    for (long long i = 0; i < rows; i++)
      for (long long j = C; j < ld && i * ld + j < rows * ld; j++)
        if (!std::isnan(b.get(i * ld + j))) return false;
    return true;
  }
  void* ptr() { return b.ptr(); }
};

static double rnd_dt(double v, bool bf) {
  return bf ? gpukit_bf16_to_f32(gpukit_f32_to_bf16((float)v)) : (double)(float)v;
}

static void refln(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b, long long rows,
                  long long C, std::vector<double>& y, std::vector<double>& mean, std::vector<double>& rstd) {
  y.assign(rows * C, 0);
  mean.assign(rows, 0);
  rstd.assign(rows, 0);
  for (long long r = 0; r < rows; r++) {
    double s = 0, q = 0;
    for (long long j = 0; j < C; j++) s += x[r * C + j];
    double mu = s / C;
    for (long long j = 0; j < C; j++) q += (x[r * C + j] - mu) * (x[r * C + j] - mu);
    double rs = 1 / sqrt(q / C + 1e-5);
    for (long long j = 0; j < C; j++) y[r * C + j] = (x[r * C + j] - mu) * rs * (w.empty() ? 1 : w[j]) + (b.empty() ? 0 : b[j]);
    mean[r] = mu;
    rstd[r] = rs;
  }
}

static void run(long long rows, long long C, bool bf, bool add, bool affine, long long pad, size_t off) {
  char name[160];
  snprintf(name, sizeof name, "%lldx%lld %s %s affine=%d pad=%lld off=%zu", rows, C, bf ? "bf16" : "f32",
           add ? "add" : "ln", affine, pad, off);
  emu::untrack();
  long long ld = C + pad;
  Rows x, r, sum, y, dy, gs, dx, dr;
  for (Rows* t : {&x, &r, &sum, &y, &dy, &gs, &dx, &dr}) t->alloc(rows, C, ld, bf, off);
  Buf w, b, mean, rstd, dw, db, part, tick;
  w.alloc(C, false);
  b.alloc(C, false);
  mean.alloc(rows, false);
  rstd.alloc(rows, false);
  dw.alloc(C, false);
  db.alloc(C, false);
  part.alloc((1024 + 64) * 2 * C, false);
  tick.alloc(64, false);
  memset(tick.ptr(), 0, 64 * 4);
  for (Rows* t : {&x, &r, &sum, &y, &dy, &gs, &dx, &dr}) t->b.track();
  for (Buf* t : {&w, &b, &mean, &rstd, &dw, &db, &part, &tick}) t->track();
  std::vector<double> xv = x.fill(1.5, 3), rv, wv, bv;
  if (add) rv = r.fill(1, 0);
  if (affine) {
    wv = w.fill(C, 1);
    bv = b.fill(C, 1);
  }
  ln_args a;
  memset(&a, 0, sizeof a);
  a.rows = rows;
  a.C = (int)C;
  a.eps = 1e-5f;
  a.x = x.ptr();
  a.ldx = ld;
  a.y = y.ptr();
  a.ldy = ld;
  if (add) {
    a.r = r.ptr();
    a.ldr = ld;
    a.sum = sum.ptr();
    a.lds = ld;
  }
  a.w = affine ? w.f() : nullptr;
  a.b = affine ? b.f() : nullptr;
  a.mean = mean.f();
  a.rstd = rstd.f();
  std::string kf = forward(a, bf);
  std::vector<double> sv = xv;
  if (add)
    for (size_t i = 0; i < sv.size(); i++) sv[i] = rnd_dt(xv[i] + rv[i], bf);
  std::vector<double> wy, wm, wr;
  refln(sv, wv, bv, rows, C, wy, wm, wr);
  double tol = bf ? 1e-2 : 1e-5;
  std::string nm = std::string(name) + " [" + kf + "]";
  if (add) check(nm + " sum", sum.read(), sv, 0);
  check(nm + " y", y.read(), wy, tol);
  check(nm + " mean", mean.read(rows), wm, 1e-5);
  check(nm + " rstd", rstd.read(rows), wr, 1e-5);
  if (!y.untouched() || (add && !sum.untouched())) {
    printf("FAIL %s: padding written\n", nm.c_str());
    failures++;
  }

  // backward: t = LN'(dy) (+ dsum), dx = dr = t (dx accumulated onto
  // random values), dw, db.
  std::vector<double> dyv = dy.fill(1, 0), gsv, dx0 = dx.fill(1, 0);
  if (add) gsv = gs.fill(1, 0);
  ln_args k;
  memset(&k, 0, sizeof k);
  k.rows = rows;
  k.C = (int)C;
  k.x = add ? sum.ptr() : x.ptr();
  k.ldx = ld;
  k.dy = dy.ptr();
  k.lddy = ld;
  k.dx = dx.ptr();
  k.lddx = ld;
  k.acc_dx = 1;
  if (add) {
    k.gsum = gs.ptr();
    k.ldg = ld;
    k.dr = dr.ptr();
    k.lddr = ld;
  }
  k.w = affine ? w.f() : nullptr;
  k.mean = mean.f();
  k.rstd = rstd.f();
  k.dw = dw.f();
  k.db = db.f();
  std::string kb = backward(k, bf, part.f(), (unsigned*)tick.ptr());
  std::vector<double> wt(rows * C), wdw(C, 0), wdb(C, 0);
  for (long long i = 0; i < rows; i++) {
    double mu = mean.get(i), rs = rstd.get(i), s1 = 0, s2 = 0;
    for (long long j = 0; j < C; j++) {
      double xh = (sv[i * C + j] - mu) * rs, g = dyv[i * C + j] * (affine ? wv[j] : 1);
      s1 += g;
      s2 += g * xh;
      wdw[j] += dyv[i * C + j] * xh;
      wdb[j] += dyv[i * C + j];
    }
    for (long long j = 0; j < C; j++) {
      double xh = (sv[i * C + j] - mu) * rs, g = dyv[i * C + j] * (affine ? wv[j] : 1);
      wt[i * C + j] = rs * (g - s1 / C - xh * s2 / C) + (add ? gsv[i * C + j] : 0);
    }
  }
  std::vector<double> wdx(wt);
  for (size_t i = 0; i < wdx.size(); i++) wdx[i] += dx0[i];
  nm = std::string(name) + " [" + kb + "]";
  check(nm + " dx (acc)", dx.read(), wdx, tol);
  if (add) check(nm + " dr", dr.read(), wt, tol);
  check(nm + " dw", dw.read(C), wdw, 1e-5);
  check(nm + " db", db.read(C), wdb, 1e-5);
  for (int i = 0; i < 64; i++)
    if (((unsigned*)tick.ptr())[i] != 0) {
      printf("FAIL %s: ticket %d left %u\n", nm.c_str(), i, ((unsigned*)tick.ptr())[i]);
      failures++;
      break;
    }
  if (!dx.untouched() || (add && !dr.untouched())) {
    printf("FAIL %s: padding written\n", nm.c_str());
    failures++;
  }
  // Again, dw and db accumulated: twice the sums, bit for bit 2× the first
  // (x + x is exact), so the fold gave the same bits both times.
  std::vector<float> dw1(dw.f(), dw.f() + C), db1(db.f(), db.f() + C);
  k.acc_w = k.acc_b = 1;
  k.dx = nullptr;
  k.dr = nullptr;
  backward(k, bf, part.f(), (unsigned*)tick.ptr());
  for (long long j = 0; j < C; j++)
    if (dw.f()[j] != 2 * dw1[j] || db.f()[j] != 2 * db1[j]) {
      printf("FAIL %s: second fold differs at column %lld\n", nm.c_str(), j);
      failures++;
      break;
    }
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "quick";
  for (bool bf : {false, true})
    for (bool add : {false, true}) {
      // fast (vectorised, C ≤ 1024), rows giving several per warp and
      // several fold groups, and padded rows
      run(37, 384, bf, add, true, 0, 0);
      run(100, 96, bf, add, true, 8, 0);
      run(29, 24, bf, add, false, 0, 0);
      run(19, 264, bf, add, true, 0, 0);
      run(9, 1000, bf, add, true, 0, 0);
      run(5, 12, bf, add, true, 4, 0);  // V = 4 only
      // general: scalar (misaligned or C odd), block rows, past the cache
      run(13, 67, bf, add, true, 0, 0);
      run(21, 384, bf, add, true, 0, 1);
      run(21, 384, bf, add, true, 0, 4);  // bf16: 8-byte aligned (V = 4 only); f32: 16
      run(11, 264, bf, add, true, 8, 2);  // f32 8-byte aligned: general
      run(3, 1032, bf, add, true, 0, 0);
      if (!quick) {
        run(70, 768, bf, add, true, 0, 0);
        run(40, 1024, bf, add, true, 0, 0);
        run(2, 3001, bf, add, true, 0, 0);
        run(2, 8200, bf, add, true, 0, 0);
        run(2, 8201, bf, add, false, 0, 0);
        run(210, 48, bf, add, true, 0, 0);
      }
    }
  resident = 40;  // 40 blocks: fold groups of 7 (the last of 5)
  run(400, 128, true, true, true, 0, 0);
  run(400, 128, false, false, true, 0, 0);
  if (!quick) {
    resident = 200;  // groups of 15: the folds' eight-row steps and their remainders
    run(2000, 128, true, true, true, 0, 0);
    run(2200, 67, false, true, true, 0, 0);  // general: 512 blocks, groups of 23
  }
  return finish();
}
