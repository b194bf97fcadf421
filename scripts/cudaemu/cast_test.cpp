// cast_test.cpp: runs libgpu/kernels/cast.cu's multi-tensor f32 → bf16 cast
// under the host emulation (emu.h) with the plan of libgpu/ops/cast.go
// (castMTPlan: 128 tensors per launch, 4096 elements per block) over tensors
// of odd sizes, some misaligned, and checks every element against the C
// rounding (round to nearest even) and that nothing past a tensor is
// written. Usage: scripts/cuda-emu.sh cast
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/cast.cu"
// clang-format on
#include "emutest.h"

int main() {
  const long long sizes[] = {0, 1, 7, 8, 13, 4095, 4096, 4097, 10000, 3 * 4096};
  const int count = 140;
  std::vector<Buf> src(count), dst(count);
  std::vector<long long> n(count);
  emu::untrack();
  for (int i = 0; i < count; i++) {
    n[i] = sizes[i % 10];
    size_t off = i % 5 == 4 ? 1 : 0;
    src[i].alloc(n[i] + 1, false, off);
    dst[i].alloc(n[i] + 1, true, off);  // one element more: must stay NaN
    src[i].fill(n[i], 3);
  }
  for (int i = 0; i < count; i++) {
    src[i].track();
    dst[i].track();
  }
  for (int lo = 0; lo < count; lo += CAST_MT_MAX) {
    int hi = std::min(lo + CAST_MT_MAX, count);
    cast_mt_args a;
    memset(&a, 0, sizeof a);
    a.count = hi - lo;
    long long blocks = 0;
    for (int i = lo; i < hi; i++) {
      a.t[i - lo] = {dst[i].h(), src[i].f(), n[i]};
      a.start[i - lo] = (int)blocks;
      blocks += (n[i] + CAST_MT_CHUNK - 1) / CAST_MT_CHUNK;
    }
    a.start[hi - lo] = (int)blocks;
    if (blocks == 0) continue;
    emu::launch({(unsigned)blocks, 1, 1}, {256, 1, 1}, 0, seed++, [&] { cast_multi_f32_to_bf16(a); });
  }
  for (int i = 0; i < count; i++) {
    std::vector<double> got = dst[i].read(n[i]), want(n[i]);
    for (long long k = 0; k < n[i]; k++) want[k] = gpukit_bf16_to_f32(gpukit_f32_to_bf16(src[i].f()[k]));
    char name[64];
    snprintf(name, sizeof name, "tensor %d: %lld elements off %zu", i, n[i], src[i].off);
    check(name, got, want, 0);
    if (!std::isnan(dst[i].get(n[i]))) {
      printf("FAIL tensor %d: element past the end written\n", i);
      failures++;
    }
  }
  return finish();
}
