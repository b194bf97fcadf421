// attention_test.cpp: runs libgpu/kernels/attention.cu under the host
// emulation (emu.h) with the launch geometry of libgpu/ops/attention.go and
// checks every kernel against a float64 naive attention (softmax(QKᵀ·scale
// + mask)·V and its gradients), the *_drop instances against it with the
// same dropout mask on P (an independent Philox). Usage:
// scripts/cuda-emu.sh attention [quick|wg|drop|ws|ws3|bws|ws256]
#include "emu.h"
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
// philox.cuh (included by attention.cu) also holds a normal draw that needs it.
inline void sincospif(float x, float* s, float* c) {
  *s = (float)sin(M_PI * (double)x);
  *c = (float)cos(M_PI * (double)x);
}
// clang-format off
#ifdef ATTN_CU_FILE
#include ATTN_CU_FILE  // attention_compare.sh: an older attention.cu
#else
#include "../../libgpu/kernels/attention.cu"
#endif
// clang-format on

#include <cstddef>
#include <string>

// The C side of libgpu/ops/attention_layout_test.go (NVRTC rejects offsetof
// in static_assert; the host compiler's LP64 layout is NVPTX's).
static_assert(offsetof(attn_args, delta) == 72, "attn_args");
static_assert(offsetof(attn_args, sq) == 80, "attn_args");
static_assert(offsetof(attn_args, sdv) == 248, "attn_args");
static_assert(offsetof(attn_args, B) == 272, "attn_args");
static_assert(offsetof(attn_args, D) == 288, "attn_args");
static_assert(offsetof(attn_args, acc_q) == 296, "attn_args");
static_assert(offsetof(attn_args, acc_v) == 304, "attn_args");
static_assert(offsetof(attn_args, scale) == 312, "attn_args");
static_assert(offsetof(attn_args, scale_log2) == 316, "attn_args");
static_assert(offsetof(attn_args, drop_counter) == 320, "attn_args");
static_assert(offsetof(attn_args, drop_seed) == 328, "attn_args");
static_assert(offsetof(attn_args, drop_b0) == 336, "attn_args");
static_assert(offsetof(attn_args, drop_p) == 344, "attn_args");
static_assert(offsetof(attn_args, drop_scale) == 348, "attn_args");
static_assert(offsetof(attn_args, drop_site) == 352, "attn_args");
static_assert(sizeof(attn_args) == 360, "attn_args");
static_assert(sizeof(attn_dec_strides) == 96, "attn_dec_strides");

static int failures = 0;
static uint64_t seed = 7;

struct Buf {  // a "device" buffer of f32 or bf16 elements
  bool bf = false;
  std::vector<unsigned char> mem;
  void alloc(size_t n, bool bf16) {
    bf = bf16;
    mem.assign(n * (bf ? 2 : 4), 0xff);  // NaN-poisoned, exact size (ASan sees overreads)
    if ((uintptr_t)mem.data() % 16) emu::fail("buffer not 16-byte aligned");
  }
  void* ptr() { return mem.data(); }
  double get(size_t i) {
    if (bf) return gpukit_bf16_to_f32(((gpukit_bf16*)ptr())[i]);
    return ((float*)ptr())[i];
  }
  void set(size_t i, double v) {
    if (bf)
      ((gpukit_bf16*)ptr())[i] = gpukit_f32_to_bf16((float)v);
    else
      ((float*)ptr())[i] = (float)v;
  }
};

// A [B,T,H,D] view: element (b,t,h,d) at off + b*s[0] + t*s[1] + h*s[2] + d.
struct View {
  Buf* buf;
  long long off, s[3];
  int B, T, H, D;
  size_t at(int b, int t, int h, int d) const { return off + b * s[0] + (long long)t * s[1] + h * s[2] + d; }
  double get(int b, int t, int h, int d) const { return buf->get(at(b, t, h, d)); }
  void set(int b, int t, int h, int d, double v) const { buf->set(at(b, t, h, d), v); }
  void* ptr() const {
    return (unsigned char*)buf->ptr() + off * (buf->bf ? 2 : 4);
  }
};

// relerr is ‖got − want‖ / ‖want‖, or over ‖terms‖ when given: the size
// of the terms each value sums, so that a sum that cancels to near 0
// cannot fail a check by chance (DEVELOPERS.md).
static double relerr(const std::vector<double>& got, const std::vector<double>& want,
                     const std::vector<double>* terms = nullptr) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double d = got[i] - want[i];
    if (std::isnan(d)) return INFINITY;
    num += d * d;
    const double w = terms ? (*terms)[i] : want[i];
    den += w * w;
  }
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

