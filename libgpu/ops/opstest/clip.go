package opstest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ClipGradNormRef is torch.nn.utils.clip_grad_norm_ in float64: it scales
// every gs[i] in place by min(maxNorm/(n + ops.ClipEps), 1) and returns
// n = sqrt(Σ g²), the norm before clipping.
func ClipGradNormRef(gs [][]float64, maxNorm float64) float64 {
	ss := 0.0
	for _, g := range gs {
		for _, v := range g {
			ss += v * v
		}
	}
	n := math.Sqrt(ss)
	coef := math.Min(maxNorm/(n+ops.ClipEps), 1)
	for _, g := range gs {
		for j := range g {
			g[j] *= coef
		}
	}
	return n
}

// CheckClip runs Engine.ClipGradNorm on dev against ClipGradNormRef: more
// tensors than one multi-tensor launch takes (32), tensors spanning several
// 2048-element blocks, empty tensors, a max norm below the norm (clipping)
// and above it (coefficient 1), gradients poisoned with nothing but fresh
// random values each call; the result must also be bitwise the same when
// repeated. Then the validation errors. Relative error ≤ 1e-6 (f32 storage
// of a float64-accurate sum).
func CheckClip(t *testing.T, dev device.Device) {
	t.Helper()
	e, err := ops.NewEngine(dev, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := device.Local{Dev: dev}
	seed := rand.Uint64()
	t.Logf("clip seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	sizes := []int{0, 1, 2047, 2048, 2049, 7000}
	for len(sizes) < 41 {
		sizes = append(sizes, 1+r.IntN(3000))
	}
	gs := make([]*tensor.Tensor, len(sizes))
	vals := make([][]float32, len(sizes))
	for i, n := range sizes {
		gs[i] = Empty(t, a, tensor.F32, n)
	}
	norm := Empty(t, a, tensor.F32, 1)
	const tol = 1e-6
	for _, ratio := range []float64{0.1, 0.5, 2} {
		var first [][]float64
		for rep := 0; rep < 2; rep++ {
			if rep == 0 {
				for i, n := range sizes {
					vals[i] = Rand(r, n)
				}
			}
			var want [][]float64
			for i, g := range gs {
				if err := g.WriteF32(vals[i]); err != nil {
					t.Fatal(err)
				}
				want = append(want, F64(vals[i]))
			}
			var full [][]float64
			for _, w := range want {
				full = append(full, append([]float64(nil), w...))
			}
			n0 := ClipGradNormRef(full, 1)
			maxNorm := ratio * n0
			wantNorm := ClipGradNormRef(want, float64(float32(maxNorm)))
			if err := e.ClipGradNorm(gs, float32(maxNorm), norm); err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("max norm %.3g×norm", ratio)
			if got := Download(t, norm)[0]; math.Abs(got-wantNorm) > tol*wantNorm {
				t.Errorf("%s: norm %v, want %v", what, got, wantNorm)
			}
			var got [][]float64
			for i, g := range gs {
				d := Download(t, g)
				Close(t, fmt.Sprintf("%s: grads[%d] (%d elements)", what, i, sizes[i]), d, want[i], nil, tol)
				got = append(got, d)
			}
			if rep == 0 {
				first = got
			} else {
				for i := range got {
					for j := range got[i] {
						if got[i][j] != first[i][j] {
							t.Fatalf("%s: grads[%d] differs between two identical calls", what, i)
						}
					}
				}
			}
		}
	}
	// Validation.
	i32 := Empty(t, a, tensor.I32, 4)
	for _, c := range []struct {
		what  string
		err   error
		grads []*tensor.Tensor
		max   float32
		norm  *tensor.Tensor
	}{
		{"zero max norm", ops.ErrConfig, gs, 0, norm},
		{"NaN max norm", ops.ErrConfig, gs, float32(math.NaN()), norm},
		{"infinite max norm", ops.ErrConfig, gs, float32(math.Inf(1)), norm},
		{"no grads", ops.ErrConfig, nil, 1, norm},
		{"nil grad", tensor.ErrShape, []*tensor.Tensor{gs[1], nil}, 1, norm},
		{"i32 grad", tensor.ErrDType, []*tensor.Tensor{i32}, 1, norm},
		{"nil norm", tensor.ErrShape, gs, 1, nil},
		{"norm of 2", tensor.ErrShape, gs, 1, Empty(t, a, tensor.F32, 2)},
	} {
		if err := e.ClipGradNorm(c.grads, c.max, c.norm); !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.what, err, c.err)
		}
	}
}
