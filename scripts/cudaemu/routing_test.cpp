// routing_test.cpp: runs libgpu/kernels/routing.cu under the host
// emulation (emu.h) with the launch geometry of libgpu/ops/routing.go and
// checks every kernel against float64 references: top-k (ties to the lower
// expert) and its backward, the counting sort (exactly the stable order,
// over several 256-choice chunks), permute, combine and their backward
// (scalar and vector instances, f32 and bf16), and the auxiliary losses
// with their gradient. Usage: scripts/cuda-emu.sh routing
#include "emu.h"
#define MOE_DYN_SMEM(name) int* name = (int*)emu::g.smem.data()
// clang-format off
#include "../../libgpu/kernels/routing.cu"
// clang-format on
#include "emutest.h"

#include <algorithm>
#include <string>

static std::vector<int> ibuf(size_t n) { return std::vector<int>(n + 4, -7); }

static unsigned warps_grid(int t) { return (unsigned)std::min((t + 7) / 8, 65535); }

static void check_i(const std::string& what, const int* got, const std::vector<int>& want) {
  bool ok = true;
  for (size_t i = 0; i < want.size(); i++) ok = ok && got[i] == want[i];
  printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) failures++;
}

static void run_case(int T, int E, int k, int d) {
  std::string tag = " T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k);
  Buf logits;
  logits.alloc((size_t)T * E, false);
  auto z = logits.fill((size_t)T * E, 2);
  for (int t = 0; t < T; t += 5) z[(size_t)t * E + E - 1] = z[(size_t)t * E], logits.set((size_t)t * E + E - 1, z[(size_t)t * E]);  // ties
  Buf w;
  w.alloc((size_t)T * k, false);
  auto ex = ibuf((size_t)T * k);
  logits.track(), w.track(), emu::track(ex.data(), ex.size() * 4);
  float* wp = w.f();
  const float* lp = logits.f();
  int* exp_ = ex.data();
  emu::launch({warps_grid(T), 1, 1}, {256, 1, 1}, 0, seed++, [=] { moe_topk(wp, exp_, lp, T, E, k); });
  // Reference top-k.
  std::vector<int> rex((size_t)T * k);
  std::vector<double> rw((size_t)T * k);
  for (int t = 0; t < T; t++) {
    std::vector<int> idx(E);
    for (int i = 0; i < E; i++) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return z[(size_t)t * E + a] > z[(size_t)t * E + b]; });
    double s = 0;
    for (int j = 0; j < k; j++) s += exp(z[(size_t)t * E + idx[j]] - z[(size_t)t * E + idx[0]]);
    for (int j = 0; j < k; j++) {
      rex[(size_t)t * k + j] = idx[j];
      rw[(size_t)t * k + j] = exp(z[(size_t)t * E + idx[j]] - z[(size_t)t * E + idx[0]]) / s;
    }
  }
  check_i("moe_topk experts" + tag, ex.data(), rex);
  check("moe_topk weights" + tag, w.read((size_t)T * k), rw, 1e-6);

  // top-k backward (acc on odd T).
  Buf dw, dl;
  dw.alloc((size_t)T * k, false), dl.alloc((size_t)T * E, false);
  auto dwv = dw.fill((size_t)T * k, 1);
  int acc = T % 2;
  std::vector<double> old((size_t)T * E, 0);
  if (acc) old = dl.fill((size_t)T * E, 1);
  dw.track(), dl.track();
  float* dlp = dl.f();
  const float* dwp = dw.f();
  emu::launch({warps_grid(T), 1, 1}, {256, 1, 1}, 0, seed++, [=] { moe_topk_bwd(dlp, dwp, wp, exp_, T, E, k, acc); });
  std::vector<double> rdl = old;
  for (int t = 0; t < T; t++) {
    double s = 0;
    for (int j = 0; j < k; j++) s += rw[(size_t)t * k + j] * dwv[(size_t)t * k + j];
    for (int j = 0; j < k; j++) rdl[(size_t)t * E + rex[(size_t)t * k + j]] += rw[(size_t)t * k + j] * (dwv[(size_t)t * k + j] - s);
  }
  check("moe_topk_bwd" + tag, dl.read((size_t)T * E), rdl, 1e-5);

  // Counting sort.
  int n = T * k, chunks = (n + 255) / 256;
  auto cc = ibuf((size_t)std::max(chunks, 1) * E), counts = ibuf(E), offsets = ibuf(E + 1), perm = ibuf(n), rows = ibuf(n);
  for (auto* v : {&cc, &counts, &offsets, &perm, &rows}) emu::track(v->data(), v->size() * 4);
  int *ccp = cc.data(), *cp = counts.data(), *op = offsets.data(), *pp = perm.data(), *rp = rows.data();
  if (chunks) emu::launch({(unsigned)chunks, 1, 1}, {256, 1, 1}, 4 * E, seed++, [=] { moe_count(ccp, exp_, n, E); });
  emu::launch({1, 1, 1}, {1024, 1, 1}, 0, seed++, [=] { moe_scan(cp, op, ccp, chunks, E); });
  if (chunks) emu::launch({(unsigned)chunks, 1, 1}, {256, 1, 1}, 0, seed++, [=] { moe_scatter(pp, rp, exp_, ccp, n, E); });
  std::vector<int> rc(E, 0), ro(E + 1, 0), rperm(n), rrows(n);
  for (int a = 0; a < n; a++) rc[rex[a]]++;
  for (int e = 0; e < E; e++) ro[e + 1] = ro[e] + rc[e];
  std::vector<int> next(ro.begin(), ro.end() - 1);
  for (int a = 0; a < n; a++) rperm[a] = next[rex[a]], rrows[next[rex[a]]] = a, next[rex[a]]++;
  check_i("moe counts" + tag, cp, rc);
  check_i("moe offsets" + tag, op, ro);
  check_i("moe perm" + tag, pp, rperm);
  check_i("moe rows" + tag, rp, rrows);

  // Permute, combine and their backward, both dtypes, both instances.
  for (bool bf : {false, true}) {
    for (bool vec : {false, true}) {
      std::string tg = tag + " d=" + std::to_string(d) + (bf ? " bf16" : " f32") + (vec ? " v" : " s");
      Buf x, xs, ys, y, dy, dys, dwc, dx;
      x.alloc((size_t)T * d, bf), xs.alloc((size_t)n * d, bf), ys.alloc((size_t)n * d, bf), y.alloc((size_t)T * d, bf);
      dy.alloc((size_t)T * d, bf), dys.alloc((size_t)n * d, bf), dwc.alloc((size_t)T * k, false), dx.alloc((size_t)T * d, bf);
      auto xv = x.fill((size_t)T * d, 1), ysv = ys.fill((size_t)n * d, 1), dyv = dy.fill((size_t)T * d, 1);
      std::vector<double> odx((size_t)T * d, 0), odys((size_t)n * d, 0), odw((size_t)T * k, 0);
      int accb = vec;
      if (accb) odx = dx.fill((size_t)T * d, 1), odys = dys.fill((size_t)n * d, 1), odw = dwc.fill((size_t)T * k, 1);
      for (Buf* b : {&x, &xs, &ys, &y, &dy, &dys, &dwc, &dx}) b->track();
      void *xp = x.ptr(), *xsp = xs.ptr(), *ysp = ys.ptr(), *yp = y.ptr(), *dyp = dy.ptr(), *dysp = dys.ptr(), *dxp = dx.ptr();
      float* dwcp = dwc.f();
      long long nn = n;
      int V = bf ? 8 : 4;
      unsigned g1 = (unsigned)std::min<long long>((nn * (d / (vec ? V : 1)) + 255) / 256, 65535);
      unsigned g2 = (unsigned)std::min<long long>(((long long)T * (d / (vec ? 8 : 1)) + 255) / 256, 65535);
      emu::launch({g1, 1, 1}, {256, 1, 1}, 0, seed++, [=] {
        if (!bf) {
          if (vec) moe_permute_v_f32((float*)xsp, (const float*)xp, rp, nn, d, k);
          else moe_permute_s_f32((float*)xsp, (const float*)xp, rp, nn, d, k);
        } else {
          if (vec) moe_permute_v_bf16((gpukit_bf16*)xsp, (const gpukit_bf16*)xp, rp, nn, d, k);
          else moe_permute_s_bf16((gpukit_bf16*)xsp, (const gpukit_bf16*)xp, rp, nn, d, k);
        }
      });
      std::vector<double> rxs((size_t)n * d);
      for (int r = 0; r < n; r++)
        for (int c = 0; c < d; c++) rxs[(size_t)r * d + c] = xv[(size_t)(rrows[r] / k) * d + c];
      check("moe_permute" + tg, xs.read((size_t)n * d), rxs, 0);
      emu::launch({g2, 1, 1}, {256, 1, 1}, 0, seed++, [=] {
        if (!bf) {
          if (vec) moe_permute_bwd_v_f32((float*)dxp, (const float*)ysp, pp, T, d, k, accb);
          else moe_permute_bwd_s_f32((float*)dxp, (const float*)ysp, pp, T, d, k, accb);
        } else {
          if (vec) moe_permute_bwd_v_bf16((gpukit_bf16*)dxp, (const gpukit_bf16*)ysp, pp, T, d, k, accb);
          else moe_permute_bwd_s_bf16((gpukit_bf16*)dxp, (const gpukit_bf16*)ysp, pp, T, d, k, accb);
        }
      });
      std::vector<double> rdx = odx;
      for (int a = 0; a < n; a++)
        for (int c = 0; c < d; c++) rdx[(size_t)(a / k) * d + c] += ysv[(size_t)rperm[a] * d + c];
      check("moe_permute_bwd" + tg, dx.read((size_t)T * d), rdx, bf ? 1e-2 : 1e-6);
      emu::launch({g2, 1, 1}, {256, 1, 1}, 0, seed++, [=] {
        if (!bf) {
          if (vec) moe_combine_v_f32((float*)yp, (const float*)ysp, wp, pp, T, d, k);
          else moe_combine_s_f32((float*)yp, (const float*)ysp, wp, pp, T, d, k);
        } else {
          if (vec) moe_combine_v_bf16((gpukit_bf16*)yp, (const gpukit_bf16*)ysp, wp, pp, T, d, k);
          else moe_combine_s_bf16((gpukit_bf16*)yp, (const gpukit_bf16*)ysp, wp, pp, T, d, k);
        }
      });
      auto wv = w.read((size_t)T * k);
      std::vector<double> ry((size_t)T * d, 0), rdys = odys, rdwc = odw;
      for (int a = 0; a < n; a++)
        for (int c = 0; c < d; c++) {
          ry[(size_t)(a / k) * d + c] += wv[a] * ysv[(size_t)rperm[a] * d + c];
          rdys[(size_t)rperm[a] * d + c] += wv[a] * dyv[(size_t)(a / k) * d + c];
          rdwc[a] += dyv[(size_t)(a / k) * d + c] * ysv[(size_t)rperm[a] * d + c];
        }
      check("moe_combine" + tg, y.read((size_t)T * d), ry, bf ? 1e-2 : 1e-6);
      emu::launch({warps_grid(T), 1, 1}, {256, 1, 1}, 0, seed++, [=] {
        if (!bf)
          moe_combine_bwd_f32((float*)dysp, dwcp, (const float*)dyp, (const float*)ysp, wp, pp, T, d, k, accb, accb);
        else
          moe_combine_bwd_bf16((gpukit_bf16*)dysp, dwcp, (const gpukit_bf16*)dyp, (const gpukit_bf16*)ysp, wp, pp, T,
                               d, k, accb, accb);
      });
      check("moe_combine_bwd dys" + tg, dys.read((size_t)n * d), rdys, bf ? 1e-2 : 1e-6);
      check("moe_combine_bwd dw" + tg, dwc.read((size_t)T * k), rdwc, 1e-5);
      emu::untrack();
      logits.track(), w.track(), emu::track(ex.data(), ex.size() * 4);
      for (auto* v : {&cc, &counts, &offsets, &perm, &rows}) emu::track(v->data(), v->size() * 4);
    }
  }

  // Auxiliary losses.
  Buf lse, col, losses, dz;
  lse.alloc(T, false), col.alloc(E, false), losses.alloc(2, false), dz.alloc((size_t)T * E, false);
  lse.track(), col.track(), losses.track(), dz.track();
  float *lsep = lse.f(), *colp = col.f(), *lossp = losses.f(), *dzp = dz.f();
  const float aux = 0.7f, zc = 0.3f;
  emu::launch({warps_grid(T), 1, 1}, {256, 1, 1}, 0, seed++, [=] { moe_aux_rows(dzp, lsep, lp, cp, T, E, aux, zc, 0); });
  emu::launch({(unsigned)((E + 31) / 32), 1, 1}, {32, 8, 1}, 0, seed++, [=] { moe_aux_cols(colp, lp, lsep, T, E); });
  emu::launch({1, 1, 1}, {256, 1, 1}, 0, seed++, [=] { moe_aux_final(lossp, colp, cp, lsep, T, E); });
  std::vector<double> P(E, 0), rdz((size_t)T * E);
  double zl = 0;
  for (int t = 0; t < T; t++) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < E; i++) m = std::max(m, z[(size_t)t * E + i]);
    for (int i = 0; i < E; i++) s += exp(z[(size_t)t * E + i] - m);
    double l = m + log(s), sg = 0;
    zl += l * l / T;
    std::vector<double> p(E), g(E);
    for (int i = 0; i < E; i++) {
      p[i] = exp(z[(size_t)t * E + i] - l);
      P[i] += p[i] / T;
      g[i] = aux * E * rc[i] / ((double)T * T);
      sg += p[i] * g[i];
    }
    for (int i = 0; i < E; i++) rdz[(size_t)t * E + i] = p[i] * (g[i] - sg) + zc * 2.0 / T * l * p[i];
  }
  double la = 0;
  for (int i = 0; i < E; i++) la += (double)rc[i] / T * P[i];
  check("moe_aux losses" + tag, losses.read(2), {E * la, zl}, 1e-5);
  check("moe_aux dlogits" + tag, dz.read((size_t)T * E), rdz, 1e-4);
  emu::untrack();
}

int main() {
  run_case(1, 1, 1, 8);
  run_case(37, 5, 2, 24);
  run_case(300, 8, 2, 16);   // 600 choices: three chunks
  run_case(70, 64, 8, 8);    // E > 32: lanes stride the experts
  return finish();
}