// digest is an FNV-1a hash of the bits of v (ATTN_EMU_DIGEST=1 prints it
// with every check, so two builds of the kernels can be compared bit for
// bit: scripts/cudaemu/attention_compare.sh).
static unsigned long long digest(const std::vector<double>& v) {
  unsigned long long h = 1469598103934665603ull;
  for (double x : v) {
    unsigned long long u;
    memcpy(&u, &x, 8);
    for (int i = 0; i < 8; i++) h = (h ^ ((u >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

static void check(const std::string& what, const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::vector<double>* terms = nullptr) {
  double e = relerr(got, want, terms);
  bool ok = e <= tol;
  static const bool dig = getenv("ATTN_EMU_DIGEST") && *getenv("ATTN_EMU_DIGEST") == '1';
  if (dig)
    printf("%-4s %-60s relerr %.3g (tol %.3g) digest %016llx\n", ok ? "ok" : "FAIL", what.c_str(), e, tol, digest(got));
  else
    printf("%-4s %-60s relerr %.3g (tol %.3g)\n", ok ? "ok" : "FAIL", what.c_str(), e, tol);
  if (!ok) failures++;
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

// Dropout on P: an independent Philox4x32-10 (Random123's philox4x32_R(10))
// and ops.DropoutKeep's rule for element n = ((b0+b)·H+h)·Tq+i)·Tk+j.
struct Drop {
  float p = 0;
  uint64_t seed = 0;
  unsigned site = 0, step = 0;
  long long b0 = 0;
  bool keep(long long n) const {
    uint64_t q = (uint64_t)n >> 2;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), site, step}, k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
      if (r) {
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
      c[0] = n0;
      c[1] = (uint32_t)p1;
      c[2] = n2;
      c[3] = (uint32_t)p0;
    }
    return (float)(c[n & 3] >> 8) * (float)(1.0 / (1 << 24)) >= p;
  }
  // z is the factor of element (b, h, i, j): 1 without dropout, else keep/(1−p).
  double z(int b, int h, int i, int j, int H, int Tq, int Tk) const {
    if (p == 0) return 1;
    long long n = (((b0 + b) * H + h) * (long long)Tq + i) * Tk + j;
    return keep(n) ? 1 / (1 - (double)p) : 0;
  }
};

// reference computes the float64 naive attention and, given dO, its
// gradients, with dropout dr on P (o = (P∘Z)·V, dP = Z∘(dO·Vᵀ)).
static Ref reference(const View& q, const View& k, const View& v, const View* dout, bool causal, double scale,
                     const Drop& dr = Drop()) {
  int B = q.B, Tq = q.T, Tk = k.T, H = q.H, D = q.D;
  Ref r;
  r.o.assign((size_t)B * Tq * H * D, 0);
  r.lse.assign((size_t)B * H * Tq, 0);
  r.dq.assign((size_t)B * Tq * H * D, 0);
  r.dk.assign((size_t)B * Tk * H * D, 0);
  r.dv.assign((size_t)B * Tk * H * D, 0);
  std::vector<double> p(Tk), dp(Tk);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < Tq; i++) {
        double m = -INFINITY;
        for (int j = 0; j < Tk; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += q.get(b, i, h, d) * k.get(b, j, h, d);
          s *= scale;
          if (causal && j > i) s = -INFINITY;
          p[j] = s;
          m = std::max(m, s);
        }
        double l = 0;
        for (int j = 0; j < Tk; j++) l += (p[j] = exp(p[j] - m));
        for (int j = 0; j < Tk; j++) p[j] /= l;
        r.lse[((size_t)b * H + h) * Tq + i] = m + log(l);
        size_t oi = (((size_t)b * Tq + i) * H + h) * D;
        std::vector<double> z(Tk);
        for (int j = 0; j < Tk; j++) z[j] = dr.z(b, h, i, j, H, Tq, Tk);
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j < Tk; j++) acc += p[j] * z[j] * v.get(b, j, h, d);
          r.o[oi + d] = acc;
        }
        if (!dout) continue;
        // dP = dO·Vᵀ, dS = P∘(dP − Σ_j P dP), dQ = scale dS K, dK += scale dSᵀ Q, dV += Pᵀ dO
        double delta = 0;
        for (int j = 0; j < Tk; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += dout->get(b, i, h, d) * v.get(b, j, h, d);
          dp[j] = z[j] * s;
          delta += p[j] * dp[j];
        }
        for (int j = 0; j < Tk; j++) {
          double ds = p[j] * (dp[j] - delta);
          size_t kj = (((size_t)b * Tk + j) * H + h) * D;
          for (int d = 0; d < D; d++) {
            r.dq[oi + d] += scale * ds * k.get(b, j, h, d);
            r.dk[kj + d] += scale * ds * q.get(b, i, h, d);
            r.dv[kj + d] += p[j] * z[j] * dout->get(b, i, h, d);
          }
        }
      }
  return r;
}

static std::vector<double> read(const View& x) {
  std::vector<double> out;
  for (int b = 0; b < x.B; b++)
    for (int t = 0; t < x.T; t++)
      for (int h = 0; h < x.H; h++)
        for (int d = 0; d < x.D; d++) out.push_back(x.get(b, t, h, d));
  return out;
}

static std::mt19937_64 rng(3);
static double randn() { return std::normal_distribution<double>(0, 1)(rng); }

static void fill(const View& x, double scale) {
  for (int b = 0; b < x.B; b++)
    for (int t = 0; t < x.T; t++)
      for (int h = 0; h < x.H; h++)
        for (int d = 0; d < x.D; d++) x.set(b, t, h, d, scale * randn());
}

static void strides(attn_args& a, int which, const View& x) {
  long long* s = nullptr;
  switch (which) {
    case 0: s = a.sq; break;
    case 1: s = a.sk; break;
    case 2: s = a.sv; break;
    case 3: s = a.so; break;
    case 4: s = a.sdo; break;
    case 5: s = a.sdq; break;
    case 6: s = a.sdk; break;
    case 7: s = a.sdv; break;
  }
  for (int i = 0; i < 3; i++) s[i] = x.s[i];
}

static void track(Buf& b) { emu::track(b.mem.data(), b.mem.size()); }

// The kernels: CUDA cores, mma.sync (tc), wgmma (wg, sm_90a), and the
// warp-specialised wgmma forward (ws; its backward is wg's), also
// persistent (wsp: wsp_blocks blocks walk the tiles), and both with three
// consumer warpgroups at D = 64 (ws3, wsp3).
enum Mode { SIMT, TC, WG, WS, WSP, WS3, WSP3 };
// bwd_ws: the dK/dV pass on attn_bwd_dkdv_ws (modes from WG on).
static bool bwd_ws = false;
static unsigned wsp_blocks = 1;

// run tests one configuration: fused qkv layout [B,T,3,H,D] (+pad columns)
// when Tq == Tk, separate padded tensors otherwise.
// smul multiplies the usual scale 1/√D (negative and zero scales: the
// wgmma forward negates Q and takes |scale| for its folded exponent); kramp
// multiplies key t by 1 + kramp·t/Tk, so a row's maximum grows from tile to
// tile by more than the wgmma forward's lazy-rescale threshold.
static void run(int B, int Tq, int Tk, int H, int D, bool causal, bool bf16, Mode mode, bool acc, float pdrop = 0,
                double smul = 1, double kramp = 0) {
  const bool tc = mode != SIMT;
  char name[160];
  snprintf(name, sizeof name, "B%d Tq%d Tk%d H%d D%d causal=%d %s %s acc=%d drop=%g%s%s", B, Tq, Tk, H, D, causal,
           bf16 ? "bf16" : "f32", bwd_ws ? "bwd-ws" : mode == WSP3 ? "wsp3" : mode == WS3 ? "ws3" : mode == WSP ? "wsp" : mode == WS ? "ws" : mode == WG ? "wg" : tc ? "tc" : "simt", acc, pdrop,
           smul == 1 ? "" : smul < 0 ? " scale<0" : " scale=0", kramp ? " kramp" : "");
  emu::untrack();
  Buf qkv, kvb, ob, lseb, dob, dqkv, dkvb, deltab;
  View q, k, v, o, dout, dq, dk, dv;
  const int pad = 8;  // extra elements per row: strided views
  if (Tq == Tk) {
    long long row = 3LL * H * D + pad;
    qkv.alloc((size_t)B * Tq * row, bf16);
    dqkv.alloc((size_t)B * Tq * row, bf16);
    long long s[3] = {Tq * row, row, D};
    q = {&qkv, 0, {s[0], s[1], s[2]}, B, Tq, H, D};
    k = {&qkv, (long long)H * D, {s[0], s[1], s[2]}, B, Tk, H, D};
    v = {&qkv, 2LL * H * D, {s[0], s[1], s[2]}, B, Tk, H, D};
    dq = {&dqkv, 0, {s[0], s[1], s[2]}, B, Tq, H, D};
    dk = {&dqkv, (long long)H * D, {s[0], s[1], s[2]}, B, Tk, H, D};
    dv = {&dqkv, 2LL * H * D, {s[0], s[1], s[2]}, B, Tk, H, D};
  } else {
    long long rq = (long long)H * D + pad, rkv = 2LL * H * D + pad;
    qkv.alloc((size_t)B * Tq * rq, bf16);
    kvb.alloc((size_t)B * Tk * rkv, bf16);
    dqkv.alloc((size_t)B * Tq * rq, bf16);
    dkvb.alloc((size_t)B * Tk * rkv, bf16);
    q = {&qkv, 0, {Tq * rq, rq, D}, B, Tq, H, D};
    dq = {&dqkv, 0, {Tq * rq, rq, D}, B, Tq, H, D};
    k = {&kvb, 0, {Tk * rkv, rkv, D}, B, Tk, H, D};
    v = {&kvb, (long long)H * D, {Tk * rkv, rkv, D}, B, Tk, H, D};
    dk = {&dkvb, 0, {Tk * rkv, rkv, D}, B, Tk, H, D};
    dv = {&dkvb, (long long)H * D, {Tk * rkv, rkv, D}, B, Tk, H, D};
  }
  ob.alloc((size_t)B * Tq * H * D, bf16);
  dob.alloc((size_t)B * Tq * H * D, bf16);
  lseb.alloc((size_t)B * H * Tq, false);
  deltab.alloc((size_t)B * H * Tq, false);
  long long os[3] = {(long long)Tq * H * D, (long long)H * D, D};
  o = {&ob, 0, {os[0], os[1], os[2]}, B, Tq, H, D};
  dout = {&dob, 0, {os[0], os[1], os[2]}, B, Tq, H, D};
  for (Buf* b : {&qkv, &kvb, &ob, &lseb, &dob, &dqkv, &dkvb, &deltab})
    if (!b->mem.empty()) track(*b);
  fill(q, 1);
  fill(k, 1);
  for (int b = 0; kramp && b < B; b++)
    for (int t = 0; t < Tk; t++)
      for (int h = 0; h < H; h++)
        for (int d = 0; d < D; d++) k.set(b, t, h, d, k.get(b, t, h, d) * (1 + kramp * t / Tk));
  fill(v, 1);
  fill(dout, 1);
  double scale = smul / sqrt((double)D);

  attn_args a;
  memset(&a, 0, sizeof a);
  a.q = q.ptr();
  a.k = k.ptr();
  a.v = v.ptr();
  a.o = o.ptr();
  a.lse = (float*)lseb.ptr();
  a.dout = dout.ptr();
  a.dq = dq.ptr();
  a.dk = dk.ptr();
  a.dv = dv.ptr();
  a.delta = (float*)deltab.ptr();
  strides(a, 0, q);
  strides(a, 1, k);
  strides(a, 2, v);
  strides(a, 3, o);
  strides(a, 4, dout);
  strides(a, 5, dq);
  strides(a, 6, dk);
  strides(a, 7, dv);
  a.B = B;
  a.H = H;
  a.Tq = Tq;
  a.Tk = Tk;
  a.D = D;
  a.causal = causal;
  // The launch order's groups of heads (attn_block): 0 (one group), or 1-5
  // heads a group, the last group short where B·H is not a multiple (B2 H3
  // in groups of 4 or 5).
  a.group = (int)(seed % 6);
  a.acc_q = a.acc_k = a.acc_v = acc;
  a.scale = (float)scale;
  a.scale_log2 = (float)(scale * 1.4426950408889634);
  Drop dr;
  int step = 4242;
  const bool DR = pdrop > 0;
  if (DR) {
    dr.p = pdrop;
    dr.seed = 0x243f6a8885a308d3ull;
    dr.site = 5;
    dr.step = (unsigned)step;
    dr.b0 = 3;
    a.drop_counter = &step;
    a.drop_seed = dr.seed;
    a.drop_b0 = dr.b0;
    a.drop_p = pdrop;
    a.drop_scale = 1.0f / (1.0f - pdrop);
    a.drop_site = dr.site;
  }

  // forward
  if (mode == WS3 || mode == WSP3) {
    if (D != 64 || DR) abort();  // instances: attn_fwd_ws_c3[_pers]_d64, no dropout
    size_t smem = (192 + 4 * 128) * D * 2 + 1024 + 128;  // ops/attention.go attnWSSmem
    emu_dim3 grid = {(unsigned)H, (unsigned)B, (unsigned)((Tq + 191) / 192)};
    if (mode == WSP3) grid = {wsp_blocks, 1, 1};
    emu::launch(grid, {512, 1, 1}, smem, seed++, [&] {
      mode == WSP3 ? attn_fwd_ws_c3_pers_d64(a) : attn_fwd_ws_c3_d64(a);
    });
  } else if (mode == WS && D == 256) {
    if (DR) abort();  // attn_fwd_ws_d256 has no dropout
    size_t smem = (128 + 4 * 64) * D * 2 + 1024 + 128;  // ops/attention.go attnWSSmem: key tiles of 64
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 127) / 128)}, {384, 1, 1}, smem, seed++,
                [&] { attn_fwd_ws_d256(a); });
  } else if (mode == WS || mode == WSP) {
    size_t smem = 5 * 128 * D * 2 + 1024 + 128;  // ops/attention.go attnWSSmem
    emu_dim3 grid = {(unsigned)H, (unsigned)B, (unsigned)((Tq + 127) / 128)};
    if (mode == WSP) grid = {wsp_blocks, 1, 1};  // the persistent kernel has no dropout instance
    if (mode == WSP && DR) abort();
    emu::launch(grid, {384, 1, 1}, smem, seed++, [&] {
      if (mode == WSP)
        D == 64 ? attn_fwd_ws_pers_d64(a) : attn_fwd_ws_pers_d128(a);
      else if (D == 64)
        DR ? attn_fwd_ws_drop_d64(a) : attn_fwd_ws_d64(a);
      else
        DR ? attn_fwd_ws_drop_d128(a) : attn_fwd_ws_d128(a);
    });
  } else if (mode >= WG) {
    size_t smem = 5 * 128 * D * 2 + 1024;  // ops/attention.go attnWGSmem
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 127) / 128)}, {256, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_fwd_wg_drop_d64(a) : attn_fwd_wg_d64(a);
      else
        DR ? attn_fwd_wg_drop_d128(a) : attn_fwd_wg_d128(a);
    });
  } else if (tc) {
    size_t smem = 4 * 64 * (D + 8) * 2;
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 63) / 64)}, {128, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_fwd_tc_drop_d64(a) : attn_fwd_tc_d64(a);
      else
        DR ? attn_fwd_tc_drop_d128(a) : attn_fwd_tc_d128(a);
    });
  } else {
    size_t smem = (16 * D + 32 * (D + 1) + 32 * D) * 4;
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 15) / 16)}, {128, 1, 1}, smem, seed++, [&] {
      if (bf16)
        DR ? attn_fwd_simt_drop_bf16(a) : attn_fwd_simt_bf16(a);
      else
        DR ? attn_fwd_simt_drop_f32(a) : attn_fwd_simt_f32(a);
    });
  }
  Ref r = reference(q, k, v, &dout, causal, scale, dr);
  double tolF = bf16 ? 1e-2 : 1e-5;
  check(std::string(name) + " o", read(o), r.o, tolF);
  std::vector<double> lse;
  for (size_t i = 0; i < r.lse.size(); i++) lse.push_back(lseb.get(i));
  check(std::string(name) + " lse", lse, r.lse, bf16 ? 1e-3 : 1e-6);

  if (D > 128) return;  // D = 256 has a forward only (attn_fwd_ws_d256)

  // backward: the reference gradients use the exact softmax; the kernels
  // use the stored o and lse (bf16 o is where most of the difference is).
  std::vector<double> old_dq, old_dk, old_dv;
  if (acc) {
    fill(dq, 1);
    fill(dk, 1);
    fill(dv, 1);
    old_dq = read(dq);
    old_dk = read(dk);
    old_dv = read(dv);
  }
  // δ: the vectorised kernel where ops.attnDeltaLanes allows it (o and dO
  // are contiguous and 16-byte aligned here, so it is D/V a power of two
  // ≤ 32), the warp-per-row one otherwise; checked against Σ_d dO·O.
  int rows = B * Tq * H, V = bf16 ? 8 : 4, L = D % V == 0 ? D / V : 0;
  if (L > 32 || (L & (L - 1)) != 0) L = 0;
  if (L > 0) {
    long long threads = ((long long)rows * L + 1) / 2;
    unsigned blocks = (unsigned)std::min(std::max((threads + 255) / 256, 1LL), 65535LL);
    emu::launch({blocks, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf16)
        attn_bwd_delta_v_bf16(a);
      else
        attn_bwd_delta_v_f32(a);
    });
  } else {
    emu::launch({(unsigned)std::min((rows + 3) / 4, 65535), 1, 1}, {128, 1, 1}, 0, seed++, [&] {
      if (bf16)
        attn_bwd_delta_bf16(a);
      else
        attn_bwd_delta_f32(a);
    });
  }
  {
    std::vector<double> got, want, terms;  // terms: Σ_d |dO·O|, what δ's error is relative to
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < Tq; i++) {
          double s = 0, t = 0;
          for (int d = 0; d < D; d++) {
            const double x = o.get(b, i, h, d) * dout.get(b, i, h, d);
            s += x;
            t += fabs(x);
          }
          want.push_back(s);
          terms.push_back(t);
          got.push_back(deltab.get(((size_t)b * H + h) * Tq + i));
        }
    check(std::string(name) + (L > 0 ? " delta (v)" : " delta"), got, want, 1e-5, &terms);
  }
  if (mode >= WG && bwd_ws) {
    size_t smem = 2 * 128 * D * 2 + 6 * 64 * D * 2 + 6 * 64 * 4 + 1024 + 64;  // ops/attention.go attnBwdWSSmem
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tk + 127) / 128)}, {384, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_bwd_dkdv_ws_drop_d64(a) : attn_bwd_dkdv_ws_d64(a);
      else
        DR ? attn_bwd_dkdv_ws_drop_d128(a) : attn_bwd_dkdv_ws_d128(a);
    });
    smem = 2 * 128 * D * 2 + 6 * 64 * D * 2 + 1024 + 64;  // attnBwdWSSmemDQ
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 127) / 128)}, {384, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_bwd_dq_ws_drop_d64(a) : attn_bwd_dq_ws_d64(a);
      else
        DR ? attn_bwd_dq_ws_drop_d128(a) : attn_bwd_dq_ws_d128(a);
    });
  }
  if (mode >= WG) {
    size_t smem = 2 * 128 * D * 2 + 6 * 64 * D * 2 + 6 * 64 * 4 + 1024;  // ops/attention.go
    if (!bwd_ws) emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tk + 127) / 128)}, {256, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_bwd_dkdv_wg_drop_d64(a) : attn_bwd_dkdv_wg_d64(a);
      else
        DR ? attn_bwd_dkdv_wg_drop_d128(a) : attn_bwd_dkdv_wg_d128(a);
    });
    smem = 2 * 128 * D * 2 + 6 * 64 * D * 2 + 1024;
    if (!bwd_ws) emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 127) / 128)}, {256, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_bwd_dq_wg_drop_d64(a) : attn_bwd_dq_wg_d64(a);
      else
        DR ? attn_bwd_dq_wg_drop_d128(a) : attn_bwd_dq_wg_d128(a);
    });
  } else if (tc) {
    size_t smem = 6 * 64 * (D + 8) * 2;
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tk + 63) / 64)}, {128, 1, 1}, smem + 1024, seed++, [&] {
      if (D == 64)
        DR ? attn_bwd_dkdv_tc_drop_d64(a) : attn_bwd_dkdv_tc_d64(a);
      else
        DR ? attn_bwd_dkdv_tc_drop_d128(a) : attn_bwd_dkdv_tc_d128(a);
    });
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 63) / 64)}, {128, 1, 1}, smem, seed++, [&] {
      if (D == 64)
        DR ? attn_bwd_dq_tc_drop_d64(a) : attn_bwd_dq_tc_d64(a);
      else
        DR ? attn_bwd_dq_tc_drop_d128(a) : attn_bwd_dq_tc_d128(a);
    });
  } else {
    size_t smem = (32 * D + 64 * (D + 1) + 64) * 4;
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tk + 15) / 16)}, {128, 1, 1}, smem, seed++, [&] {
      if (bf16)
        DR ? attn_bwd_dkdv_simt_drop_bf16(a) : attn_bwd_dkdv_simt_bf16(a);
      else
        DR ? attn_bwd_dkdv_simt_drop_f32(a) : attn_bwd_dkdv_simt_f32(a);
    });
    smem = (32 * D + 64 * (D + 1)) * 4;
    emu::launch({(unsigned)H, (unsigned)B, (unsigned)((Tq + 15) / 16)}, {128, 1, 1}, smem, seed++, [&] {
      if (bf16)
        DR ? attn_bwd_dq_simt_drop_bf16(a) : attn_bwd_dq_simt_bf16(a);
      else
        DR ? attn_bwd_dq_simt_drop_f32(a) : attn_bwd_dq_simt_f32(a);
    });
  }
  if (acc) {
    for (size_t i = 0; i < r.dq.size(); i++) r.dq[i] += old_dq[i];
    for (size_t i = 0; i < r.dk.size(); i++) r.dk[i] += old_dk[i];
    for (size_t i = 0; i < r.dv.size(); i++) r.dv[i] += old_dv[i];
  }
  double tolB = bf16 ? 2e-2 : 1e-5;
  check(std::string(name) + " dq", read(dq), r.dq, tolB);
  check(std::string(name) + " dk", read(dk), r.dk, tolB);
  check(std::string(name) + " dv", read(dv), r.dv, tolB);
  // Nothing outside the views was written: the pad columns stay NaN.
  if (Tq == Tk) {
    long long row = 3LL * H * D + pad;
    int bad = 0;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tq; t++)
        for (int c = 3 * H * D; c < row; c++)
          if (!std::isnan(dqkv.get((size_t)b * Tq * row + (size_t)t * row + c))) bad++;
    if (bad) {
      printf("FAIL %s: %d pad elements of dqkv written\n", name, bad);
      failures++;
    }
  }
}

