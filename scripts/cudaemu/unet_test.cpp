// unet_test.cpp: runs the kernels of the U-Net and sampler op families
// (conv2d, chanbias, groupnorm, silu, resample, concat, tembed, mse,
// diffusion) under the host emulation (emu.h), with the launch geometry of
// their Go launchers in libgpu/ops, against float64 references: the
// indexing, vector paths, shared-memory reductions and synchronisation of
// each kernel, at small odd shapes. Usage: scripts/cuda-emu.sh unet
#include "emu.h"

// What emu.h leaves out and these kernels use.
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline void sincospif(float x, float* s, float* c) {
  *s = (float)sin(M_PI * (double)x);
  *c = (float)cos(M_PI * (double)x);
}
#define GN_DYN_SMEM(name) float* name = (float*)emu::g.smem.data()
#define CONV_DYN_SMEM(name) unsigned char* name = emu::g.smem.data()
struct float2 {
  float x, y;
};

// clang-format off
#include "../../libgpu/kernels/conv2d.cu"
#include "../../libgpu/kernels/conv2d_wg.cu"
#include "../../libgpu/kernels/conv2d_tma.cu"
#include "../../libgpu/kernels/chanbias.cu"
#include "../../libgpu/kernels/groupnorm.cu"
#include "../../libgpu/kernels/silu.cu"
#include "../../libgpu/kernels/resample.cu"
#include "../../libgpu/kernels/concat.cu"
#include "../../libgpu/kernels/tembed.cu"
#include "../../libgpu/kernels/mse.cu"
#include "../../libgpu/kernels/diffusion.cu"
// clang-format on

#include <string>

static int failures = 0;
static uint64_t seed = 11;
static std::mt19937_64 rng(5);

// Buf is a "device" array of f32 or bf16 elements, NaN-poisoned.
struct Buf {
  bool bf = false;
  std::vector<unsigned char> mem;
  Buf() {}
  Buf(size_t n, bool bf16) { alloc(n, bf16); }
  void alloc(size_t n, bool bf16) {
    bf = bf16;
    mem.assign(std::max<size_t>(n, 1) * (bf ? 2 : 4), 0xff);
  }
  size_t size() const { return mem.size() / (bf ? 2 : 4); }
  void* ptr() { return mem.data(); }
  float* f() { return (float*)mem.data(); }
  gpukit_bf16* h() { return (gpukit_bf16*)mem.data(); }
  double get(size_t i) const {
    if (bf) return gpukit_bf16_to_f32(((const gpukit_bf16*)mem.data())[i]);
    return ((const float*)mem.data())[i];
  }
  void set(size_t i, double v) {
    if (bf)
      ((gpukit_bf16*)mem.data())[i] = gpukit_f32_to_bf16((float)v);
    else
      ((float*)mem.data())[i] = (float)v;
  }
  std::vector<double> read() const {
    std::vector<double> v(size());
    for (size_t i = 0; i < v.size(); i++) v[i] = get(i);
    return v;
  }
  std::vector<double> rand(double scale = 1) {
    std::normal_distribution<double> nd(0, scale);
    for (size_t i = 0; i < size(); i++) set(i, nd(rng));
    return read();
  }
};

static double relerr(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double d = got[i] - want[i];
    if (std::isnan(d)) return INFINITY;
    num += d * d;
    den += want[i] * want[i];
  }
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

static void check(const std::string& what, const std::vector<double>& got, const std::vector<double>& want, double tol) {
  double e = got.size() == want.size() ? relerr(got, want) : INFINITY;
  bool ok = e <= tol;
  printf("%-4s %-64s relerr %.3g (tol %.3g)\n", ok ? "ok" : "FAIL", what.c_str(), e, tol);
  if (!ok) failures++;
}

static unsigned blocks(long long n, long long bs) { return (unsigned)std::min<long long>(std::max<long long>((n + bs - 1) / bs, 1), 65535); }

// ---- conv2d: im2col and col2im ----

