package optim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
)

// The GPU-against-host check of SOAP (TestCUDASOAPMatchesHost) compares
// two independent eigensolvers (cuSOLVER in f32, gonum in float64), so it
// needs a problem whose eigenbases are unique at every refresh, and an
// update that depends smoothly on them. Gradients of random blocks are a
// poor one: the first basis comes from one gradient's statistics G·Gᵀ,
// singular for a wide block (its null-space basis is arbitrary, and the
// two solvers pick different ones, which SOAP then keeps in its second
// moment V across refreshes) and, for a square Gaussian block, with
// eigenvalues crowded near 0. Here every block is square and its step-1
// gradient is 16·U·diag(d)·Vᵀ (U, V random orthogonal, d_i = √(1+i)):
// the statistics' eigenvalues are ∝ 1, 2, …, 16 at the first refresh and
// stay about as far apart at the later ones (the step-1 term dominates
// the dense Gaussian gradients of later steps, which SOAP rotates into
// the basis: dense there, so Adam's division by √V meets no entries of
// pure rounding noise). SOAP's first update is M'/(√V + ε) with V = (1−β2)·M'²:
// the sign of each rotated entry for ε → 0, discontinuous where an entry is
// near 0 (one sign flipped by TF32 rounding moved the run's update by
// 0.03–0.05 in a float64 emulation); ε = 0.03 (√V is about 0.2 here)
// makes it smooth, and the emulated error then grows linearly with the
// perturbation (statistics perturbed by 5e-4 of their norm: 2.5e-3).
// TestSOAPSeparatedProblem checks, in float64, that the eigenvalue gaps
// stay wide at every refresh and that a wrong basis orientation (Q in
// place of Qᵀ) moves the update far beyond the GPU check's tolerance.

// soapSepShapes: a matrix of two 16×16 blocks, a 16×16 one (the three
// blocks share a class of order 16) and a bias (AdamW).
var soapSepShapes = [][]int{{32, 16}, {16, 16}, {16}}

const soapSepSteps = 5

// soapSepScale multiplies the step-1 gradient; soapSepEps is SOAP's ε.
const (
	soapSepScale         = 16
	soapSepEps   float32 = 0.03
)

func soapSepConfig() optim.SOAPConfig {
	c := optim.DefaultSOAP
	c.MaxBlock, c.UpdateFreq, c.LR = 16, 2, 0.01 // refreshes at steps 1, 3, 5
	c.Eps = soapSepEps
	return c
}

// soapSepGrads are the gradients of steps 1..soapSepSteps (rounded to
// f32): see above.
func soapSepGrads(seed uint64) [][][]float64 {
	r := rand.New(rand.NewPCG(seed, 41))
	const b = 16
	first := make([][]float64, len(soapSepShapes))
	for i, sh := range soapSepShapes {
		if len(sh) != 2 {
			first[i] = draws(r, 1, [][]int{sh})[0]
			continue
		}
		first[i] = make([]float64, sh[0]*sh[1])
		for r0 := 0; r0 < sh[0]; r0 += b {
			u, v := opstest.RandOrth(r, b), opstest.RandOrth(r, b)
			for x := 0; x < b; x++ {
				for y := 0; y < b; y++ {
					var s float64
					for k := 0; k < b; k++ {
						s += u[x*b+k] * soapSepScale * math.Sqrt(float64(1+k)) * v[y*b+k]
					}
					first[i][(r0+x)*sh[1]+y] = s
				}
			}
		}
	}
	gs := [][][]float64{roundF32(first)}
	for s := 2; s <= soapSepSteps; s++ {
		gs = append(gs, roundF32(draws(r, 1, soapSepShapes)))
	}
	return gs
}

// updateErr is ‖got − want‖/‖want − start‖ over all parameters: an error
// relative to the run's update.
func updateErr(got, want, start [][]float64) float64 {
	var num, den float64
	for i := range want {
		for k := range want[i] {
			d, u := got[i][k]-want[i][k], want[i][k]-start[i][k]
			num += d * d
			den += u * u
		}
	}
	return math.Sqrt(num / den)
}

