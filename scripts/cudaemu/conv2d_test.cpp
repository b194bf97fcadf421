// conv2d_test.cpp: runs libgpu/kernels/conv2d.cu's direct kernels — the
// dilated and grouped convolution's forward (conv_direct_fwd), input
// gradient (conv_direct_dx) and weight gradient (conv_direct_dw, a warp an
// element) — under the host emulation (emu.h) with the launch geometry of
// libgpu/ops/conv2d.go (convDirectFwd, convDirectBackward), against
// float64 loops written from the definitions (PyTorch's nn.Conv2d with
// dilation and groups, channels-last), in f32 and bf16, overwriting and
// accumulating (acc). The weight gradient runs a second time on one block
// (its grid-stride loop over warps) and must agree bit for bit: each
// element's order of summation does not depend on the grid. (The im2col,
// col2im and implicit GEMM kernels are unet_test.cpp's.) Usage:
// scripts/cuda-emu.sh conv2d
#include "emu.h"
#define CONV_DYN_SMEM(name) unsigned char* name = emu::g.smem.data()
// clang-format off
#include "../../libgpu/kernels/conv2d.cu"
// clang-format on
#include "emutest.h"

struct Geom {
  int n, h, w, cin, cout, kh, kw, s, p, d, g;
  int ho() const { return (h + 2 * p - d * (kh - 1) - 1) / s + 1; }
  int wo() const { return (w + 2 * p - d * (kw - 1) - 1) / s + 1; }
  std::string name() const {
    char b[160];
    snprintf(b, sizeof b, "x%dx%dx%dx%d w%dx%dx%dx%d s%d p%d d%d g%d", n, h, w, cin, cout, kh, kw, cin / g, s, p, d, g);
    return b;
  }
};

static unsigned blocks(long long n, long long per) { return (unsigned)std::min<long long>(std::max<long long>((n + per - 1) / per, 1), 65535); }

// ref computes y = conv(x, w) + b, dx, dw and db = 0 for dy (float64).
static void ref(const Geom& c, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                const std::vector<double>& dy, std::vector<double>& y, std::vector<double>& dx, std::vector<double>& dw) {
  const int ho = c.ho(), wo = c.wo(), cig = c.cin / c.g, cog = c.cout / c.g;
  y.assign((size_t)c.n * ho * wo * c.cout, 0);
  dx.assign(x.size(), 0);
  dw.assign(w.size(), 0);
  for (int n = 0; n < c.n; n++)
    for (int i = 0; i < ho; i++)
      for (int j = 0; j < wo; j++)
        for (int o = 0; o < c.cout; o++) {
          const size_t yi = (((size_t)n * ho + i) * wo + j) * c.cout + o;
          double s = b[o];
          for (int kh = 0; kh < c.kh; kh++)
            for (int kw = 0; kw < c.kw; kw++) {
              const int h = i * c.s - c.p + kh * c.d, ww = j * c.s - c.p + kw * c.d;
              if (h < 0 || h >= c.h || ww < 0 || ww >= c.w) continue;
              for (int ci = 0; ci < cig; ci++) {
                const size_t xi = (((size_t)n * c.h + h) * c.w + ww) * c.cin + (o / cog) * cig + ci;
                const size_t wi = (((size_t)o * c.kh + kh) * c.kw + kw) * cig + ci;
                s += x[xi] * w[wi];
                dx[xi] += dy[yi] * w[wi];
                dw[wi] += dy[yi] * x[xi];
              }
            }
          y[yi] = s;
        }
}

