package ops_test

import (
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// TestCUDAMatmulStridedRowsSkinny: the product HRM's halting decides from
// (its q head: A = z_H[:, 0], B rows of H strided T·H apart in
// z_H [B, T, H]; Bᵀ = W [2, H]; a bias; D [B, 2]) on the GPU against the
// host backend at f32 and bf16, the rows of A distinct: the q head's
// product alone, a strided row view times a two-row weight. (Written when
// HRM's evaluation halted every sequence at its first segment on a GPU
// machine; it passed there, and nn's TestHRMGPUSegmentsMatchHost found the
// host engine halting the same way for that Q head.)
func TestCUDAMatmulStridedRowsSkinny(t *testing.T) {
	for _, c := range []struct {
		name string
		prec ops.Precision
		dt   tensor.DType
		tol  float64
	}{{"f32", ops.PrecF32, tensor.F32, 1e-5}, {"bf16", ops.PrecBF16, tensor.BF16, 1e-2}} {
		t.Run(c.name, func(t *testing.T) {
			w := newTwin(t, gpu(t), c.prec)
			const B, T, H = 64, 82, 512
			zg, zh := w.pair(c.dt, 1, B, T, H)
			wg, wh := w.pair(c.dt, 0.05, 2, H)
			bg, bh := w.pair(c.dt, 1, 2)
			dg, dh := w.empty(c.dt, B, 2)
			for _, s := range []struct {
				e       *ops.Engine
				z, q, b *tensor.Tensor
				d       *tensor.Tensor
			}{{w.g, zg, wg, bg, dg}, {w.h, zh, wh, bh, dh}} {
				a, err := s.z.Select(1, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.e.Matmul(ops.Matmul{A: a, B: s.q, D: s.d, TransB: true, Bias: s.b}); err != nil {
					t.Fatal(err)
				}
			}
			w.near("q = z[:, 0]·Wᵀ + b", dg, dh, c.tol)
		})
	}
}
