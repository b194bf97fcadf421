// mma.cuh: the tensor-core instructions of gpukit's bf16 GEMM-like kernels
// (conv2d.cu's implicit GEMM, attention.cu's mma.sync kernels), as small
// wrappers around inline PTX and, with GPUKIT_EMU defined
// (scripts/cudaemu), a host emulation of them.
//
//   gpukit_ldsm_x4:  ldmatrix.sync.aligned.m8n8.x4.shared.b16 — lane l
//                    gives the address of row l%8 of matrix l/8 and gets,
//                    in r[i], elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1)
//                    of matrix i (low half first);
//   gpukit_ldsm_x4_t: the same with .trans: r[i] gets elements (2(l%4),
//                    l/4) and (2(l%4)+1, l/4) of matrix i;
//   gpukit_mma_bf16: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
//                    c += A·B with g = lane/4, t = lane%4: a[0] = A(g,
//                    2t..2t+1), a[1] = A(g+8, 2t..), a[2] = A(g, 2t+8..),
//                    a[3] = A(g+8, 2t+8..); b0 = B(2t..2t+1, g), b1 =
//                    B(2t+8.., g); c[0..1] = C(g, 2t..2t+1), c[2..3] =
//                    C(g+8, 2t..2t+1) (PTX ISA, "Matrix Fragments for
//                    mma.m16n8k16 with floating point type");
//   gpukit_cp16:     cp.async.cg.shared.global of 16 bytes, or 16 zero
//                    bytes when !ok (src-size 0: nothing is read);
//   gpukit_cp_commit, gpukit_cp_wait0: commit_group, wait_group 0;
//   gpukit_cp_wait<N>: wait_group N (all but the N most recent committed
//                    groups of this thread have landed).
#pragma once
#include "common.cuh"

#ifndef GPUKIT_EMU
__device__ __forceinline__ unsigned gpukit_smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void gpukit_ldsm_x4(unsigned r[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void gpukit_ldsm_x4_t(unsigned r[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void gpukit_mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void gpukit_cp16(unsigned s, const void* g, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(g), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void gpukit_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void gpukit_cp_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gpukit_cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ unsigned gpukit_smem_addr(const void* p) { return gpukit_emu_smem_addr(p); }
__device__ __forceinline__ void gpukit_ldsm_x4(unsigned r[4], unsigned addr) { gpukit_emu_ldsm_x4(r, addr, false); }
__device__ __forceinline__ void gpukit_ldsm_x4_t(unsigned r[4], unsigned addr) { gpukit_emu_ldsm_x4(r, addr, true); }
__device__ __forceinline__ void gpukit_mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  gpukit_emu_mma_bf16_16816(c, a, b0, b1);
}
__device__ __forceinline__ void gpukit_cp16(unsigned s, const void* g, bool ok) { gpukit_emu_cp16(s, g, ok); }
__device__ __forceinline__ void gpukit_cp_commit() { gpukit_emu_cp_commit(); }
__device__ __forceinline__ void gpukit_cp_wait0() { gpukit_emu_cp_wait0(); }
template <int N>
__device__ __forceinline__ void gpukit_cp_wait() {
  gpukit_emu_cp_wait(N);
}
#endif

// gpukit_a_addr: the ldmatrix.x4 address giving the A fragment of 16 rows
// from row0 and 16 columns from col0 of a padded shared tile (row stride
// LDS elements, bf16): matrices (rows +0, cols +0), (+8, +0), (+0, +8),
// (+8, +8) → a[0..3].
template <int LDS>
__device__ __forceinline__ unsigned gpukit_a_addr(unsigned s, int row0, int col0, int lane) {
  return s + ((row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + col0 + (lane >> 4) * 8) * 2;
}

// gpukit_b_addr: the ldmatrix.x4 address giving the B fragments of two
// n-tiles from a tile stored [n][k] (rows n0..n0+15, columns k0..k0+15):
// matrices (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8) →
// {r0, r1} for n-tile n0, {r2, r3} for n-tile n0+8.
template <int LDS>
__device__ __forceinline__ unsigned gpukit_b_addr(unsigned s, int n0, int k0, int lane) {
  return s + ((n0 + (lane & 7) + (lane >> 4) * 8) * LDS + k0 + ((lane >> 3) & 1) * 8) * 2;
}

// gpukit_bt_addr: the ldmatrix.x4.trans address giving the B fragments of
// two n-tiles from a tile stored [k][n] (rows k0..k0+15, columns
// n0..n0+15): matrices (k +0, n +0), (k +8, n +0), (k +0, n +8), (k +8,
// n +8) → {r0, r1} for n-tile n0, {r2, r3} for n-tile n0+8.
template <int LDS>
__device__ __forceinline__ unsigned gpukit_bt_addr(unsigned s, int k0, int n0, int lane) {
  return s + ((k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + n0 + (lane >> 4) * 8) * 2;
}
