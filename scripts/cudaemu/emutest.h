// emutest.h: helpers shared by the emulation tests of the element-wise and
// row-wise families (gelu_test.cpp, layernorm_test.cpp, cast_test.cpp):
// NaN-poisoned buffers of f32 or bf16 elements, 16-byte aligned and tracked
// (emu::check_global), a fixed random source, and the relative-error check
// of opstest (‖got − want‖ / ‖want‖, NaN never passes). Include after the
// kernel source.
#pragma once
#include <cstdio>
#include <random>
#include <string>
#include <vector>

static int failures = 0;
static uint64_t seed = 7;
static std::mt19937_64 rng(3);
static double randn() { return std::normal_distribution<double>(0, 1)(rng); }

// Buf is a "device" buffer of n elements of f32 or bf16 (or raw bytes),
// poisoned with NaN, at a 16-byte aligned address plus off elements.
struct Buf {
  bool bf = false;
  size_t off = 0;
  std::vector<unsigned char> mem;
  void alloc(size_t n, bool bf16, size_t offset = 0) {
    bf = bf16;
    off = offset;
    mem.assign((n + off) * (bf ? 2 : 4) + 16, 0xff);
  }
  unsigned char* base() { return mem.data() + ((16 - (uintptr_t)mem.data() % 16) % 16); }
  void* ptr() { return base() + off * (bf ? 2 : 4); }
  float* f() { return (float*)ptr(); }
  gpukit_bf16* h() { return (gpukit_bf16*)ptr(); }
  double get(size_t i) {
    if (bf) return gpukit_bf16_to_f32(h()[i]);
    return f()[i];
  }
  void set(size_t i, double v) {
    if (bf)
      h()[i] = gpukit_f32_to_bf16((float)v);
    else
      f()[i] = (float)v;
  }
  void track() { emu::track(mem.data(), mem.size()); }
  std::vector<double> read(size_t n) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; i++) out[i] = get(i);
    return out;
  }
  // fill stores scale·N(0,1) + shift draws and returns the stored values.
  std::vector<double> fill(size_t n, double scale, double shift = 0) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; i++) {
      set(i, shift + scale * randn());
      out[i] = get(i);
    }
    return out;
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
  double e = relerr(got, want);
  bool ok = e <= tol;
  printf("%-4s %-64s relerr %.3g (tol %.3g)\n", ok ? "ok" : "FAIL", what.c_str(), e, tol);
  if (!ok) failures++;
}

static int finish() {
  printf(failures ? "FAIL: %d check(s)\n" : "PASS\n", failures);
  return failures ? 1 : 0;
}
