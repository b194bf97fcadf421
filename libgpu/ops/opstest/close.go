package opstest

import (
	"math"
	"testing"
)

// Every check of this package compares a result with its float64 reference
// one way: TermsErr, the error relative to the size of the terms summed.
//
// A result computed in floating point carries rounding errors bounded by a
// multiple of the magnitudes it sums — Σ|aₖ·bₖ| for a dot product, Σ|xₖ|
// for a reduction, |a| + |b| for a difference — not by the result itself
// (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1: the
// forward error of a rounded sum is bounded by γₙ·Σ|xₖ|). Near a
// cancellation the result is tiny and its error is not, so an error
// relative to |want| fails one seed in a few hundred (Shampoo's momentum,
// an EMA, SOAP's preparation, GELU's backward and a TF32 LinearBackwardChain
// did, on CI and on a GPU). Comparing with the terms' size cannot fail by
// chance: the bound holds for every input.

// TermsErr is ‖got − want‖₂ / ‖terms‖₂: terms[i] is the size of what
// element i of the reference sums (the float64 reference evaluated on the
// magnitudes of its terms; TermsOf and Sum build it), at least |want[i]|.
// A nil terms means |want| (an element computed without a sum: a copy, an
// element-wise map), which makes TermsErr the plain relative error. With
// ‖terms‖ = 0 the error is absolute. A length mismatch or a NaN gives +Inf.
func TermsErr(got, want, terms []float64) float64 {
	if len(got) != len(want) || (terms != nil && len(terms) != len(want)) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range got {
		d := got[i] - want[i]
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		num += d * d
		t := math.Abs(want[i])
		if terms != nil {
			t = math.Max(t, math.Abs(terms[i]))
		}
		den += t * t
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// Close fails the test unless TermsErr(got, want, terms) ≤ tol.
func Close(tb testing.TB, what string, got, want, terms []float64, tol float64) {
	tb.Helper()
	if err := TermsErr(got, want, terms); !(err <= tol) {
		tb.Errorf("%s: error %.3g > %.3g (relative to the terms' size)", what, err, tol)
	}
}

// Close is the package's Close on the suite's test.
func (s *Suite) Close(what string, got, want, terms []float64, tol float64) {
	s.T.Helper()
	Close(s.T, what, got, want, terms, tol)
}

// CloseAcc checks an output accumulated into: got = old + want, with the
// error relative to the sum's terms, |old| + |want| (or |old| + terms
// when terms are given), not to the sum alone, which an old value and an
// increment of opposite signs can cancel, failing the check by chance.
func (s *Suite) CloseAcc(what string, got, old, want, terms []float64, tol float64) {
	s.T.Helper()
	if terms == nil {
		terms = want
	}
	s.Close(what, got, lnSum(old, want), Sum(old, terms), tol)
}

// Abs is |v| element-wise (nil stays nil).
func Abs(v []float64) []float64 {
	if v == nil {
		return nil
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Abs(x)
	}
	return out
}

// Sum is the terms of an element-wise sum of the vectors vs: Σ|vₖ[i]|
// (nil vectors are skipped; all others must have one length).
func Sum(vs ...[]float64) []float64 {
	var out []float64
	for _, v := range vs {
		if v == nil {
			continue
		}
		if out == nil {
			out = make([]float64, len(v))
		}
		for i, x := range v {
			out[i] += math.Abs(x)
		}
	}
	return out
}

// Scaled is c·|v| element-wise.
func Scaled(c float64, v []float64) []float64 {
	out := Abs(v)
	for i := range out {
		out[i] *= math.Abs(c)
	}
	return out
}

// Uniform is n terms of size s each: the terms of results that all sum
// quantities of one known scale (a mean of probabilities, 1/n each).
func Uniform(n int, s float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Abs(s)
	}
	return out
}

// TermsOf evaluates a reference on the magnitudes of its inputs: for a
// computation made of sums and products (a GEMM, a reduction, a moment
// update), ref(|x₁|, |x₂|, ...) is exactly Σ|terms| of every output.
func TermsOf(ref func(in ...[]float64) []float64, in ...[]float64) []float64 {
	abs := make([][]float64, len(in))
	for i, v := range in {
		abs[i] = Abs(v)
	}
	return ref(abs...)
}
