// NVRTC rejects some things clang takes (seen: __builtin_offsetof in a
// static_assert); keep kernels to standard CUDA C++.
#define __builtin_offsetof(t, m) __gpukit_no_offsetof_in_nvrtc
// shim.h: enough of the CUDA toolkit's declarations for clang to compile
// gpukit's kernels without the toolkit (-nocudainc -nocudalib), so
// scripts/cuda-check.sh can catch C++ errors in kernels on a machine
// without CUDA. NVRTC on a GPU machine remains the real compiler: inline
// PTX is passed through unchecked here.
#pragma once
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
typedef unsigned long size_t;
#include <__clang_cuda_builtin_vars.h>
#define GPUKIT_VEC2(T, N, A) struct __attribute__((aligned(A))) N##2 { T x, y; };
#define GPUKIT_VEC4(T, N, A) struct __attribute__((aligned(A))) N##4 { T x, y, z, w; };
GPUKIT_VEC2(char, char, 2) GPUKIT_VEC4(char, char, 4)
GPUKIT_VEC2(unsigned char, uchar, 2) GPUKIT_VEC4(unsigned char, uchar, 4)
GPUKIT_VEC2(short, short, 4) GPUKIT_VEC4(short, short, 8)
GPUKIT_VEC2(unsigned short, ushort, 4) GPUKIT_VEC4(unsigned short, ushort, 8)
GPUKIT_VEC2(int, int, 8) GPUKIT_VEC4(int, int, 16)
GPUKIT_VEC2(unsigned int, uint, 8) GPUKIT_VEC4(unsigned int, uint, 16)
GPUKIT_VEC2(long long, longlong, 16) GPUKIT_VEC2(unsigned long long, ulonglong, 16)
GPUKIT_VEC2(float, float, 8) GPUKIT_VEC4(float, float, 16)
GPUKIT_VEC2(double, double, 16)
struct longlong4 { long long x, y, z, w; };
struct ulonglong4 { unsigned long long x, y, z, w; };
struct double4 { double x, y, z, w; };
#define __CUDACC__
#define CUDA_VERSION 12000
#define INT_MAX 2147483647
#define INT_MIN (-INT_MAX - 1)
#define HUGE_VALF __builtin_huge_valf()
#define HUGE_VAL __builtin_huge_val()
#define __CUDA_ARCH__ 800
typedef unsigned int cuuint32_t;
#include <__clang_cuda_libdevice_declares.h>
#include <__clang_cuda_device_functions.h>
#define powi __clang_cuda_powi  // clang-only; NVRTC has none, kernels may use the name
#include <__clang_cuda_math.h>
#undef powi
#include <__clang_cuda_intrinsics.h>
// The atomics the toolkit's device_atomic_functions.h declares.
__device__ inline int atomicAdd(int* p, int v) { return __iAtomicAdd(p, v); }
__device__ inline unsigned atomicAdd(unsigned* p, unsigned v) { return __uAtomicAdd(p, v); }
__device__ inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __ullAtomicAdd(p, v); }
__device__ inline float atomicAdd(float* p, float v) { return __fAtomicAdd(p, v); }
__device__ inline double atomicAdd(double* p, double v) { return __dAtomicAdd(p, v); }
__device__ inline int atomicCAS(int* p, int c, int v) { return __iAtomicCAS(p, c, v); }
__device__ inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { return __uAtomicCAS(p, c, v); }
__device__ inline int atomicMax(int* p, int v) { return __iAtomicMax(p, v); }
__device__ inline unsigned atomicMax(unsigned* p, unsigned v) { return __uAtomicMax(p, v); }
__device__ inline int atomicExch(int* p, int v) { return __iAtomicExch(p, v); }
__device__ inline unsigned atomicExch(unsigned* p, unsigned v) { return __uAtomicExch(p, v); }