static void run_decode(int B, int Tmax, int H, int D, int pos, bool bf16) {
  char name[160];
  snprintf(name, sizeof name, "decode B%d Tmax%d H%d D%d pos%d %s", B, Tmax, H, D, pos, bf16 ? "bf16" : "f32");
  emu::untrack();
  Buf qb, kb, vb, ob, xb;
  long long row = 3LL * H * D;  // q is a view of a step's qkv [B,1,3,H,D]
  qb.alloc((size_t)B * row, bf16);
  kb.alloc((size_t)B * Tmax * H * D, bf16);
  vb.alloc((size_t)B * Tmax * H * D, bf16);
  ob.alloc((size_t)B * H * D, bf16);
  for (Buf* b : {&qb, &kb, &vb, &ob}) track(*b);
  View q{&qb, 0, {row, row, D}, B, 1, H, D};
  View kc{&kb, 0, {(long long)Tmax * H * D, (long long)H * D, D}, B, Tmax, H, D};
  View vc{&vb, 0, {(long long)Tmax * H * D, (long long)H * D, D}, B, Tmax, H, D};
  View o{&ob, 0, {(long long)H * D, (long long)H * D, D}, B, 1, H, D};
  fill(q, 1);
  // keys 0..pos hold values, the rest stays NaN (must not be read) — except
  // the row kv_write fills: write step pos through kv_write from q's k part.
  View kpart{&qb, (long long)H * D, {row, row, D}, B, 1, H, D};
  View vpart{&qb, 2LL * H * D, {row, row, D}, B, 1, H, D};
  fill(kpart, 1);
  fill(vpart, 1);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < pos; t++)
      for (int h = 0; h < H; h++)
        for (int d = 0; d < D; d++) {
          kc.set(b, t, h, d, randn());
          vc.set(b, t, h, d, randn());
        }
  int p = pos;
  for (int which = 0; which < 2; which++) {
    const View& c = which ? vc : kc;
    const View& x = which ? vpart : kpart;
    emu::launch({(unsigned)std::min((B * H * D + 255) / 256, 65535), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf16)
        attn_kv_write_bf16((gpukit_bf16*)c.ptr(), (const gpukit_bf16*)x.ptr(), &p, B, H, D, Tmax, c.s[0], c.s[1],
                           c.s[2], x.s[0], x.s[2]);
      else
        attn_kv_write_f32((float*)c.ptr(), (const float*)x.ptr(), &p, B, H, D, Tmax, c.s[0], c.s[1], c.s[2], x.s[0],
                          x.s[2]);
    });
  }
  attn_dec_strides st;
  const View* vs[4] = {&q, &kc, &vc, &o};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) st.s[3 * i + j] = vs[i]->s[j];
  double scale = 1 / sqrt((double)D);
  emu::launch({(unsigned)H, (unsigned)B, 1}, {128, 1, 1}, 0, seed++, [&] {
    if (bf16)
      attn_decode_bf16((gpukit_bf16*)o.ptr(), (const gpukit_bf16*)q.ptr(), (const gpukit_bf16*)kc.ptr(),
                       (const gpukit_bf16*)vc.ptr(), &p, st, Tmax, D, (float)(scale * 1.4426950408889634));
    else
      attn_decode_f32((float*)o.ptr(), (const float*)q.ptr(), (const float*)kc.ptr(), (const float*)vc.ptr(), &p, st,
                      Tmax, D, (float)(scale * 1.4426950408889634));
  });
  // reference over keys 0..pos
  View kc1 = kc, vc1 = vc;
  kc1.T = vc1.T = pos + 1;
  Ref r = reference(q, kc1, vc1, nullptr, false, scale);
  check(name, read(o), r.o, bf16 ? 1e-2 : 1e-5);
  std::vector<double> kw, kx;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int d = 0; d < D; d++) {
        kw.push_back(kc.get(b, pos, h, d));
        kx.push_back(kpart.get(b, 0, h, d));
      }
  check(std::string(name) + " kv_write", kw, kx, 0);
}

