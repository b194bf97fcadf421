package main

import (
	"fmt"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// linear times y = act(x·wᵀ + b) forward, or its backward (dx, dw, db from
// dy), the workload PyTorch runs as act(F.linear(x, w, b)) and autograd.
//
// bf16: bf16 tensors straight through cuBLASLt with the epilogue fused —
// forward is one GEMM (RELU_BIAS / GELU_BIAS); backward is one elementwise
// kernel dz = dy ⊙ act'(z), the dx GEMM, and the dw GEMM with the bias
// gradient fused (BGRADB): three launches where PyTorch's autograd takes four.
// tf32: f32 tensors through ops.Engine (the path the trainer uses).
func (b *bench) linear(w Workload) (Result, error) {
	if w.DType == "tf32" {
		return b.linearOps(w)
	}
	m, n, k := w.M, w.N, w.K
	flops := 2 * float64(m) * float64(n) * float64(k)
	x, err := b.randomBuffer(int64(m*k*2), 2)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(x)
	wt, err := b.randomBuffer(int64(n*k*2), 2)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(wt)
	bias, err := b.randomBuffer(int64(n*2), 2)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(bias)
	y, err := cuda.MemAlloc(int64(m * n * 2))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(y)
	ws, wsSize, err := b.workspace()
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(ws)
	epi := cuda.EpilogueReLUBias
	if w.Act == "gelu" {
		epi = cuda.EpilogueGELUBias
	}
	// Row-major y[M,N] = act(x[M,K]·w[N,K]ᵀ + b): column-major yᵀ = op(wᵀ)·xᵀ (DESIGN.md).
	fwd := cuda.GemmSpec{TransA: true, M: n, N: m, K: k, LDA: k, LDB: k, LDC: n, LDD: n,
		AType: cuda.R16BF, BType: cuda.R16BF, CType: cuda.R16BF, DType: cuda.R16BF, Epilogue: epi}
	fargs := cuda.GemmArgs{A: wt, B: x, C: y, D: y, Bias: bias, Alpha: 1, Workspace: ws, WorkspaceSize: wsSize}
	es := float64(2)
	if w.Name == "linear_fwd" {
		note, err := b.tune(fwd, fargs, w.Iters)
		if err != nil {
			return Result{}, err
		}
		ms, err := b.timed(w.Iters, func() error { return b.lt.Matmul(fwd, fargs, b.stream) })
		return Result{MS: ms, Flops: flops, Bytes: es * float64(m*k+n*k+n+m*n), Note: note}, err
	}

	// Backward: z = x·wᵀ + b (untimed set-up), dy random.
	z, err := cuda.MemAlloc(int64(m * n * 2))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(z)
	pre := fwd
	pre.Epilogue = cuda.EpilogueBias
	pargs := fargs
	pargs.C, pargs.D = z, z
	if err := b.lt.Matmul(pre, pargs, b.stream); err != nil {
		return Result{}, err
	}
	dy, err := b.randomBuffer(int64(m*n*2), 2)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(dy)
	dz, err := cuda.MemAlloc(int64(m * n * 2))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(dz)
	dx, err := cuda.MemAlloc(int64(m * k * 2))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(dx)
	dw, err := cuda.MemAlloc(int64(n * k * 2))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(dw)
	db, err := cuda.MemAlloc(int64(n * 2))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(db)
	fn, err := b.dactKernel()
	if err != nil {
		return Result{}, err
	}
	// dx[M,K] = dz[M,N]·w[N,K]: column-major dxᵀ(K×M) = wᵀ(K×N, ld K)·dzᵀ(N×M, ld N).
	dxSpec := cuda.GemmSpec{M: k, N: m, K: n, LDA: k, LDB: n, LDC: k, LDD: k,
		AType: cuda.R16BF, BType: cuda.R16BF, CType: cuda.R16BF, DType: cuda.R16BF}
	dxArgs := cuda.GemmArgs{A: wt, B: dz, C: dx, D: dx, Alpha: 1, Workspace: ws, WorkspaceSize: wsSize}
	// dw[N,K] = dzᵀ[N,M]·x[M,K]: column-major dwᵀ(K×N) = xᵀ(K×M, ld K)·op(dzᵀ stored N×M, ld N)ᵀ,
	// and BGRADB sums op(B) = dz (M×N) over the GEMM's k = M: db[N] = Σ_m dz[m,n].
	dwSpec := cuda.GemmSpec{TransB: true, M: k, N: n, K: m, LDA: k, LDB: n, LDC: k, LDD: k,
		AType: cuda.R16BF, BType: cuda.R16BF, CType: cuda.R16BF, DType: cuda.R16BF, Epilogue: cuda.EpilogueBGradB}
	dwArgs := cuda.GemmArgs{A: x, B: dz, C: dw, D: dw, Bias: db, Alpha: 1, Workspace: ws, WorkspaceSize: wsSize}
	count := int64(m * n)
	gelu := int32(0)
	if w.Act == "gelu" {
		gelu = 1
	}
	blocks := uint32((count/8 + 255) / 256)
	step := func() error {
		if err := cuda.LaunchKernel(fn, [3]uint32{blocks, 1, 1}, [3]uint32{256, 1, 1}, 0, b.stream,
			unsafe.Pointer(&dy), unsafe.Pointer(&z), unsafe.Pointer(&dz), unsafe.Pointer(&count), unsafe.Pointer(&gelu)); err != nil {
			return err
		}
		if err := b.lt.Matmul(dxSpec, dxArgs, b.stream); err != nil {
			return err
		}
		return b.lt.Matmul(dwSpec, dwArgs, b.stream)
	}
	if _, err := b.tune(dxSpec, dxArgs, w.Iters); err != nil {
		return Result{}, err
	}
	if _, err := b.tune(dwSpec, dwArgs, w.Iters); err != nil {
		return Result{}, err
	}
	ms, err := b.timed(w.Iters, step)
	return Result{MS: ms, Flops: 2 * flops, Bytes: es * float64(2*m*n+m*k+n*k+m*k+n*k+n)}, err
}

const dactSrc = `
// dz = dy * act'(z) for bf16 tensors, 8 elements per thread (16-byte loads).
__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
__device__ __forceinline__ unsigned short tobf(float f) {
	unsigned u = __float_as_uint(f);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float dgelu(float z) {
	const float c = 0.7978845608028654f, a = 0.044715f;
	float t = tanhf(c * (z + a * z * z * z));
	return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * c * (1.f + 3.f * a * z * z);
}
extern "C" __global__ void gpukit_bench_dact(const uint4* dy, const uint4* z, uint4* dz, long long n, int gelu) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n / 8) return;
	uint4 g = dy[i], v = z[i], o;
	unsigned* gp = (unsigned*)&g; unsigned* vp = (unsigned*)&v; unsigned* op = (unsigned*)&o;
	#pragma unroll
	for (int j = 0; j < 4; j++) {
		float g0 = bf(gp[j] & 0xffff), g1 = bf(gp[j] >> 16);
		float z0 = bf(vp[j] & 0xffff), z1 = bf(vp[j] >> 16);
		float d0 = gelu ? g0 * dgelu(z0) : (z0 > 0.f ? g0 : 0.f);
		float d1 = gelu ? g1 * dgelu(z1) : (z1 > 0.f ? g1 : 0.f);
		op[j] = (unsigned)tobf(d0) | ((unsigned)tobf(d1) << 16);
	}
	dz[i] = o;
}
`

func (b *bench) dactKernel() (cuda.Function, error) {
	dc, err := kernels.ForContext(b.ctx)
	if err != nil {
		return 0, err
	}
	res, err := dc.Compile(kernels.Source{Name: "bench_dact.cu", Code: []byte(dactSrc)}, kernels.Options{Arch: dc.Arch()})
	if err != nil {
		return 0, err
	}
	mod, err := cuda.ModuleLoadData(res.Image())
	if err != nil {
		return 0, err
	}
	return mod.Function("gpukit_bench_dact")
}

// linearOps runs the f32 (TF32 tensor cores) forward through ops.Engine, as
// the trainer does: tensors in device memory, the epilogue chosen by the engine.
func (b *bench) linearOps(w Workload) (Result, error) {
	if w.Name != "linear_fwd" {
		return Result{}, errSkip
	}
	d, err := device.NewCUDA(0)
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	e, err := ops.NewEngine(d, ops.Options{Precision: ops.PrecTF32})
	if err != nil {
		return Result{}, err
	}
	a := device.Local{Dev: d}
	m, n, k := w.M, w.N, w.K
	mk := func(shape ...int) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, "", tensor.F32, shape...)
		if err != nil {
			return nil, err
		}
		v := make([]float32, t.Numel())
		for i := range v {
			v[i] = float32(b.rng.Float64()*2 - 1)
		}
		return t, t.WriteF32(v)
	}
	x, err := mk(m, k)
	if err != nil {
		return Result{}, err
	}
	wt, err := mk(n, k)
	if err != nil {
		return Result{}, err
	}
	bias, err := mk(n)
	if err != nil {
		return Result{}, err
	}
	y, err := mk(m, n)
	if err != nil {
		return Result{}, err
	}
	defer func() {
		for _, t := range []*tensor.Tensor{x, wt, bias, y} {
			t.Buf.Free()
		}
	}()
	act, err := ops.ParseAct(w.Act)
	if err != nil {
		return Result{}, err
	}
	s := e.Stream()
	if s == 0 {
		return Result{}, fmt.Errorf("engine on %v has no stream", d)
	}
	saved := b.stream
	b.stream = s
	defer func() { b.stream = saved }()
	ms, err := b.timed(w.Iters, func() error { return e.Linear(y, x, wt, bias, nil, act) })
	return Result{MS: ms, Flops: 2 * float64(m) * float64(n) * float64(k), Bytes: 4 * float64(m*k+n*k+n+m*n), Note: "ops.Engine"}, err
}
