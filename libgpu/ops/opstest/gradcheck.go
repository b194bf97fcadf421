package opstest

import (
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// GradCase describes a check of what a Graph method records: its forward
// against a float64 reference and its backward against central finite
// differences of that reference.
type GradCase struct {
	Name  string
	DType tensor.DType // dtype of the inputs, and the graph's autocast dtype
	// Params are the shapes of the differentiable inputs, drawn from
	// N(0, Scale²) (Scale 0: 1), or taken from Init when it gives values.
	Params [][]int
	// PDTypes, where given and not 0, override DType for the param of the
	// same index (f32 master parameters of a bf16 op: norm weights).
	PDTypes []tensor.DType
	Scale   float64
	Init    func(i int, n int) []float64
	// Consts are inputs without gradients (indices, labels), passed to
	// Record as Inputs.
	Consts []*tensor.Tensor
	// Record records the op on g and returns its output.
	Record func(g *ops.Graph, p, c []*ops.Var) *ops.Var
	// Ref is the float64 reference of the output, row-major.
	Ref func(p [][]float64) []float64
	// TolF and TolB bound the relative error of the output and of the
	// gradients (0: Tol(DType) for the output, 10× that for gradients,
	// which carry the finite difference's error too). H is the finite
	// difference step (0: 1e-3, relative to max(1, |x|)).
	TolF, TolB, H float64
	// Twice records the op twice on the same inputs with independent
	// upstream gradients: every input gradient must be the sum of both
	// (fan-out accumulation).
	Twice bool
	// Options are the graph's options (Train, Seed, Counter); Autocast is
	// set to DType.
	Options ops.GraphOptions
}

// GradCheck runs c: forward with the output poisoned first, a loss
// L = Σ w·y (w random, the upstream gradient), the backward, and each
// input's gradient against FDGrad of the reference.
func (s *Suite) GradCheck(c GradCase) {
	s.T.Helper()
	tolF, tolB, h := c.TolF, c.TolB, c.H
	if tolF == 0 {
		tolF = s.Tol(c.DType)
	}
	if tolB == 0 {
		tolB = 10 * tolF
	}
	if h == 0 {
		h = 1e-3
	}
	scale := c.Scale
	if scale == 0 {
		scale = 1
	}
	opts := c.Options
	opts.Autocast = c.DType
	g := ops.NewGraph(s.E, s.A, "", opts)
	defer g.Free()
	vals := make([][]float64, len(c.Params))
	pv := make([]*ops.Var, len(c.Params))
	for i, shape := range c.Params {
		dt := c.DType
		if i < len(c.PDTypes) && c.PDTypes[i] != 0 {
			dt = c.PDTypes[i]
		}
		var t *tensor.Tensor
		if c.Init != nil {
			if v := c.Init(i, tensor.Numel(shape)); v != nil {
				t, vals[i] = s.Const(dt, v, shape...), nil
				got, err := t.ReadFloat32()
				s.NoErr("read init", err)
				vals[i] = F64(got)
			}
		}
		if t == nil {
			t, vals[i] = s.Rand(dt, scale, shape...)
		}
		grad := s.Empty(dt, shape...)
		pv[i] = g.Param(fmt.Sprintf("p%d", i), t, grad)
	}
	cv := make([]*ops.Var, len(c.Consts))
	for i, t := range c.Consts {
		cv[i] = g.Input(fmt.Sprintf("c%d", i), t)
	}
	runs := 1
	if c.Twice {
		runs = 2
	}
	var ys []*ops.Var
	var ws [][]float64
	for r := 0; r < runs; r++ {
		y := c.Record(g, pv, cv)
		if y == nil {
			s.T.Fatalf("%s: record: %v", c.Name, g.Err())
		}
		ys = append(ys, y)
		ws = append(ws, nil)
		r := r
		DotLoss(s, g, y, func(w []float64) { ws[r] = w })
	}
	s.NoErr(c.Name+": build", g.Build(true))
	for _, y := range ys {
		s.NoErr("poison", Poison(y.Value))
	}
	s.NoErr(c.Name+": forward", g.Forward())
	want := c.Ref(vals)
	for _, y := range ys {
		s.Close(c.Name+" forward", s.Read(y.Value), want, nil, tolF)
	}
	s.NoErr(c.Name+": backward", g.Backward())
	for i := range c.Params {
		if pv[i].Grad == nil {
			s.T.Errorf("%s: input %d got no gradient", c.Name, i)
			continue
		}
		got := s.Read(pv[i].Grad)
		fd, terms := make([]float64, len(vals[i])), make([]float64, len(vals[i]))
		for r := range ys {
			w := ws[r]
			gi, ti := FDGradTerms(func(x []float64) []float64 {
				old := vals[i]
				vals[i] = x
				defer func() { vals[i] = old }()
				return c.Ref(vals)
			}, append([]float64(nil), vals[i]...), w, h)
			for j := range fd {
				fd[j] += gi[j]
				terms[j] += ti[j]
			}
		}
		s.Close(fmt.Sprintf("%s gradient of input %d", c.Name, i), got, fd, terms, tolB)
	}
}

// DotLoss records, for tests, a loss node L = Σ w·y with w drawn from N(0,1)
// (rounded to y's dtype) when the forward runs; its forward writes the
// upstream gradient dy = w and reports w through seen. It synchronises
// the engine and copies through the host: a test helper, not for
// captured graphs.
func DotLoss(s *Suite, g *ops.Graph, y *ops.Var, seen func(w []float64)) *ops.Var {
	loss := g.NewOut("dotloss", tensor.F32, 1)
	if loss == nil {
		return nil
	}
	e := g.Engine()
	w := s.Weights(y.Value.Numel())
	g.RecordLoss("dotloss", []*ops.Var{y}, loss, func(gr *ops.Grads) error {
		if err := e.Sync(); err != nil {
			return err
		}
		yv, err := y.Value.ReadFloat32()
		if err != nil {
			return err
		}
		if dy := gr.In(0); dy != nil {
			if err := dy.WriteFloat32(F32(w)); err != nil {
				return err
			}
			back, err := dy.ReadFloat32()
			if err != nil {
				return err
			}
			w = F64(back)
		}
		var l float64
		for i := range yv {
			l += w[i] * float64(yv[i])
		}
		seen(w)
		return loss.Value.WriteFloat32([]float32{float32(l)})
	})
	return loss
}