static void conv(bool bf, int N, int H, int W, int C, int KH, int KW, int S, int P) {
  int Ho = (H + 2 * P - KH) / S + 1, Wo = (W + 2 * P - KW) / S + 1;
  long long K = (long long)KH * KW * C, rows = (long long)N * Ho * Wo;
  Buf x(N * H * W * C, bf);
  auto xv = x.rand();
  std::vector<double> want(rows * K, 0);
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < Ho; oh++)
      for (int ow = 0; ow < Wo; ow++)
        for (int kh = 0; kh < KH; kh++)
          for (int kw = 0; kw < KW; kw++)
            for (int c = 0; c < C; c++) {
              int h = oh * S - P + kh, w = ow * S - P + kw;
              long long p = ((long long)n * Ho + oh) * Wo + ow;
              if (h >= 0 && h < H && w >= 0 && w < W) want[p * K + (kh * KW + kw) * C + c] = xv[((n * H + h) * W + w) * C + c];
            }
  std::string name = std::string(bf ? "bf16" : "f32") + " conv " + std::to_string(N) + "x" + std::to_string(H) + "x" +
                     std::to_string(W) + "x" + std::to_string(C) + " k" + std::to_string(KH) + "x" + std::to_string(KW) +
                     " s" + std::to_string(S) + "p" + std::to_string(P);
  int V = bf ? 8 : 4;
  for (bool vec : {false, true}) {
    if (vec && C % V) continue;
    // Two chunks of images, as the Go side splits large batches.
    Buf col(rows * K, bf);
    for (int n0 = 0; n0 < N; n0 += 2) {
      int nc = std::min(2, N - n0);
      conv_args a{n0, nc, H, W, C, KH, KW, Ho, Wo, S, P, 0};
      long long nvec = (long long)nc * Ho * Wo * K / (vec ? V : 1);
      void* dst = (unsigned char*)col.ptr() + (long long)n0 * Ho * Wo * K * (bf ? 2 : 4);
      emu::launch({blocks(nvec, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          vec ? conv_im2col_v_bf16((gpukit_bf16*)dst, x.h(), a) : conv_im2col_s_bf16((gpukit_bf16*)dst, x.h(), a);
        else
          vec ? conv_im2col_v_f32((float*)dst, x.f(), a) : conv_im2col_s_f32((float*)dst, x.f(), a);
      });
    }
    check(name + (vec ? " im2col v" : " im2col s"), col.read(), want, 0);
  }
  // col2im: dx = the adjoint of im2col applied to dcol, accumulated.
  Buf dcol(rows * K, bf);
  auto dv = dcol.rand();
  for (bool acc : {false, true}) {
    Buf dx(N * H * W * C, bf);
    std::vector<double> wdx(N * H * W * C, 0);
    if (acc) wdx = dx.rand();
    for (long long i = 0; i < rows * K; i++) {
      long long p = i / K, k = i % K;
      int c = k % C, kw = k / C % KW, kh = k / C / KW;
      int ow = p % Wo, oh = p / Wo % Ho, n = p / Wo / Ho;
      int h = oh * S - P + kh, w = ow * S - P + kw;
      if (h >= 0 && h < H && w >= 0 && w < W) wdx[((n * H + h) * W + w) * C + c] += dv[i];
    }
    for (int n0 = 0; n0 < N; n0 += 2) {
      int nc = std::min(2, N - n0);
      conv_args a{n0, nc, H, W, C, KH, KW, Ho, Wo, S, P, acc};
      const unsigned char* src = (unsigned char*)dcol.ptr() + (long long)n0 * Ho * Wo * K * (bf ? 2 : 4);
      emu::launch({blocks((long long)nc * H * W * C, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          conv_col2im_bf16(dx.h(), (const gpukit_bf16*)src, a);
        else
          conv_col2im_f32(dx.f(), (const float*)src, a);
      });
    }
    check(name + (acc ? " col2im acc" : " col2im"), dx.read(), wdx, bf ? 1e-2 : 1e-6);
  }
}

// igemm runs conv_igemm_fwd (bf16) and, where the shape allows,
// conv_wg_fwd_64, _128 and _256 (wgmma) with the Go launcher's
// geometry against the float64 convolution of the same bf16 values, with a
// bias and then accumulating into NaN-poisoned outputs; and, for stride 1,
// dx as the same kernel on dy with the filters flipped by conv_flip_w,
// against the adjoint of the convolution.
static void igemm(int N, int H, int W, int C, int Co, int K, int S, int P) {
  int Ho = (H + 2 * P - K) / S + 1, Wo = (W + 2 * P - K) / S + 1;
  long long rows = (long long)N * Ho * Wo;
  Buf x(N * H * W * C, true), w(Co * K * K * C, true), b(Co, true);
  auto xv = x.rand(), wv = w.rand(1 / sqrt((double)C * K * K)), bv = b.rand();
  auto conv = [&](const std::vector<double>& in, const std::vector<double>& wt, int h, int wd, int cin, int cout, int pad,
                  const std::vector<double>* bias) {
    int oh = (h + 2 * pad - K) / S + 1, ow = (wd + 2 * pad - K) / S + 1;
    std::vector<double> out((long long)N * oh * ow * cout, 0);
    for (int n = 0; n < N; n++)
      for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++)
          for (int o = 0; o < cout; o++) {
            double s = bias ? (*bias)[o] : 0;
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++) {
                int hh = i * S - pad + kh, ww = j * S - pad + kw;
                if (hh < 0 || hh >= h || ww < 0 || ww >= wd) continue;
                for (int c = 0; c < cin; c++) s += in[((n * h + hh) * wd + ww) * cin + c] * wt[((o * K + kh) * K + kw) * cin + c];
              }
            out[(((long long)n * oh + i) * ow + j) * cout + o] = s;
          }
    return out;
  };
  auto want = conv(xv, wv, H, W, C, Co, P, &bv);
  std::string name = "bf16 igemm " + std::to_string(N) + "x" + std::to_string(H) + "x" + std::to_string(W) + "x" +
                     std::to_string(C) + "->" + std::to_string(Co) + " k" + std::to_string(K) + " s" + std::to_string(S) +
                     "p" + std::to_string(P);
  // fz: the fused input map and output terms the launches pass (none
  // unless the fused check below sets them).
  struct {
    const float *scale = nullptr, *shift = nullptr;
    const gpukit_bf16 *nbias = nullptr, *res = nullptr;
    int silu = 0;
  } fz;
  // path 0 is conv_igemm_fwd, 64, 128 and 256 conv_wg_fwd_<BN> (sm_90a's
  // wgmma), each with ops/conv2d.go's geometry.
  int path = 0;
  bool ws = false;   // conv_wg_fwd_ws_<BN> (the warp-specialised forward) instead
  bool tma = false;  // conv_wg_fwd_tma_<BN> (ws with TMA loads, tensor maps as ops/conv2d.go's convTMAArgs) instead
  auto launch = [&](const gpukit_bf16* in, const gpukit_bf16* wt, const gpukit_bf16* bias, gpukit_bf16* out, int h, int wd,
                    int cin, int oh, int ow, int cout, int stride, int pad, int acc) {
    conv_igemm_args a{in, wt, bias, out, N, h, wd, cin, oh, ow, cout, K, K, stride, pad, acc};
    a.pro_scale = fz.scale;
    a.pro_shift = fz.shift;
    a.nbias = fz.nbias;
    a.res = fz.res;
    a.pro_silu = fz.silu;
    emu::untrack();  // cp.async may read only these
    emu::track(in, (size_t)N * h * wd * cin * 2);
    emu::track(wt, (size_t)cout * K * K * cin * 2);
    long long p = (long long)N * oh * ow;
    if (path == 0) {
      emu::launch({(unsigned)((p + 127) / 128), (unsigned)((cout + 63) / 64), 1}, {128, 1, 1}, 2 * (128 + 64) * 40 * 2, seed++,
                  [&] { conv_igemm_fwd(a); });
      return;
    }
    if (tma) {
      conv_tma_args t{};
      t.a = a;
      emu::tmap_im2col(&t.tx, in, N, h, wd, cin, -pad, -pad, pad - (K - 1), pad - (K - 1), 64, 128, stride, stride);
      emu::tmap_tiled(&t.tw, wt, (long long)K * K * cin, cout, (long long)K * K * cin, 64, path);
      emu::launch({(unsigned)((p + 127) / 128), (unsigned)((cout + path - 1) / path), 1}, {CW_WS_THREADS, 1, 1},
                  4 * (128 + path) * 128 + 1024 + 128, seed++,
                  [&] { path == 64 ? conv_wg_fwd_tma_64(t) : path == 128 ? conv_wg_fwd_tma_128(t) : conv_wg_fwd_tma_256(t); });
      return;
    }
    if (ws) {
      emu::launch({(unsigned)((p + 127) / 128), (unsigned)((cout + path - 1) / path), 1}, {CW_WS_THREADS, 1, 1},
                  4 * (128 + path) * 128 + 1024 + 128, seed++,
                  [&] { path == 64 ? conv_wg_fwd_ws_64(a) : path == 128 ? conv_wg_fwd_ws_128(a) : conv_wg_fwd_ws_256(a); });
      return;
    }
    emu::launch({(unsigned)((p + 127) / 128), (unsigned)((cout + path - 1) / path), 1}, {CW_THREADS, 1, 1},
                4 * (128 + path) * 128 + 1024, seed++, [&] { path == 64 ? conv_wg_fwd_64(a) : path == 128 ? conv_wg_fwd_128(a) : conv_wg_fwd_256(a); });
  };
  auto want2 = conv(xv, wv, H, W, C, Co, P, nullptr);
  Buf dy(rows * Co, true), wf(Co * K * K * C, true);
  auto dyv = dy.rand();
  std::vector<double> wdx;  // dx = conv(dy, flip(w)) with padding K−1−P, at stride 1
  if (S == 1) {
    emu::launch({blocks((long long)Co * K * K * C, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] { conv_flip_w(wf.h(), w.h(), Co, K, K, C); });
    wdx.assign(N * H * W * C, 0);
    for (int n = 0; n < N; n++)
      for (int i = 0; i < Ho; i++)
        for (int j = 0; j < Wo; j++)
          for (int o = 0; o < Co; o++)
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++) {
                int hh = i - P + kh, ww = j - P + kw;
                if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                for (int c = 0; c < C; c++)
                  wdx[((n * H + hh) * W + ww) * C + c] += dyv[(((long long)n * Ho + i) * Wo + j) * Co + o] * wv[((o * K + kh) * K + kw) * C + c];
              }
  }
  // dw = Σ_p dy[p] ⊗ col[p] with conv_wg_dw_<BN> over splits of chunk
  // pixels, then conv_dw_reduce (and once accumulating into a previous dw).
  if (C % 64 == 0 && Co % 8 == 0) {
    int Kk = K * K * C;
    std::vector<double> wdw((size_t)Co * Kk, 0);
    for (int n = 0; n < N; n++)
      for (int i = 0; i < Ho; i++)
        for (int j = 0; j < Wo; j++)
          for (int kh = 0; kh < K; kh++)
            for (int kw = 0; kw < K; kw++) {
              int hh = i * S - P + kh, ww = j * S - P + kw;
              if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
              for (int o = 0; o < Co; o++) {
                double g = dyv[(((long long)n * Ho + i) * Wo + j) * Co + o];
                for (int c = 0; c < C; c++) wdw[(size_t)o * Kk + (kh * K + kw) * C + c] += g * xv[((n * H + hh) * W + ww) * C + c];
              }
            }
    for (int bn : {64, 128}) {
      if (C % bn) continue;
      for (int chunk : {64, (int)((rows + 63) / 64 * 64)}) {
        int splits = (int)((rows + chunk - 1) / chunk);
        Buf part((size_t)splits * Co * Kk, false), dw((size_t)Co * Kk, false);
        conv_wg_dw_args da{x.h(), dy.h(), part.f(), N, H, W, C, Ho, Wo, Co, K, K, S, P, chunk};
        emu::untrack();
        emu::track(x.h(), (size_t)N * H * W * C * 2);
        emu::track(dy.h(), (size_t)rows * Co * 2);
        for (int dk : {0, 1, 2}) {  // conv_wg_dw_<BN>, conv_wg_dw_ws_<BN> (warp-specialised), conv_wg_dw_tma_<BN> (TMA loads)
          const bool dws = dk == 1;
          std::fill(part.mem.begin(), part.mem.end(), 0xff);  // NaN: every partial sum must be written
          if (dk == 2) {
            conv_tma_dw_args dt{};  // ops/conv2d.go's convTMADWArgs
            dt.a = da;
            emu::tmap_tiled(&dt.tdy, dy.h(), Co, rows, Co, 64, 64);
            emu::tmap_im2col(&dt.tx, x.h(), N, H, W, C, -P, -P, P - (K - 1), P - (K - 1), 64, 64, S, S);
            emu::launch({(unsigned)((Co + 127) / 128), (unsigned)(Kk / bn), (unsigned)splits}, {CW_WS_THREADS, 1, 1},
                        4 * (128 + bn) * 128 + 1024 + 128, seed++, [&] { bn == 64 ? conv_wg_dw_tma_64(dt) : conv_wg_dw_tma_128(dt); });
          } else if (dws)
            emu::launch({(unsigned)((Co + 127) / 128), (unsigned)(Kk / bn), (unsigned)splits}, {CW_WS_THREADS, 1, 1},
                        4 * (128 + bn) * 128 + 1024 + 128, seed++, [&] { bn == 64 ? conv_wg_dw_ws_64(da) : conv_wg_dw_ws_128(da); });
          else
            emu::launch({(unsigned)((Co + 127) / 128), (unsigned)(Kk / bn), (unsigned)splits}, {CW_THREADS, 1, 1},
                        4 * (128 + bn) * 128 + 1024, seed++, [&] { bn == 64 ? conv_wg_dw_64(da) : conv_wg_dw_128(da); });
          std::string dname = name + (dk == 2 ? " tma dw" : dws ? " ws dw" : " wg dw") + std::to_string(bn) + " " + std::to_string(splits) + " split(s)";
          long long n = (long long)Co * Kk;
          for (int acc : {0, 1}) {
            auto prev = acc ? dw.read() : std::vector<double>();
            emu::launch({blocks(n, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] { conv_dw_reduce(dw.f(), part.f(), n, splits, acc); });
            auto want = wdw;
            for (size_t i = 0; acc && i < want.size(); i++) want[i] += prev[i];
            check(dname + (acc ? " (acc)" : ""), dw.read(), want, 1e-5);
          }
        }
      }
    }
  }
  // kind 0: conv_igemm_fwd (pth 0) or conv_wg_fwd_<pth>; 1: warp-specialised; 2: with TMA loads.
  for (auto [pth, kind] : std::vector<std::pair<int, int>>{{0, 0}, {64, 0}, {128, 0}, {256, 0}, {64, 1}, {128, 1}, {256, 1},
                                                             {64, 2}, {128, 2}, {256, 2}}) {
    // conv_wg_fwd needs Cin a multiple of 64 and Cout of 8 (ops/conv2d.go's wgOK).
    if (pth && (C % 64 || Co % 8)) continue;
    if (getenv("EMU_TMA_ONLY") && kind != 2) continue;
    path = pth;
    ws = kind == 1;
    tma = kind == 2;
    std::string pname = name + (pth == 0 ? "" : (tma ? " tma" : ws ? " ws" : " wg") + std::to_string(pth));
    Buf y(rows * Co, true);
    launch(x.h(), w.h(), b.h(), y.h(), H, W, C, Ho, Wo, Co, S, P, 0);
    check(pname + " y", y.read(), want, 1e-2);
    auto old = y.read();
    launch(x.h(), w.h(), nullptr, y.h(), H, W, C, Ho, Wo, Co, S, P, 1);
    auto want3 = want2;
    for (size_t i = 0; i < want3.size(); i++) want3[i] += old[i];
    check(pname + " y (acc, no bias)", y.read(), want3, 1e-2);
    if (Co % 2 == 0 && !tma) {  // (TMA loads take no fused input map: ops/conv2d.go runs those shapes without)
      // Fused: y = conv(SiLU(x·scale + shift) in the image, 0 in the
      // padding; rounded to bf16) + b + nbias[n] + res.
      Buf sc(N * C, false), sh(N * C, false), nb(N * Co, true), rs(rows * Co, true), yf(rows * Co, true);
      auto scv = sc.rand(0.5), shv = sh.rand(0.5), nbv = nb.rand(), rsv = rs.rand();
      std::vector<double> act(xv.size());
      for (size_t i = 0; i < act.size(); i++) {
        size_t n = i / ((size_t)H * W * C), c = i % C;
        double z = (double)(float)((float)xv[i] * (float)scv[n * C + c] + (float)shv[n * C + c]);
        z = z / (1 + exp(-z));
        act[i] = gpukit_bf16_to_f32(gpukit_f32_to_bf16((float)z));
      }
      auto wf = conv(act, wv, H, W, C, Co, P, &bv);
      for (size_t i = 0; i < wf.size(); i++) wf[i] += nbv[(i / ((size_t)Ho * Wo * Co)) * Co + i % Co] + rsv[i];
      fz.scale = sc.f();
      fz.shift = sh.f();
      fz.nbias = nb.h();
      fz.res = rs.h();
      fz.silu = 1;
      launch(x.h(), w.h(), b.h(), yf.h(), H, W, C, Ho, Wo, Co, S, P, 0);
      fz = {};
      check(pname + " fused (GN+SiLU map, per-sample bias, residual)", yf.read(), wf, 1e-2);
    }
    if (S != 1 || Co % (pth ? 64 : 32) || (pth && C % 8)) continue;
    Buf dx(N * H * W * C, true);
    launch(dy.h(), wf.h(), nullptr, dx.h(), Ho, Wo, Co, H, W, C, 1, K - 1 - P, 0);
    check(pname + " dx (flipped filters)", dx.read(), wdx, 1e-2);
  }
}