// soapSepRef runs the float64 reference on the separated problem, with
// the first bases it decomposes itself (transposed when flip is set: the
// bug a GPU check must catch; the later refreshes, power iteration from
// them, inherit it), and returns the start and final parameters and
// the smallest eigenvalue gap, relative to the largest eigenvalue, of any
// block's statistics at any refresh.
func soapSepRef(seed uint64, flip bool) (start, w [][]float64, gap float64) {
	cfg := soapSepConfig()
	cfg.ShampooBeta = cfg.Beta2
	start = roundF32(draws(rand.New(rand.NewPCG(seed, 42)), 1, soapSepShapes))
	w = roundF32(start)
	ref := newRefSOAP(cfg, soapSepShapes, nil)
	gap = math.Inf(1)
	ref.stats = func(l, rs []float64, rr, rc int) {
		for _, m := range []struct {
			s []float64
			n int
		}{{l, rr}, {rs, rc}} {
			ev, _ := opstest.RefEigh(m.s, m.n)
			for i := 1; i < m.n; i++ {
				gap = math.Min(gap, (ev[i]-ev[i-1])/ev[m.n-1])
			}
		}
	}
	ref.basis = func(_, _ int, l, rs []float64, rr, rc int) ([]float64, []float64) {
		var qs [2][]float64
		for k, m := range []struct {
			s []float64
			n int
		}{{l, rr}, {rs, rc}} {
			q := eigRows(m.s, m.n)
			if flip {
				q = transpose(q, m.n)
			}
			qs[k] = q
		}
		return qs[0], qs[1]
	}
	for _, g := range soapSepGrads(seed) {
		ref.step(w, g)
	}
	return start, w, gap
}

func transpose(q []float64, n int) []float64 {
	t := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			t[j*n+i] = q[i*n+j]
		}
	}
	return t
}

// TestSOAPSeparatedProblem: the problem of TestCUDASOAPMatchesHost is
// well posed — every refresh's statistics have eigenvalue gaps of at least
// 1% of the largest eigenvalue (perturbations of the statistics of relative
// size ε, TF32's 5e-4 say, turn the basis by about ε/gap) — and the
// check has power: first bases used transposed change the run's update by
// more than ten times the check's largest tolerance (5e-2; 0.55 with the
// power-iteration refreshes, 0.6 with a decomposition at every refresh). The host's SOAP
// matches the float64 reference on it.
func TestSOAPSeparatedProblem(t *testing.T) {
	const seed = 1
	start, want, gap := soapSepRef(seed, false)
	_, flipped, _ := soapSepRef(seed, true)
	t.Logf("smallest relative eigenvalue gap %.3g; transposed bases change the update by %.3g", gap, updateErr(flipped, want, start))
	if !(gap >= 1e-2) {
		t.Errorf("smallest relative eigenvalue gap %.3g < 1e-2: eigenbases not well determined", gap)
	}
	if e := updateErr(flipped, want, start); !(e > 0.5) {
		t.Errorf("transposed bases change the update by only %.3g", e)
	}
	got := runSOAPSep(t, hostProblem(t, soapSepShapes...), seed)
	if e := updateErr(got, want, start); !(e < 1e-4) {
		t.Errorf("host SOAP vs the float64 reference: error %.3g of the update", e)
	}
}

// runSOAPSep runs SOAP on p over the separated problem and returns the
// parameters; it fails if a basis refresh failed.
func runSOAPSep(t *testing.T, p *problem, seed uint64) [][]float64 {
	t.Helper()
	p.set(roundF32(draws(rand.New(rand.NewPCG(seed, 42)), 1, soapSepShapes)))
	o, err := optim.NewSOAP(p.a, "run", p.params, soapSepConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	for _, g := range soapSepGrads(seed) {
		p.grads(g)
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
	}
	v := p.values()
	if st := o.RootStats(); st.Failures != 0 || st.Refreshes != 3 {
		t.Errorf("basis refreshes %+v, want 3 and no failures", st)
	}
	return v
}
