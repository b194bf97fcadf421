package optim_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// problem is a set of parameters on one allocator with host copies of
// their values, and gradients the test writes each step.
type problem struct {
	t      testing.TB
	e      *ops.Engine
	a      device.Allocator
	params []nn.Param
	shapes [][]int
}

func hostProblem(t testing.TB, shapes ...[]int) *problem {
	t.Helper()
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return newProblem(t, e, device.Local{Dev: h}, shapes...)
}

func newProblem(t testing.TB, e *ops.Engine, a device.Allocator, shapes ...[]int) *problem {
	t.Helper()
	p := &problem{t: t, e: e, a: a, shapes: shapes}
	for i, sh := range shapes {
		name := fmt.Sprintf("layer%d.weight", i)
		if len(sh) == 1 {
			name = fmt.Sprintf("layer%d.bias", i)
		}
		v := opstest.Empty(t, a, tensor.F32, sh...)
		g := opstest.Empty(t, a, tensor.F32, sh...)
		p.params = append(p.params, nn.Param{Name: name, Value: v, Grad: g})
	}
	return p
}

// set writes values (float64, rounded to f32) into the parameters.
func (p *problem) set(vals [][]float64) {
	p.t.Helper()
	for i, v := range vals {
		if err := p.params[i].Value.WriteFloat32(tensor.Float32sOf(v)); err != nil {
			p.t.Fatal(err)
		}
	}
}

// grads writes gradients.
func (p *problem) grads(gs [][]float64) {
	p.t.Helper()
	if err := p.e.Sync(); err != nil {
		p.t.Fatal(err)
	}
	for i, g := range gs {
		if err := p.params[i].Grad.WriteFloat32(tensor.Float32sOf(g)); err != nil {
			p.t.Fatal(err)
		}
	}
}

// names lists the parameters' names, in order.
func (p *problem) names() []string {
	out := make([]string, len(p.params))
	for i, q := range p.params {
		out[i] = q.Name
	}
	return out
}

// values reads the parameters as float64.
func (p *problem) values() [][]float64 {
	p.t.Helper()
	if err := p.e.Sync(); err != nil {
		p.t.Fatal(err)
	}
	out := make([][]float64, len(p.params))
	for i, q := range p.params {
		v, err := q.Value.ReadFloat32()
		if err != nil {
			p.t.Fatal(err)
		}
		out[i] = opstest.F64(v)
	}
	return out
}

// draws returns one N(0, scale²) slice per shape.
func draws(r *rand.Rand, scale float64, shapes [][]int) [][]float64 {
	out := make([][]float64, len(shapes))
	for i, sh := range shapes {
		out[i] = make([]float64, tensor.Numel(sh))
		for j := range out[i] {
			out[i][j] = scale * r.NormFloat64()
		}
	}
	return out
}

// roundF32 rounds every value to f32, as the device stores it.
func roundF32(vs [][]float64) [][]float64 {
	out := make([][]float64, len(vs))
	for i, v := range vs {
		out[i] = opstest.F64(tensor.Float32sOf(v))
	}
	return out
}

// stateBytes reads every state tensor's bytes.
func stateBytes(t testing.TB, e *ops.Engine, o optim.Optimizer) map[string][]byte {
	t.Helper()
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, s := range o.State() {
		b, err := s.Value.Read()
		if err != nil {
			t.Fatal(err)
		}
		out[s.Name] = b
	}
	return out
}

// loadState writes saved state into o's tensors (a checkpoint load).
func loadState(t testing.TB, o optim.Optimizer, saved map[string][]byte) {
	t.Helper()
	for _, s := range o.State() {
		b, ok := saved[s.Name]
		if !ok {
			t.Fatalf("state %q not saved", s.Name)
		}
		if err := s.Value.Write(b); err != nil {
			t.Fatal(err)
		}
	}
}

// symRoot is (s + rI)^(−1/p) for a symmetric s in float64, negative
// eigenvalues clamped to 0.
func symRoot(s []float64, n, p int, r float64) []float64 {
	return opstest.RefInverseRoot(s, n, p, r)
}

// frob is the Frobenius norm.
func frob(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// mul is the n×k by k×m product (row-major, float64); ta/tb transpose the
// stored operands (a stored k×n, b stored m×k).
func mul(a, b []float64, n, m, k int, ta, tb bool) []float64 {
	return opstest.RefMatmul(a, b, n, m, k, ta, tb)
}

// relErr is the relative error of got against want over all parameters.
func relErr(got, want [][]float64) float64 {
	var g, w []float64
	for i := range got {
		g = append(g, got[i]...)
		w = append(w, want[i]...)
	}
	return opstest.TermsErr(g, w, nil)
}

var _ = mat.NewDense

// maker builds an optimizer for a problem's parameters.
type maker func(t testing.TB, p *problem) optim.Optimizer

// runSteps runs steps optimizer steps from seeded parameters and
// gradients and returns the parameters.
func runSteps(t *testing.T, shapes [][]int, seed uint64, steps int, mk maker) [][]float64 {
	t.Helper()
	p := hostProblem(t, shapes...)
	r := rand.New(rand.NewPCG(seed, 1))
	p.set(draws(r, 1, shapes))
	o := mk(t, p)
	defer o.Free()
	for i := 0; i < steps; i++ {
		p.grads(draws(r, 1, shapes))
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
	}
	return p.values()
}

// sameBits fails unless a and b are bitwise equal.
func sameBits(t *testing.T, what string, a, b [][]float64) {
	t.Helper()
	for i := range a {
		for k := range a[i] {
			if math.Float64bits(a[i][k]) != math.Float64bits(b[i][k]) {
				t.Fatalf("%s: param %d [%d]: %v and %v", what, i, k, a[i][k], b[i][k])
			}
		}
	}
}

// checkResume: a run stopped after any step and resumed from its state (a
// new optimizer with the saved state written into it, as a checkpoint
// load does) continues bitwise as the uninterrupted run.
func checkResume(t *testing.T, shapes [][]int, steps int, mk maker) {
	t.Helper()
	r := rand.New(rand.NewPCG(9, 10))
	w0 := draws(r, 1, shapes)
	var gs [][][]float64
	for i := 0; i < steps; i++ {
		gs = append(gs, draws(r, 1, shapes))
	}
	run := func(stop int) [][]float64 {
		p := hostProblem(t, shapes...)
		p.set(w0)
		o := mk(t, p)
		for i := 0; i < steps; i++ {
			if i == stop {
				saved := stateBytes(t, p.e, o)
				o.Free()
				o = mk(t, p)
				loadState(t, o, saved)
			}
			p.grads(gs[i])
			if err := o.Step(p.e); err != nil {
				t.Fatal(err)
			}
		}
		o.Free()
		return p.values()
	}
	want := run(-1)
	for stop := 1; stop < steps; stop++ {
		sameBits(t, fmt.Sprintf("resumed after step %d", stop), run(stop), want)
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 99)) }
