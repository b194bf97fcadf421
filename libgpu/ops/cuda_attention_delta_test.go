package ops_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestCUDAAttentionDelta: attention's δ kernel alone (both instances: the
// 16-byte one where D/V is a power of two, the warp-per-row one
// otherwise) against float64 sums of dO·O, on contiguous [B,T,H,D] tensors
// and on a head slice of a fused [B,T,3,H,D] tensor, outputs poisoned.
func TestCUDAAttentionDelta(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		b, t, h, d int
		dt         tensor.DType
		fused      bool
	}{
		{64, 256, 6, 64, tensor.BF16, false}, {3, 37, 5, 64, tensor.BF16, true}, {2, 33, 3, 128, tensor.F32, false},
		{2, 19, 4, 128, tensor.BF16, true}, {2, 21, 3, 24, tensor.BF16, false}, {1, 9, 2, 8, tensor.F32, true},
	} {
		t.Run(fmt.Sprintf("%v/B%d,T%d,H%d,D%d/fused=%v", c.dt, c.b, c.t, c.h, c.d, c.fused), func(t *testing.T) {
			mk := func() *tensor.Tensor {
				if !c.fused {
					return benchRand(t, e, r, c.dt, 1, 0, c.b, c.t, c.h, c.d)
				}
				w := benchRand(t, e, r, c.dt, 1, 0, c.b, c.t, 3, c.h, c.d)
				v, err := w.Select(2, 1)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			o, do := mk(), mk()
			delta := benchEmpty(t, e, tensor.F32, c.b, c.h, c.t)
			if err := ops.CUDAAttentionDelta(e, delta, o, do); err != nil {
				t.Fatal(err)
			}
			got := opstest.F64(lnRead(t, e, delta))
			ov, dov := opstest.F64(lnRead(t, e, o)), opstest.F64(lnRead(t, e, do))
			want := make([]float64, len(got))
			for b := 0; b < c.b; b++ {
				for i := 0; i < c.t; i++ {
					for h := 0; h < c.h; h++ {
						row := ((b*c.t+i)*c.h + h) * c.d
						var s float64
						for k := 0; k < c.d; k++ {
							s += ov[row+k] * dov[row+k]
						}
						want[(b*c.h+h)*c.t+i] = s
					}
				}
			}
			if err := opstest.TermsErr(got, want, nil); !(err <= 1e-5) {
				t.Errorf("delta: relative error %.3g", err)
			}
		})
	}
}

// BenchmarkCUDAAttentionDelta times attention's δ = rowsum(dO∘O) alone at
// the GPT's (B, H, T, D) = (64, 6, 256, 64) bf16: o and dO contiguous
// [B,T,H,D] (25.2 MB read), δ f32 [B,H,T] written. Predicted on an H100:
// 9 µs (the byte floor at 3 TB/s: 8.5 µs); before: 29 µs (0.9 TB/s).
func BenchmarkCUDAAttentionDelta(b *testing.B) {
	d := gpu(b)
	e := cudaEngine(b, d, ops.PrecTF32)
	const B, H, T, D = 64, 6, 256, 64
	r := rand.New(rand.NewPCG(1, 2))
	bytes := int64(2*B*T*H*D*2 + B*H*T*4)
	var fns []func() error
	for i := 0; i < benchSets(bytes); i++ {
		o := benchRand(b, e, r, tensor.BF16, 1, 0, B, T, H, D)
		do := benchRand(b, e, r, tensor.BF16, 1, 0, B, T, H, D)
		delta := benchEmpty(b, e, tensor.F32, B, H, T)
		fns = append(fns, func() error { return ops.CUDAAttentionDelta(e, delta, o, do) })
	}
	b.Run(fmt.Sprintf("B%d,H%d,T%d,D%d/bf16", B, H, T, D), func(b *testing.B) { benchGraph(b, e, fns, bytes) })
}
