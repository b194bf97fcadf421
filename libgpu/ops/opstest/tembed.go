package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "tembed", Check: checkTembed}) }

// RefTimestepEmbedding is guided-diffusion's timestep_embedding in float64:
// [cos(t·f_i) | sin(t·f_i)], f_i = maxPeriod^(−i/half).
func RefTimestepEmbedding(t []int32, d int, maxPeriod float64) []float64 {
	half := d / 2
	y := make([]float64, len(t)*d)
	for r, tv := range t {
		for i := 0; i < half; i++ {
			a := float64(tv) * math.Exp(-math.Log(maxPeriod)*float64(i)/float64(half))
			y[r*d+i] = math.Cos(a)
			y[r*d+half+i] = math.Sin(a)
		}
	}
	return y
}

func checkTembed(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, d := range []int{2, 10, 64, 128} {
			s.Run(fmt.Sprintf("%v/d=%d", dt, d), func(s *Suite) {
				ts := []int32{0, 1, 7, 250, 999, 500}
				t := UploadI32(s.T, s.A, ts, len(ts))
				y := s.Empty(dt, len(ts), d)
				s.NoErr("tembed", s.E.TimestepEmbedding(y, t, 10000))
				// The argument t·f rounds to f32 (as in PyTorch): up to
				// ~1e-4 absolute at t ≈ 1000; bf16 adds its own rounding.
				tol := 3e-4
				if dt == tensor.BF16 {
					tol = 1e-2
				}
				got, want := s.Read(y), RefTimestepEmbedding(ts, d, 10000)
				for i := range got {
					if math.Abs(got[i]-want[i]) > tol {
						s.T.Fatalf("element %d: %v, want %v (±%v)", i, got[i], want[i], tol)
					}
				}
				// Row 0 (t = 0) is exactly [1…1 | 0…0].
				for i := 0; i < d; i++ {
					if w := float64(map[bool]int{true: 1, false: 0}[i < d/2]); got[i] != w {
						s.T.Fatalf("t=0, element %d: %v, want %v", i, got[i], w)
					}
				}
			})
		}
	}
	s.Run("graph", func(s *Suite) {
		g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
		defer g.Free()
		t := g.Input("t", UploadI32(s.T, s.A, []int32{3, 4}, 2))
		y := g.TimestepEmbedding(t, 8, 10000)
		s.NoErr("build", g.Build(false))
		s.NoErr("forward", g.Forward())
		got, want := s.Read(y.Value), RefTimestepEmbedding([]int32{3, 4}, 8, 10000)
		// sin and cos are known to an absolute precision: terms of size 1.
		s.Close("graph tembed", got, want, Uniform(len(want), 1), 1e-5)
	})
	s.Run("validation", func(s *Suite) {
		t := UploadI32(s.T, s.A, []int32{1, 2}, 2)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"odd dimension", s.E.TimestepEmbedding(s.Empty(tensor.F32, 2, 5), t, 10000)},
			{"rows differ", s.E.TimestepEmbedding(s.Empty(tensor.F32, 3, 4), t, 10000)},
			{"f32 timesteps", s.E.TimestepEmbedding(s.Empty(tensor.F32, 2, 4), s.Empty(tensor.F32, 2), 10000)},
			{"max period 1", s.E.TimestepEmbedding(s.Empty(tensor.F32, 2, 4), t, 1)},
		} {
			if c.err == nil {
				s.T.Errorf("%s: accepted", c.what)
			}
		}
	})
}