static void run(const Geom& c, bool bf) {
  const int ho = c.ho(), wo = c.wo(), cig = c.cin / c.g;
  const size_t nx = (size_t)c.n * c.h * c.w * c.cin, nw = (size_t)c.cout * c.kh * c.kw * cig, ny = (size_t)c.n * ho * wo * c.cout;
  const std::string name = std::string(bf ? "bf16 " : "f32 ") + c.name();
  const double tol = bf ? 1e-2 : 1e-5;
  Buf x, w, b, dy;
  x.alloc(nx, bf);
  w.alloc(nw, bf);
  b.alloc(c.cout, bf);
  dy.alloc(ny, bf);
  auto xv = x.fill(nx, 1), wv = w.fill(nw, 0.5), bv = b.fill(c.cout, 1), dyv = dy.fill(ny, 1);
  std::vector<double> wy, wdx, wdw;
  ref(c, xv, wv, bv, dyv, wy, wdx, wdw);
  conv_direct_args a{c.n, c.h, c.w, c.cin, c.cout, c.kh, c.kw, ho, wo, c.s, c.p, c.d, c.g, 0};
  for (int acc : {0, 1}) {
    a.acc = acc;
    // Forward, with the bias (and without, overwriting).
    Buf y;
    y.alloc(ny, bf);
    std::vector<double> want = wy;
    if (acc) {
      auto old = y.fill(ny, 1);
      for (size_t i = 0; i < ny; i++) want[i] += old[i];
    }
    emu::launch({blocks(ny, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        conv_direct_fwd_bf16(y.h(), x.h(), w.h(), b.h(), a);
      else
        conv_direct_fwd_f32(y.f(), x.f(), w.f(), b.f(), a);
    });
    check(name + (acc ? " fwd acc" : " fwd"), y.read(ny), want, tol);
    if (!acc) {
      std::vector<double> nob = wy;
      for (size_t i = 0; i < ny; i++) nob[i] -= bv[i % c.cout];
      emu::launch({blocks(ny, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
        if (bf)
          conv_direct_fwd_bf16(y.h(), x.h(), w.h(), nullptr, a);
        else
          conv_direct_fwd_f32(y.f(), x.f(), w.f(), nullptr, a);
      });
      check(name + " fwd no bias", y.read(ny), nob, tol);
    }
    // Input gradient.
    Buf dx;
    dx.alloc(nx, bf);
    want = wdx;
    if (acc) {
      auto old = dx.fill(nx, 1);
      for (size_t i = 0; i < nx; i++) want[i] += old[i];
    }
    emu::launch({blocks(nx, 256), 1, 1}, {256, 1, 1}, 0, seed++, [&] {
      if (bf)
        conv_direct_dx_bf16(dx.h(), dy.h(), w.h(), a);
      else
        conv_direct_dx_f32(dx.f(), dy.f(), w.f(), a);
    });
    check(name + (acc ? " dx acc" : " dx"), dx.read(nx), want, tol);
    // Weight gradient: dw f32 always, and bf16 when x is; the Go grid (a
    // warp an element), then one block striding over the elements.
    for (bool dwbf : {false, true}) {
      if (dwbf && !bf) continue;
      Buf dw[2];
      std::vector<double> old;
      for (int k = 0; k < 2; k++) dw[k].alloc(nw, dwbf);
      want = wdw;
      if (acc) {
        old = dw[0].fill(nw, 1);
        for (int i = 0; i < (int)nw; i++) dw[1].set(i, old[i]);
        for (size_t i = 0; i < nw; i++) want[i] += old[i];
      }
      for (int k = 0; k < 2; k++) {
        unsigned grid = k == 0 ? blocks(nw, 256 / 32) : 1;
        emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
          if (!bf)
            conv_direct_dw_f32_f32(dw[k].f(), dy.f(), x.f(), a);
          else if (dwbf)
            conv_direct_dw_bf16_bf16(dw[k].h(), dy.h(), x.h(), a);
          else
            conv_direct_dw_bf16_f32(dw[k].f(), dy.h(), x.h(), a);
        });
      }
      const std::string dn = name + (dwbf ? " dw bf16" : " dw f32") + (acc ? " acc" : "");
      check(dn, dw[0].read(nw), want, dwbf ? 1e-2 : tol);
      check(dn + " one block = Go grid (bitwise)", dw[1].read(nw), dw[0].read(nw), 0);
    }
  }
}

int main() {
  const Geom geoms[] = {
      {2, 9, 7, 6, 9, 3, 2, 2, 1, 2, 3},  // dilation, groups, stride 2, non-square image and kernel
      {2, 7, 9, 3, 5, 3, 3, 1, 2, 2, 1},  // dilation 2 at odd sizes, padding 2
      {2, 6, 5, 8, 8, 3, 3, 1, 1, 1, 8},  // depthwise
      {1, 5, 5, 4, 12, 3, 3, 1, 1, 1, 4}, // one input, three outputs a group
      {1, 5, 5, 2, 3, 3, 3, 1, 4, 2, 1},  // padding 4 below the dilated extent 5
      {3, 4, 6, 6, 4, 1, 1, 1, 0, 1, 2},  // grouped 1×1; 72 positions: a lane sums 3 or 2
  };
  for (bool bf : {false, true})
    for (const Geom& c : geoms) run(c, bf);
  return finish();
}