// run_ws3: the warp-specialised forward with three consumer warpgroups
// (attn_fwd_ws_c3[_pers]_d64).
static void run_ws3() {
  // Three consumers at D = 64 (192-row blocks: T not a multiple of 192,
  // one row block, several; a key tile count of 1, 2 and more; Tq ≠ Tk;
  // a negative scale; keys ramped so that maxima grow across tiles), and
  // persistent over 1, 2, 5 and 64 blocks.
  run(1, 17, 17, 2, 64, true, true, WS3, false);
  run(1, 5, 70, 1, 64, false, true, WS3, true);
  run(1, 1, 1, 1, 64, true, true, WS3, false);
  run(2, 200, 200, 1, 64, true, true, WS3, true);
  run(1, 400, 400, 2, 64, true, true, WS3, false, 0, 1, 8);
  run(1, 130, 300, 1, 64, false, true, WS3, true, 0, -1);
  run(1, 450, 450, 1, 64, false, true, WS3, false);
  for (unsigned nb : {1u, 2u, 5u, 64u}) {
    wsp_blocks = nb;
    run(2, 400, 400, 2, 64, true, true, WSP3, false);
    run(1, 130, 300, 3, 64, false, true, WSP3, true, 0, 1, 8);
  }
}

// run_bws: the warp-specialised backward (attn_bwd_dkdv_ws, attn_bwd_dq_ws), behind the
// wgmma forward: one query tile and many (the stages turn over), T not
// a multiple of 64 or 128, Tq ≠ Tk, causal and not, a negative scale,
// accumulation into dK and dV, dropout.
static void run_bws() {
  bwd_ws = true;
  for (int D : {64, 128}) {
    run(1, 17, 17, 2, D, true, true, WG, false);
    run(1, 5, 70, 1, D, false, true, WG, true);
    run(1, 1, 1, 1, D, true, true, WG, false);
    run(2, 130, 130, 1, D, true, true, WG, true);
    run(1, 300, 300, 2, D, true, true, WG, false, 0, -1);
    run(1, 200, 77, 1, D, false, true, WG, false);
    run(1, 450, 450, 1, D, false, true, WG, true);
    // Dropout on P (attn_bwd_*_ws_drop): the same mask as the forward's.
    run(2, 132, 132, 2, D, true, true, WG, false, 0.2f);
    run(1, 36, 200, 1, D, false, true, WG, true, 0.5f);
    run(1, 300, 300, 1, D, false, true, WG, false, 0.2f);
  }
  bwd_ws = false;
}

