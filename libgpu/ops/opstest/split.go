package opstest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// adamwSplit checks that AdamWAdvance followed by AdamWApply per parameter,
// in reverse order and inside Side (a side stream on GPUs) with main-stream
// work between the groups, gives bitwise the parameters, moments and step
// counter of one AdamW call, over a few steps from a resumed counter; and
// that ops needing backend scratch are refused inside Side (ErrSide) on
// backends with a side stream.
func (s *suite) adamwSplit(t *testing.T) {
	cfg := ops.AdamWConfig{LR: 3e-2, Beta1: 0.8, Beta2: 0.95, Eps: 1e-6, WeightDecay: 0.1}
	type set struct{ ps, gs, ms, vs []*tensor.Tensor }
	var a, b set
	for _, sh := range paramShapes {
		p, pf := s.rnd(t, sh...)
		g, gf := s.rnd(t, sh...)
		m, mf := s.rnd(t, sh...)
		v, vf := s.rnd(t, sh...)
		for i := range vf {
			vf[i] *= vf[i]
		}
		if err := v.WriteF32(F32(vf)); err != nil {
			t.Fatal(err)
		}
		a.ps, a.gs, a.ms, a.vs = append(a.ps, p), append(a.gs, g), append(a.ms, m), append(a.vs, v)
		b.ps = append(b.ps, Upload(t, s.a, F32(pf), sh...))
		b.gs = append(b.gs, Upload(t, s.a, F32(gf), sh...))
		b.ms = append(b.ms, Upload(t, s.a, F32(mf), sh...))
		b.vs = append(b.vs, Upload(t, s.a, F32(vf), sh...))
	}
	sa, sb := UploadI32(t, s.a, []int32{7}, 1), UploadI32(t, s.a, []int32{7}, 1)
	scratch := Empty(t, s.a, tensor.F32, 64, 64)
	for k := 1; k <= 3; k++ {
		if err := s.e.AdamW(a.ps, a.gs, a.ms, a.vs, sa, cfg); err != nil {
			t.Fatal(err)
		}
		if err := s.e.AdamWAdvance(sb, cfg); err != nil {
			t.Fatal(err)
		}
		for i := len(b.ps) - 1; i >= 0; i-- {
			err := s.e.Side(func() error {
				return s.e.AdamWApply(b.ps[i:i+1], b.gs[i:i+1], b.ms[i:i+1], b.vs[i:i+1], sb, cfg)
			})
			if err != nil {
				t.Fatalf("step %d, param %d: %v", k, i, err)
			}
			if err := s.e.Fill(scratch, float64(i)); err != nil { // main-stream work meanwhile
				t.Fatal(err)
			}
		}
		if err := s.e.Join(); err != nil {
			t.Fatal(err)
		}
		for i := range a.ps {
			for j, pair := range [][2]*tensor.Tensor{{a.ps[i], b.ps[i]}, {a.ms[i], b.ms[i]}, {a.vs[i], b.vs[i]}} {
				x, err := pair[0].Read()
				if err != nil {
					t.Fatal(err)
				}
				y, err := pair[1].Read()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(x, y) {
					t.Fatalf("step %d: tensor %d of param %d differs between AdamW and the split update", k, j, i)
				}
			}
		}
		if x, y := DownloadI32(t, sa)[0], DownloadI32(t, sb)[0]; x != 7+int32(k) || y != x {
			t.Fatalf("step %d: counters %d (AdamW) and %d (split), want %d", k, x, y, 7+k)
		}
	}
	if !s.e.HasSide() {
		return
	}
	x, w, y := Empty(t, s.a, tensor.F32, 4, 3), Empty(t, s.a, tensor.F32, 5, 3), Empty(t, s.a, tensor.F32, 4, 5)
	for name, op := range map[string]func() error{
		"Linear":       func() error { return s.e.Linear(y, x, w, nil, nil, ops.ActNone) },
		"AdamW":        func() error { return s.e.AdamW(b.ps, b.gs, b.ms, b.vs, sb, cfg) },
		"AdamWAdvance": func() error { return s.e.AdamWAdvance(sb, cfg) },
		"Side":         func() error { return s.e.Side(func() error { return nil }) },
	} {
		if err := s.e.Side(op); !errors.Is(err, ops.ErrSide) {
			t.Errorf("%s inside Side: error %v, want ErrSide", name, err)
		}
	}
	if err := s.e.Join(); err != nil {
		t.Fatal(fmt.Errorf("join after refused ops: %w", err))
	}
	if got := DownloadI32(t, sb)[0]; got != 10 {
		t.Fatalf("refused ops moved the step counter to %d", got)
	}
}
