package main

import (
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"gpukit/libgpu/cuda"
)

// gemm times a plain row-major C[M,N] = A[M,K]·B[K,N] through cuBLASLt, in
// bf16 (f32 accumulation) or f32 data with TF32 tensor cores. Of the
// heuristic's candidates, each is timed once and the fastest kept (what
// DESIGN.md advises: "ask for several algorithms and time them once per shape").
func (b *bench) gemm(w Workload) (Result, error) {
	dt, ct, es := cuda.R16BF, cuda.Compute32F, 2
	if w.DType == "tf32" {
		dt, ct, es = cuda.R32F, cuda.Compute32FFastTF32, 4
	}
	m, n, k := w.M, w.N, w.K
	a, err := b.randomBuffer(int64(m*k*es), es)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(a)
	bb, err := b.randomBuffer(int64(k*n*es), es)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(bb)
	c, err := cuda.MemAlloc(int64(m * n * es))
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(c)
	ws, wsSize, err := b.workspace()
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(ws)
	// Row-major C = A·B is column-major Cᵀ(N×M) = Bᵀ(N×K)·Aᵀ(K×M): A-operand = B, B-operand = A.
	spec := cuda.GemmSpec{M: n, N: m, K: k, LDA: n, LDB: k, LDC: n, LDD: n,
		AType: dt, BType: dt, CType: dt, DType: dt, Compute: ct}
	args := cuda.GemmArgs{A: bb, B: a, C: c, D: c, Alpha: 1, Workspace: ws, WorkspaceSize: wsSize}
	note, err := b.tune(spec, args, w.Iters)
	if err != nil {
		return Result{}, err
	}
	ms, err := b.timed(w.Iters, func() error { return b.lt.Matmul(spec, args, b.stream) })
	return Result{MS: ms, Flops: 2 * float64(m) * float64(n) * float64(k), Bytes: float64((m*k + k*n + m*n) * es), Note: note}, err
}

const workspaceBytes = 64 << 20

func (b *bench) workspace() (cuda.DevicePtr, int64, error) {
	p, err := cuda.MemAlloc(workspaceBytes)
	return p, workspaceBytes, err
}

// tune times up to 16 heuristic candidates and pins the fastest for spec.
func (b *bench) tune(spec cuda.GemmSpec, args cuda.GemmArgs, iters int) (string, error) {
	cands, err := b.lt.Candidates(spec, 16)
	if err != nil {
		return "", err
	}
	best, bestMS := -1, math.Inf(1)
	for i, algo := range cands {
		if algo.WorkspaceSize > args.WorkspaceSize {
			continue
		}
		ms, err := b.timed(3, func() error { return b.lt.MatmulAlgo(spec, args, algo, b.stream) })
		if err != nil {
			continue
		}
		fmt.Fprintf(os.Stderr, "gpukit-bench: %dx%dx%d candidate %d: %.4f ms (workspace %d, waves %.2f)\n", spec.M, spec.N, spec.K, i, ms, algo.WorkspaceSize, algo.Waves)
		if ms < bestMS {
			best, bestMS = i, ms
		}
	}
	if best < 0 {
		return "", fmt.Errorf("no cuBLASLt candidate ran for %+v", spec)
	}
	// Tuning runs many large GEMMs back to back; let the GPU's clocks settle
	// before the timed run, so both sides of the comparison start from a
	// similar state (the reference process starts idle after its imports).
	time.Sleep(time.Second)
	return fmt.Sprintf("candidate %d of %d", best, len(cands)), b.lt.SetAlgo(spec, cands[best])
}

func bf16(f float32) uint16 {
	u := math.Float32bits(f)
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

func bytesAsF32(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func ptrOf(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