// ---- chanbias ----

static void chanbias(bool bf, int N, int S, int C) {
  std::string name = std::string(bf ? "bf16" : "f32") + " chanbias " + std::to_string(N) + "x" + std::to_string(S) + "x" + std::to_string(C);
  Buf x(N * S * C, bf), b(N * C, bf), y(N * S * C, bf);
  auto xv = x.rand(), bv = b.rand();
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < want.size(); i++) want[i] = xv[i] + bv[(i / (S * C)) * C + i % C];
  long long n = (long long)N * S * C;
  for (bool vec : {false, true}) {
    if (vec && C % 8) continue;
    emu::launch({blocks(vec ? (n + 7) / 8 : n, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        vec ? cb_add_v_bf16(y.h(), x.h(), b.h(), n, C, (long long)S * C) : cb_add_s_bf16(y.h(), x.h(), b.h(), n, C, (long long)S * C);
      else
        vec ? cb_add_v_f32(y.f(), x.f(), b.f(), n, C, (long long)S * C) : cb_add_s_f32(y.f(), x.f(), b.f(), n, C, (long long)S * C);
    });
    check(name + (vec ? " add v" : " add s"), y.read(), want, bf ? 1e-2 : 1e-6);
  }
  // Sums, with the Go side's chunking (cbChunk = 64 rows, ~1024 blocks).
  int colBlocks = (C + 31) / 32;
  int chunks = std::max(1, std::min((S + 63) / 64, 1024 / std::max(1, N * colBlocks)));
  int rowsPer = (S + chunks - 1) / chunks;
  chunks = (S + rowsPer - 1) / rowsPer;
  Buf part(N * chunks * C, false), out(N * C, false);
  emu::launch({(unsigned)chunks, (unsigned)colBlocks, (unsigned)N}, {32, 8, 1}, 0, seed++, [&] {
    if (bf)
      cb_sum_partial_bf16(part.f(), x.h(), S, C, rowsPer);
    else
      cb_sum_partial_f32(part.f(), x.f(), S, C, rowsPer);
  });
  auto old = out.rand();
  emu::launch({blocks(N * C, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] { cb_sum_final_f32(out.f(), part.f(), N, chunks, C, 1); });
  std::vector<double> ws(old);
  for (int i = 0; i < N; i++)
    for (int s = 0; s < S; s++)
      for (int c = 0; c < C; c++) ws[i * C + c] += xv[((long long)i * S + s) * C + c];
  check(name + " sum (acc, " + std::to_string(chunks) + " chunks)", out.read(), ws, 1e-5);
}

// ---- groupnorm ----

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static void groupnorm(bool bf, int N, int S, int C, int G, bool silu, bool vec) {
  if (vec && C % 8) return;
  std::string name = std::string(bf ? "bf16" : "f32") + " groupnorm N" + std::to_string(N) + " S" + std::to_string(S) +
                     " C" + std::to_string(C) + " G" + std::to_string(G) + (silu ? " silu" : "") + (vec ? " v" : " s");
  int V = vec ? 8 : 1, bx = C / V, by0 = 32 / gcd(bx, 32);
  int by = std::max(1, 256 / bx);
  if (bx * by0 <= 1024) by = by0 * std::max(1, 256 / (bx * by0));
  Buf x(N * S * C, bf), y(N * S * C, bf), w(C, false), b(C, false), mean(N * G, false), rstd(N * G, false);
  auto xv = x.rand(2);
  for (auto& v : xv) v += 0;  // (x is centred; the Go checks add an offset mean)
  auto wv = w.rand(), bv = b.rand();
  const double eps = 1e-5;
  int cg = C / G;
  std::vector<double> wy(xv.size()), wm(N * G), wr(N * G);
  for (int n = 0; n < N; n++)
    for (int g = 0; g < G; g++) {
      double s = 0, q = 0;
      for (int p = 0; p < S; p++)
        for (int c = g * cg; c < (g + 1) * cg; c++) s += xv[((long long)n * S + p) * C + c];
      double mu = s / (S * cg);
      for (int p = 0; p < S; p++)
        for (int c = g * cg; c < (g + 1) * cg; c++) q += pow(xv[((long long)n * S + p) * C + c] - mu, 2);
      double r = 1 / sqrt(q / (S * cg) + eps);
      wm[n * G + g] = mu;
      wr[n * G + g] = r;
      for (int p = 0; p < S; p++)
        for (int c = g * cg; c < (g + 1) * cg; c++) {
          long long i = ((long long)n * S + p) * C + c;
          double z = (xv[i] - mu) * r * wv[c] + bv[c];
          wy[i] = silu ? z / (1 + exp(-z)) : z;
        }
    }
  emu::launch({(unsigned)N, 1, 1}, {(unsigned)bx, (unsigned)by, 1}, (by + 2) * C * 4, seed++, [&] {
    if (bf)
      vec ? gn_fwd_v_bf16(y.h(), mean.f(), rstd.f(), x.h(), w.f(), b.f(), S, C, G, (float)eps, silu)
          : gn_fwd_s_bf16(y.h(), mean.f(), rstd.f(), x.h(), w.f(), b.f(), S, C, G, (float)eps, silu);
    else
      vec ? gn_fwd_v_f32(y.f(), mean.f(), rstd.f(), x.f(), w.f(), b.f(), S, C, G, (float)eps, silu)
          : gn_fwd_s_f32(y.f(), mean.f(), rstd.f(), x.f(), w.f(), b.f(), S, C, G, (float)eps, silu);
  });
  check(name + " y", y.read(), wy, bf ? 1e-2 : 1e-5);
  check(name + " mean", mean.read(), wm, 1e-5);
  check(name + " rstd", rstd.read(), wr, 1e-5);
  // The forward split over positions (gn_stats, gn_norm) in K = 3 chunks
  // (the last one short when 3 does not divide S).
  if (S >= 3) {
    const int chunk = (S + 2) / 3, K = (S + chunk - 1) / chunk;
    Buf y2(N * S * C, bf), mean2(N * G, false), rstd2(N * G, false), mom(2 * N * K * G, false);
    emu::launch({(unsigned)N, (unsigned)K, 1}, {(unsigned)bx, (unsigned)by, 1}, (by + 2) * C * 4, seed++, [&] {
      if (bf)
        vec ? gn_stats_v_bf16(mom.f(), x.h(), S, C, G, chunk) : gn_stats_s_bf16(mom.f(), x.h(), S, C, G, chunk);
      else
        vec ? gn_stats_v_f32(mom.f(), x.f(), S, C, G, chunk) : gn_stats_s_f32(mom.f(), x.f(), S, C, G, chunk);
    });
    emu::launch({(unsigned)N, (unsigned)K, 1}, {(unsigned)bx, (unsigned)by, 1}, 2 * G * 4, seed++, [&] {
      if (bf)
        vec ? gn_norm_v_bf16(y2.h(), mean2.f(), rstd2.f(), mom.f(), x.h(), w.f(), b.f(), S, C, G, (float)eps, silu, chunk)
            : gn_norm_s_bf16(y2.h(), mean2.f(), rstd2.f(), mom.f(), x.h(), w.f(), b.f(), S, C, G, (float)eps, silu, chunk);
      else
        vec ? gn_norm_v_f32(y2.f(), mean2.f(), rstd2.f(), mom.f(), x.f(), w.f(), b.f(), S, C, G, (float)eps, silu, chunk)
            : gn_norm_s_f32(y2.f(), mean2.f(), rstd2.f(), mom.f(), x.f(), w.f(), b.f(), S, C, G, (float)eps, silu, chunk);
    });
    check(name + " split y", y2.read(), wy, bf ? 1e-2 : 1e-5);
    check(name + " split mean", mean2.read(), wm, 1e-5);
    check(name + " split rstd", rstd2.read(), wr, 1e-5);
  }
  if (bf) {
    // gn_affine: the same normalisation as scale, shift [N, C] (z = x·scale + shift).
    Buf sc(N * C, false), sh(N * C, false);
    emu::launch({(unsigned)N, 1, 1}, {(unsigned)bx, (unsigned)by, 1}, (by + 2) * C * 4, seed++, [&] {
      vec ? gn_affine_v_bf16(sc.f(), sh.f(), nullptr, nullptr, x.h(), w.f(), b.f(), S, C, G, (float)eps)
          : gn_affine_s_bf16(sc.f(), sh.f(), nullptr, nullptr, x.h(), w.f(), b.f(), S, C, G, (float)eps);
    });
    std::vector<double> wsc(N * C), wsh(N * C);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) {
        wsc[n * C + c] = wr[n * G + c / cg] * wv[c];
        wsh[n * C + c] = bv[c] - wm[n * G + c / cg] * wsc[n * C + c];
      }
    check(name + " affine scale", sc.read(), wsc, 1e-5);
    check(name + " affine shift", sh.read(), wsh, 1e-5);
  }
  // Backward, dx accumulated.
  Buf dy(N * S * C, bf), dx(N * S * C, bf), part(2 * N * C, false), dw(C, false), db(C, false);
  auto dyv = dy.rand();
  auto dx0 = dx.rand();
  std::vector<double> wdx(dx0), wdw(C, 0), wdb(C, 0);
  for (int n = 0; n < N; n++)
    for (int g = 0; g < G; g++) {
      double mu = mean.get(n * G + g), r = rstd.get(n * G + g), a1 = 0, a2 = 0;
      std::vector<double> dz(S * cg), h(S * cg);
      for (int p = 0; p < S; p++)
        for (int k = 0; k < cg; k++) {
          int c = g * cg + k;
          long long i = ((long long)n * S + p) * C + c;
          double hh = (xv[i] - mu) * r, d = dyv[i];
          if (silu) {
            double z = hh * wv[c] + bv[c], sg = 1 / (1 + exp(-z));
            d *= sg * (1 + z * (1 - sg));
          }
          dz[p * cg + k] = d;
          h[p * cg + k] = hh;
          a1 += d * wv[c];
          a2 += d * wv[c] * hh;
          wdw[c] += d * hh;
          wdb[c] += d;
        }
      for (int p = 0; p < S; p++)
        for (int k = 0; k < cg; k++) {
          int c = g * cg + k;
          wdx[((long long)n * S + p) * C + c] += r * (dz[p * cg + k] * wv[c] - a1 / (S * cg) - h[p * cg + k] * a2 / (S * cg));
        }
    }
  emu::launch({(unsigned)N, 1, 1}, {(unsigned)bx, (unsigned)by, 1}, (2 * by + 2) * C * 4, seed++, [&] {
    if (bf)
      vec ? gn_bwd_v_bf16(dx.h(), part.f(), dy.h(), x.h(), w.f(), b.f(), mean.f(), rstd.f(), S, C, G, silu, 1)
          : gn_bwd_s_bf16(dx.h(), part.f(), dy.h(), x.h(), w.f(), b.f(), mean.f(), rstd.f(), S, C, G, silu, 1);
    else
      vec ? gn_bwd_v_f32(dx.f(), part.f(), dy.f(), x.f(), w.f(), b.f(), mean.f(), rstd.f(), S, C, G, silu, 1)
          : gn_bwd_s_f32(dx.f(), part.f(), dy.f(), x.f(), w.f(), b.f(), mean.f(), rstd.f(), S, C, G, silu, 1);
  });
  emu::launch({blocks(C, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] { gn_bwd_reduce(dw.f(), db.f(), part.f(), N, C, 0, 0); });
  check(name + " dx (acc)", dx.read(), wdx, bf ? 2e-2 : 1e-4);
  check(name + " dw", dw.read(), wdw, 1e-4);
  check(name + " db", db.read(), wdb, 1e-4);
}

// ---- silu, resample, concat, tembed, mse ----

static void elementwise(bool bf) {
  std::string dt = bf ? "bf16" : "f32";
  for (long long n : {1LL, 13LL, 1000LL}) {
    Buf x(n, bf), y(n, bf), dy(n, bf), dx(n, bf);
    auto xv = x.rand(3), dyv = dy.rand();
    std::vector<double> wy(n), wdx(n);
    for (long long i = 0; i < n; i++) {
      double s = 1 / (1 + exp(-xv[i]));
      wy[i] = xv[i] * s;
      wdx[i] = dyv[i] * s * (1 + xv[i] * (1 - s));
    }
    for (bool vec : {false, true}) {
      unsigned g = blocks(vec ? (n + 7) / 8 : n, 256);
      emu::launch({g, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          vec ? silu_fwd_v_bf16(y.h(), x.h(), n) : silu_fwd_s_bf16(y.h(), x.h(), n);
        else
          vec ? silu_fwd_v_f32(y.f(), x.f(), n) : silu_fwd_s_f32(y.f(), x.f(), n);
      });
      emu::launch({g, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          vec ? silu_bwd_v_bf16(dx.h(), dy.h(), x.h(), n, 0) : silu_bwd_s_bf16(dx.h(), dy.h(), x.h(), n, 0);
        else
          vec ? silu_bwd_v_f32(dx.f(), dy.f(), x.f(), n, 0) : silu_bwd_s_f32(dx.f(), dy.f(), x.f(), n, 0);
      });
      check(dt + " silu n=" + std::to_string(n) + (vec ? " v" : " s"), y.read(), wy, bf ? 1e-2 : 1e-6);
      check(dt + " silu backward n=" + std::to_string(n) + (vec ? " v" : " s"), dx.read(), wdx, bf ? 1e-2 : 1e-6);
    }
  }
  {  // resample: N=2, small 3×2×5, k=2 (and pool back)
    int N = 2, h = 3, w = 2, C = 5, k = 2;
    long long ns = (long long)N * h * w * C, nl = ns * k * k;
    Buf s(ns, bf), l(nl, bf), up(nl, bf), pool(ns, bf), dl(nl, bf), ds(ns, bf);
    auto sv = s.rand(), lv = l.rand();
    std::vector<double> wup(nl), wpool(ns, 0), wdl(nl), wds(ns, 0);
    for (long long i = 0; i < nl; i++) {
      int c = i % C, X = i / C % (w * k), Y = i / C / (w * k) % (h * k), n = i / C / (w * k) / (h * k);
      long long j = ((long long)(n * h + Y / k) * w + X / k) * C + c;
      wup[i] = sv[j];
      wpool[j] += lv[i] / (k * k);
      wdl[i] = sv[j] / (k * k);
      wds[j] += lv[i];
    }
    auto run = [&](void (*fb)(gpukit_bf16*, const gpukit_bf16*, long long, int, int, int, int, int),
                   void (*ff)(float*, const float*, long long, int, int, int, int, int), Buf& out, Buf& in) {
      long long n = out.size();
      emu::launch({blocks(n, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          fb(out.h(), in.h(), n, h, w, C, k, 0);
        else
          ff(out.f(), in.f(), n, h, w, C, k, 0);
      });
    };
    run(rs_up_fwd_bf16, rs_up_fwd_f32, up, s);
    run(rs_pool_fwd_bf16, rs_pool_fwd_f32, pool, l);
    run(rs_pool_bwd_bf16, rs_pool_bwd_f32, dl, s);
    run(rs_up_bwd_bf16, rs_up_bwd_f32, ds, l);
    check(dt + " upsample", up.read(), wup, 0);
    check(dt + " avgpool", pool.read(), wpool, bf ? 1e-2 : 1e-6);
    check(dt + " avgpool backward", dl.read(), wdl, bf ? 1e-2 : 1e-6);
    check(dt + " upsample backward", ds.read(), wds, bf ? 1e-2 : 1e-6);
  }
  {  // concat
    long long rows = 7;
    int ca = 3, cb = 5;
    Buf a(rows * ca, bf), b(rows * cb, bf), y(rows * (ca + cb), bf), da(rows * ca, bf), db(rows * cb, bf);
    auto av = a.rand(), bv = b.rand();
    std::vector<double> wy;
    for (long long r = 0; r < rows; r++) {
      wy.insert(wy.end(), av.begin() + r * ca, av.begin() + (r + 1) * ca);
      wy.insert(wy.end(), bv.begin() + r * cb, bv.begin() + (r + 1) * cb);
    }
    emu::launch({blocks(rows * (ca + cb), 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        cat_fwd_bf16(y.h(), a.h(), b.h(), rows, ca, cb);
      else
        cat_fwd_f32(y.f(), a.f(), b.f(), rows, ca, cb);
    });
    check(dt + " concat", y.read(), wy, 0);
    auto da0 = da.rand();
    for (size_t i = 0; i < da0.size(); i++) da0[i] += av[i];
    emu::launch({blocks(rows * (ca + cb), 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        cat_bwd_bf16(da.h(), db.h(), y.h(), rows, ca, cb, 1, 0);
      else
        cat_bwd_f32(da.f(), db.f(), y.f(), rows, ca, cb, 1, 0);
    });
    check(dt + " split (acc a)", da.read(), da0, bf ? 1e-2 : 1e-6);
    check(dt + " split b", db.read(), bv, 0);
  }
  {  // tembed
    int n = 3, half = 5;
    std::vector<int> t = {0, 17, 999};
    Buf y(n * 2 * half, bf);
    emu::launch({1, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        temb_bf16(y.h(), t.data(), n, half, (float)log(10000.0));
      else
        temb_f32(y.f(), t.data(), n, half, (float)log(10000.0));
    });
    std::vector<double> wy(n * 2 * half);
    for (int r = 0; r < n; r++)
      for (int i = 0; i < half; i++) {
        double a = t[r] * exp(-log(10000.0) * i / half);
        wy[r * 2 * half + i] = cos(a);
        wy[r * 2 * half + half + i] = sin(a);
      }
    check(dt + " tembed", y.read(), wy, bf ? 1e-2 : 1e-4);
  }
  for (long long n : {1LL, 5000LL, 300000LL}) {  // mse
    Buf p(n, bf), y(n, bf), dp(n, bf), loss(1, false);
    auto pv = p.rand(), yv = y.rand();
    double s = 0;
    std::vector<double> wg(n);
    for (long long i = 0; i < n; i++) {
      s += (pv[i] - yv[i]) * (pv[i] - yv[i]);
      wg[i] = 2 * (pv[i] - yv[i]) / n;
    }
    int nb = (int)std::min<long long>((n + 1023) / 1024, 1024);
    Buf part(nb, false);
    float inv = (float)(1.0 / n);
    emu::launch({(unsigned)nb, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        mse_partial_bf16(part.f(), dp.h(), p.h(), y.h(), n, inv, 0);
      else
        mse_partial_f32(part.f(), dp.f(), p.f(), y.f(), n, inv, 0);
    });
    emu::launch({1, 1, 1}, {256, 1, 1}, 0, seed++, [&] { mse_final(loss.f(), part.f(), nb, inv); });
    check(dt + " mse n=" + std::to_string(n), loss.read(), {s / n}, 1e-5);
    check(dt + " mse gradient n=" + std::to_string(n), dp.read(), wg, bf ? 1e-2 : 1e-6);
  }
}

// ---- diffusion ----

static double normal_at(unsigned long long sd, unsigned stream, unsigned step, long long i) {
  unsigned r[4] = {(unsigned)(i / 4), (unsigned)((unsigned long long)(i / 4) >> 32), stream, step};
  gpukit_philox4x32_10(r, (unsigned)sd, (unsigned)(sd >> 32));
  int k = (i % 4) / 2 * 2;
  double u1 = ((r[k] >> 8) + 1) / 16777216.0, u2 = (r[k + 1] >> 8) / 16777216.0;
  double rad = sqrt(-2 * log(u1));
  return i % 2 ? rad * sin(2 * M_PI * u2) : rad * cos(2 * M_PI * u2);
}

static void diffusion(bool bf) {
  std::string dt = bf ? "bf16" : "f32";
  const int N = 3, per = 10, passes = 2;
  long long n = N * per;
  int counter = 6;
  {  // noise
    Buf z(n + 1, bf);
    emu::launch({blocks((n + 4) / 4, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        diff_noise_bf16(z.h(), n + 1, 99, 3, &counter);
      else
        diff_noise_f32(z.f(), n + 1, 99, 3, &counter);
    });
    std::vector<double> wz(n + 1);
    for (long long i = 0; i <= n; i++) wz[i] = normal_at(99, 3, 6, i);
    check(dt + " noise", z.read(), wz, bf ? 1e-2 : 1e-6);
  }
  {  // qsample
    Buf x0(n, false), xt(n, bf), e(n, bf), sab(20, false), s1(20, false);
    auto xv = x0.rand();
    std::vector<int> t = {3, 0, 19};
    for (int i = 0; i < 20; i++) {
      sab.set(i, cos(i / 20.0));
      s1.set(i, sin(i / 20.0));
    }
    emu::launch({blocks((n + 3) / 4, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        diff_qsample_bf16_f32(xt.h(), e.h(), x0.f(), t.data(), sab.f(), s1.f(), n, per, 20, 5, 1, &counter);
      else
        diff_qsample_f32_f32(xt.f(), e.f(), x0.f(), t.data(), sab.f(), s1.f(), n, per, 20, 5, 1, &counter);
    });
    std::vector<double> wx(n), we(n);
    for (long long i = 0; i < n; i++) {
      we[i] = normal_at(5, 1, 6, i);
      int k = t[i / per];
      wx[i] = sab.get(k) * xv[i] + s1.get(k) * we[i];
    }
    check(dt + " qsample eps", e.read(), we, bf ? 1e-2 : 1e-6);
    check(dt + " qsample xt", xt.read(), wx, bf ? 1e-2 : 1e-6);
  }
  {  // start and step
    Buf coef(2 * 12, false), x(n, false), d(n, false), prev(n, false), eps(passes * n, bf), xin(passes * n, bf);
    std::vector<int> tin(passes * N, -1);
    double row0[12] = {0.6, 0.8, 0, 0, 0, 0, 0, 0, 999, 0, 0, 0};
    double row1[12] = {0.7, 0.71, 0.3, 0.5, -0.2, 0.4, 0.1, 3, 17, 0.25, 1, 0};
    for (int i = 0; i < 12; i++) {
      coef.set(i, row0[i]);
      coef.set(12 + i, row1[i]);
    }
    auto pv = prev.rand();
    diff_args a{x.f(), d.f(), eps.ptr(), xin.ptr(), tin.data(), prev.f(), coef.f(), &counter, 123, n, per, passes, N, 2};
    emu::launch({blocks((n + 3) / 4, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        diff_start_bf16(a);
      else
        diff_start_f32(a);
    });
    std::vector<double> wx(n);
    for (long long i = 0; i < n; i++) wx[i] = (double)(float)0.6 * pv[i] + (double)(float)0.8 * normal_at(123, 2, 6, i);
    check(dt + " start x", x.read(), wx, 1e-6);
    auto xin0 = xin.read();
    check(dt + " start model input", std::vector<double>(xin0.begin() + n, xin0.end()), wx, bf ? 1e-2 : 1e-6);
    bool tok = true;
    for (int v : tin) tok = tok && v == 999;
    check(dt + " start timesteps", {tok ? 0.0 : 1.0}, {0.0}, 0);
    auto xv = x.read();
    auto ev = eps.rand(), dv = d.rand();
    a.coef = coef.f() + 12;
    a.stream = 9;
    emu::launch({blocks((n + 3) / 4, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        diff_step_bf16_bf16(a);
      else
        diff_step_f32_f32(a);
    });
    std::vector<double> wn(n), w0(n);
    double r[12];
    for (int i = 0; i < 12; i++) r[i] = (float)row1[i];
    for (long long i = 0; i < n; i++) {
      double e = ev[n + i] + r[7] * (ev[i] - ev[n + i]);
      double h = std::max(-1.0, std::min(1.0, (xv[i] - r[1] * e) / r[0]));
      h = (1 - r[9]) * h + r[9] * pv[i];
      double ep = (xv[i] - r[0] * h) / r[1];
      wn[i] = r[2] * xv[i] + r[3] * h + r[4] * ep + r[5] * dv[i] + r[6] * normal_at(123, 9, 6, i);
      w0[i] = h;
    }
    check(dt + " step x'", x.read(), wn, 1e-5);
    check(dt + " step d = x0", d.read(), w0, 1e-5);
    auto xin1 = xin.read();
    check(dt + " step model input (pass 2)", std::vector<double>(xin1.begin() + n, xin1.end()), wn, bf ? 1e-2 : 1e-5);
    tok = true;
    for (int v : tin) tok = tok && v == 17;
    check(dt + " step timesteps", {tok ? 0.0 : 1.0}, {0.0}, 0);
  }
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "quick";
  for (bool bf : {false, true}) {
    conv(bf, 3, 5, 5, 3, 3, 3, 1, 1);
    conv(bf, 3, 6, 6, 8, 3, 3, 1, 1);
    conv(bf, 2, 7, 6, 16, 3, 3, 2, 1);
    conv(bf, 1, 6, 5, 4, 1, 1, 2, 0);
    if (bf) {
      igemm(2, 5, 6, 32, 40, 3, 1, 1);   // one partial block of rows and of channels
      igemm(1, 7, 7, 64, 8, 3, 2, 1);    // stride 2
      igemm(2, 4, 5, 32, 32, 3, 1, 1);   // dx through the flipped filters
      igemm(2, 4, 4, 64, 1, 3, 1, 1);    // one output channel (conv_out): single stores
      igemm(1, 5, 3, 32, 3, 3, 1, 1);    // an odd Cout
      igemm(2, 5, 6, 64, 136, 3, 1, 1);  // wgmma: partial channel blocks (128 + 8, or 136 of 256)
      igemm(1, 10, 10, 64, 16, 3, 1, 1); // wgmma dw: 100 pixels, a second split of 36
      igemm(6, 4, 4, 64, 8, 3, 1, 1);    // wgmma dw: 16-pixel images, a k-step crosses four of them
      if (!quick) {
        igemm(3, 8, 8, 32, 72, 3, 1, 1);  // 192 rows (two row blocks), two channel blocks
        igemm(1, 6, 6, 96, 64, 3, 1, 0);  // no padding
        igemm(3, 8, 8, 128, 64, 3, 1, 1); // wgmma: 192 rows, two k-steps a tap, dx through it (Cin 64)
      }
    }
    chanbias(bf, 2, 9, 8);
    chanbias(bf, 3, 130, 5);
    if (!quick) chanbias(bf, 1, 3000, 40);
    for (bool vec : {false, true}) {
      groupnorm(bf, 2, 5, 8, 4, false, vec);
      groupnorm(bf, 2, 7, 24, 4, true, vec);
      groupnorm(bf, 1, 3, 6, 3, true, vec);
      if (!quick) {
        groupnorm(bf, 2, 64, 64, 32, true, vec);
        groupnorm(bf, 1, 16, 256, 32, false, vec);
      }
    }
    elementwise(bf);
    diffusion(bf);
  }
  printf(failures ? "FAIL: %d check(s)\n" : "PASS\n", failures);
  return failures ? 1 : 0;
}
