package optim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
)

// quadratic is f(W) = ½‖A·(W − W*)·B‖_F² for SPD A (m×m) and B (n×n)
// with eigenvalues log-spaced over [1/cond, 1] in random bases: an
// ill-conditioned convex quadratic whose Hessian, (B·Bᵀ) ⊗ (Aᵀ·A), is a
// Kronecker product not aligned with the coordinates.
type quadratic struct {
	m, n     int
	a, b, ws []float64
}

func newQuadratic(r *rand.Rand, m, n int, cond float64) *quadratic {
	return &quadratic{m: m, n: n, a: opstest.RandSPD(r, m, cond, 1), b: opstest.RandSPD(r, n, cond, 1),
		ws: draws(r, 1, [][]int{{m, n}})[0]}
}

// value and gradient at w: ∇ = Aᵀ·A·E·B·Bᵀ, E = W − W*.
func (q *quadratic) eval(w []float64) (float64, []float64) {
	e := make([]float64, len(w))
	for i := range w {
		e[i] = w[i] - q.ws[i]
	}
	aeb := mul(mul(q.a, e, q.m, q.n, q.m, false, false), q.b, q.m, q.n, q.n, false, false)
	f := 0.5 * frob(aeb) * frob(aeb)
	g := mul(mul(q.a, aeb, q.m, q.n, q.m, true, false), q.b, q.m, q.n, q.n, false, true)
	return f, g
}

// stepsTo runs o from W = 0 until f ≤ tol·f(0) and returns the steps taken
// (max+1 when it never gets there, or diverges).
func stepsTo(t *testing.T, q *quadratic, mk func(p []nn.Param, a *problem) (optim.Optimizer, error), tol float64, maxSteps int) int {
	p := hostProblem(t, []int{q.m, q.n})
	w := make([]float64, q.m*q.n)
	p.set([][]float64{w})
	o, err := mk(p.params, p)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	f0, _ := q.eval(w)
	for s := 1; s <= maxSteps; s++ {
		w = p.values()[0]
		f, g := q.eval(w)
		if f <= tol*f0 {
			return s - 1
		}
		if math.IsNaN(f) || f > 1e6*f0 {
			return maxSteps + 1
		}
		p.grads([][]float64{g})
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
	}
	return maxSteps + 1
}

// best is the fewest steps over a learning-rate grid.
func best(t *testing.T, q *quadratic, lrs []float32, mk func(lr float32) func(p []nn.Param, a *problem) (optim.Optimizer, error), tol float64, maxSteps int) (int, float32) {
	bs, blr := maxSteps+1, float32(0)
	for _, lr := range lrs {
		if s := stepsTo(t, q, mk(lr), tol, maxSteps); s < bs {
			bs, blr = s, lr
		}
	}
	return bs, blr
}

// TestShampooBeatsAdamWOnQuadratic: on an ill-conditioned convex quadratic
// (condition number 10⁴, Kronecker-structured in a random basis), Shampoo
// reaches f ≤ 10⁻⁴·f(0) in fewer steps than AdamW, each at its best
// learning rate of one grid.
func TestShampooBeatsAdamWOnQuadratic(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	q := newQuadratic(r, 12, 8, 100)
	const tol, maxSteps = 1e-4, 3000
	lrs := []float32{1e-2, 3e-2, 0.1, 0.3, 1, 3}
	adam, alr := best(t, q, lrs, func(lr float32) func([]nn.Param, *problem) (optim.Optimizer, error) {
		return func(ps []nn.Param, p *problem) (optim.Optimizer, error) {
			return optim.NewAdamW(p.a, "adamw", ps, ops.AdamWConfig{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
		}
	}, tol, maxSteps)
	sh, slr := best(t, q, lrs, func(lr float32) func([]nn.Param, *problem) (optim.Optimizer, error) {
		return func(ps []nn.Param, p *problem) (optim.Optimizer, error) {
			c := optim.DefaultShampoo
			c.LR, c.UpdateFreq = lr, 1
			return optim.NewShampoo(p.a, "shampoo", ps, c)
		}
	}, tol, maxSteps)
	t.Logf("steps to f ≤ %g·f(0): AdamW %d (lr %g), Shampoo %d (lr %g)", tol, adam, alr, sh, slr)
	if !(sh < adam) {
		t.Errorf("Shampoo took %d steps, AdamW %d", sh, adam)
	}
}