// run_ws: the warp-specialised forward (its backward is wg's; none at
// D = 256, whose key tiles are 64: one tile, several, T not a multiple of
// 64, Tq ≠ Tk, the two stages turning over, a negative scale, maxima
// growing across tiles).
static void run_ws() {
  run(1, 17, 17, 1, 256, true, true, WS, false);
  run(1, 5, 70, 1, 256, false, true, WS, true);
  run(1, 1, 1, 1, 256, true, true, WS, false);
  run(1, 200, 200, 2, 256, true, true, WS, false, 0, -1);
  run(1, 100, 300, 1, 256, false, true, WS, false, 0, 1, 8);
  for (int D : {64, 128}) {
    run(1, 17, 17, 2, D, true, true, WS, false);
    run(1, 5, 70, 1, D, false, true, WS, true);
    run(1, 1, 1, 1, D, true, true, WS, false);
    run(2, 130, 130, 1, D, true, true, WS, true);
    run(1, 130, 130, 1, D, true, true, WS, false, 0, -1);
    run(1, 300, 300, 1, D, true, true, WS, false, 0, 1, 8);
    run(1, 100, 300, 1, D, false, true, WS, true, 0, 1, 8);
    run(1, 450, 450, 1, D, true, true, WS, true);  // the two stages turn over twice
    run(2, 200, 200, 2, D, true, true, WS, false, 0.2f);  // dropout on P (attn_fwd_ws_drop)
    run(1, 70, 300, 1, D, false, true, WS, true, 0.5f);
    run(1, 70, 130, 1, D, false, true, WS, false, 0.2f);  // Tk not a multiple of 4
  }
  // Persistent: blocks walk several tiles each (tiles of 1 to 3 key tiles,
  // the ring's phases carried across them; an odd count of key tiles a
  // block, so a stage's parity differs from one tile to the next).
  for (int D : {64, 128}) {
    for (unsigned nb : {1u, 2u, 5u}) {
      wsp_blocks = nb;
      run(2, 300, 300, 2, D, true, true, WSP, false);
      run(1, 130, 300, 3, D, false, true, WSP, true, 0, 1, 8);
    }
    wsp_blocks = 3;
    run(1, 260, 260, 2, D, true, true, WSP, false, 0, -1);
    run(3, 1, 1, 2, D, true, true, WSP, false);
    wsp_blocks = 64;  // more blocks than tiles
    run(1, 200, 200, 1, D, true, true, WSP, false);
  }
  run_ws3();
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "quick";
  bool wgonly = argc > 1 && std::string(argv[1]) == "wg";
  bool droponly = argc > 1 && std::string(argv[1]) == "drop";
  // One group of kernels alone.
  const struct {
    const char* name;
    void (*run)();
  } alone[] = {
      {"bws", run_bws},                  // the warp-specialised backward
      {"ws3", run_ws3},                  // the three-consumer forward
      {"ws256", [] {                     // the D = 256 forward
         run(1, 17, 17, 1, 256, true, true, WS, false);
         run(1, 5, 70, 1, 256, false, true, WS, true);
         run(1, 200, 200, 2, 256, true, true, WS, false, 0, -1);
       }},
      {"ws", run_ws},  // the warp-specialised forward
  };
  for (const auto& g : alone) {
    if (argc > 1 && std::string(argv[1]) == g.name) {
      g.run();
      printf(failures ? "FAIL: %d check(s)\n" : "PASS\n", failures);
      return failures ? 1 : 0;
    }
  }
  // Dropout on P (p = 0.2; 0.5 once): every kernel family.
  for (bool bf16 : {false, true}) {
    run(2, 17, 17, 3, 16, true, bf16, SIMT, false, 0.2f);
    run(1, 5, 19, 2, 32, false, bf16, SIMT, true, 0.2f);
    run(1, 37, 37, 1, 24, false, bf16, SIMT, false, 0.5f);
  }
  for (Mode mode : {TC, WG}) {
    for (int D : {64, 128}) {
      run(1, 17, 17, 2, D, true, true, mode, false, 0.2f);
      run(1, 5, 70, 1, D, false, true, mode, true, 0.2f);
      run(2, 130, 130, 1, D, true, true, mode, false, 0.2f);
      if (D == 64) run(1, 129, 129, 1, D, false, true, mode, false, 0.5f);
      // Tk a multiple of 4: attn_drop_bits' shuffled groups (rows of
      // queries forward and dQ, rows of keys dK/dV).
      run(2, 132, 132, 2, D, true, true, mode, false, 0.2f);
      run(1, 36, 200, 1, D, false, true, mode, true, 0.5f);
    }
  }
  if (droponly) {
    printf(failures ? "FAIL: %d check(s)\n" : "PASS\n", failures);
    return failures ? 1 : 0;
  }
  // SIMT (f32 and bf16), odd shapes
  for (bool bf16 : {false, true}) {
    if (wgonly) break;
    run(1, 1, 1, 1, 8, false, bf16, SIMT, false);
    run(2, 17, 17, 3, 16, true, bf16, SIMT, false);
    run(1, 37, 37, 2, 24, false, bf16, SIMT, true);
    run(1, 5, 19, 2, 32, false, bf16, SIMT, false);
    if (!quick) {
      run(1, 70, 70, 1, 128, true, bf16, SIMT, true);
      run(1, 100, 45, 2, 64, false, bf16, SIMT, false);
      run(1, 77, 77, 1, 100, true, bf16, SIMT, false);
    }
  }
  // tensor cores (bf16): mma.sync, then the wgmma forward
  for (Mode mode : {TC, WG}) {
    if (wgonly && mode != WG) continue;
    for (int D : {64, 128}) {
      run(1, 1, 1, 1, D, true, true, mode, false);
      run(1, 17, 17, 2, D, true, true, mode, false);
      run(1, 17, 17, 1, D, false, true, mode, true);
      run(1, 5, 70, 1, D, false, true, mode, false);
      run(1, 130, 130, 1, D, true, true, mode, false, 0, -1);
      run(1, 17, 17, 1, D, true, true, mode, false, 0, 0);
      run(1, 300, 300, 1, D, true, true, mode, false, 0, 1, 8);
      run(1, 100, 300, 1, D, false, true, mode, true, 0, 1, 8);
      if (!quick) {
        run(2, 130, 130, 1, D, true, true, mode, true);
        run(1, 129, 129, 1, D, false, true, mode, false);
        run(1, 100, 200, 2, D, false, true, mode, true);
        run(1, 257, 257, 1, D, true, true, mode, false);
        if (mode == WG) run(1, 450, 450, 1, D, true, true, mode, true);  // 3 stages turn over twice
      }
    }
  }
  if (!quick) {
    run_ws();
    run_bws();
  }
  for (bool bf16 : {false, true}) {
    if (wgonly) break;
    run_decode(2, 20, 3, 24, 0, bf16);
    run_decode(1, 40, 2, 64, 17, bf16);
    run_decode(1, 40, 1, 128, 39, bf16);
  }
  printf(failures ? "FAIL: %d check(s)\n" : "PASS\n", failures);
  return failures ? 1 : 0;
}
