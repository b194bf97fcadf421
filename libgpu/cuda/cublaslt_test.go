package cuda_test

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/tensor"
)

// linearRef is the row-major Y[M,N] = relu(X[M,K]·W[N,K]ᵀ + b) in float64.
func linearRef(x, w, b []float64, m, n, k int) []float64 {
	y := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := b[j]
			for l := 0; l < k; l++ {
				s += x[i*k+l] * w[j*k+l]
			}
			y[i*n+j] = math.Max(s, 0)
		}
	}
	return y
}

func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

// devBF16 rounds x to bf16, uploads it, and returns the rounded values.
func devBF16(t *testing.T, x []float32) (cuda.DevicePtr, []float64) {
	t.Helper()
	h := make([]uint16, len(x))
	r := make([]float64, len(x))
	for i, v := range x {
		h[i] = tensor.BF16FromF32(v)
		r[i] = float64(tensor.BF16ToF32(h[i]))
	}
	p, err := cuda.MemAlloc(int64(2 * len(h)))
	must(t, err)
	t.Cleanup(func() { cuda.MemFree(p) })
	must(t, cuda.MemcpyHtoD(p, unsafe.Pointer(&h[0]), int64(2*len(h))))
	must(t, cuda.CtxSynchronize())
	return p, r
}

func f64(x []float32) []float64 {
	r := make([]float64, len(x))
	for i, v := range x {
		r[i] = float64(v)
	}
	return r
}

func TestLtLinearReLUBias(t *testing.T) {
	cudatest.RequireGPU(t)
	v, err := cuda.LtVersion()
	must(t, err)
	t.Logf("cuBLASLt %d", v)
	h, err := cuda.LtCreate()
	must(t, err)
	defer h.Destroy()
	const m, n, k = 67, 45, 93 // none a multiple of 8
	const wsSize = 32 << 20
	ws, err := cuda.MemAlloc(wsSize)
	must(t, err)
	defer cuda.MemFree(ws)
	r := newRand(t)

	cases := []struct {
		name    string
		dt      cuda.DataType
		compute cuda.ComputeType
		tol     float64
	}{
		{"f32", cuda.R32F, cuda.Compute32F, 1e-5},
		{"tf32", cuda.R32F, cuda.Compute32FFastTF32, 1e-3},
		{"bf16", cuda.R16BF, cuda.Compute32F, 1e-2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cudatest.RequireGPU(t) // a subtest runs on its own goroutine: pin it too
			x, w := randF32(r, m*k), randF32(r, n*k)
			b1, b2 := randF32(r, n), randF32(r, n)
			spec := cuda.GemmSpec{
				TransA: true, M: n, N: m, K: k, LDA: k, LDB: k, LDC: n, LDD: n,
				AType: c.dt, BType: c.dt, CType: c.dt, DType: c.dt,
				Compute: c.compute, Epilogue: cuda.EpilogueReLUBias,
			}
			var dx, dw, db1, db2 cuda.DevicePtr
			var rx, rw, rb1, rb2 []float64
			if c.dt == cuda.R16BF {
				dx, rx = devBF16(t, x)
				dw, rw = devBF16(t, w)
				db1, rb1 = devBF16(t, b1)
				db2, rb2 = devBF16(t, b2)
			} else {
				dx, dw, db1, db2 = devF32(t, x), devF32(t, w), devF32(t, b1), devF32(t, b2)
				rx, rw, rb1, rb2 = f64(x), f64(w), f64(b1), f64(b2)
			}
			dy, err := cuda.MemAlloc(int64(4 * m * n))
			must(t, err)
			defer cuda.MemFree(dy)
			read := func() []float32 {
				if c.dt != cuda.R16BF {
					return readF32(t, dy, m*n)
				}
				hb := make([]uint16, m*n)
				must(t, cuda.MemcpyDtoH(unsafe.Pointer(&hb[0]), dy, int64(2*m*n)))
				out := make([]float32, m*n)
				for i, v := range hb {
					out[i] = tensor.BF16ToF32(v)
				}
				return out
			}
			args := cuda.GemmArgs{A: dw, B: dx, D: dy, Bias: db1, Alpha: 1, Workspace: ws, WorkspaceSize: wsSize}
			must(t, h.Matmul(spec, args, 0))
			must(t, cuda.CtxSynchronize())
			if e := relErr(read(), linearRef(rx, rw, rb1, m, n, k)); !(e <= c.tol) {
				t.Fatalf("relative error %g > %g", e, c.tol)
			}
			// Same spec (cached plan), another bias buffer.
			args.Bias = db2
			must(t, h.Matmul(spec, args, 0))
			must(t, cuda.CtxSynchronize())
			want2 := linearRef(rx, rw, rb2, m, n, k)
			if e := relErr(read(), want2); !(e <= c.tol) {
				t.Fatalf("second bias: relative error %g > %g", e, c.tol)
			}
			// Every candidate the heuristic proposes computes the same thing.
			algos, err := h.Candidates(spec, 8)
			must(t, err)
			if len(algos) == 0 {
				t.Fatal("no candidates")
			}
			for i, a := range algos {
				must(t, cuda.MemsetD8(dy, 0, int64(4*m*n)))
				must(t, h.MatmulAlgo(spec, args, a, 0))
				must(t, cuda.CtxSynchronize())
				if e := relErr(read(), want2); !(e <= c.tol) {
					t.Fatalf("candidate %d (workspace %d): relative error %g", i, a.WorkspaceSize, e)
				}
			}
			must(t, h.SetAlgo(spec, algos[len(algos)-1]))
			must(t, cuda.MemsetD8(dy, 0, int64(4*m*n)))
			must(t, h.Matmul(spec, args, 0))
			must(t, cuda.CtxSynchronize())
			if e := relErr(read(), want2); !(e <= c.tol) {
				t.Fatalf("after SetAlgo: relative error %g", e)
			}
		})
	}
	// A missing bias is refused before cuBLASLt sees it.
	err = h.Matmul(cuda.GemmSpec{M: 8, N: 8, K: 8, Epilogue: cuda.EpilogueBias}, cuda.GemmArgs{A: 1, B: 1, D: 1}, 0)
	if !errors.Is(err, cuda.ErrBadGemm) {
		t.Fatalf("bias epilogue without Bias: %v", err)
	}
}
