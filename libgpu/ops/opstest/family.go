package opstest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Family is one op family's checks, registered from the family's file in
// this package (opstest/<family>.go) with Register, so adding a family
// edits no list here.
type Family struct {
	Name  string
	Check func(s *Suite)
}

var (
	famMu    sync.Mutex
	families = map[string]Family{}
)

// Register adds a family's checks; call it from init.
func Register(f Family) {
	famMu.Lock()
	defer famMu.Unlock()
	if _, dup := families[f.Name]; dup {
		panic("opstest: family registered twice: " + f.Name)
	}
	families[f.Name] = f
}

// Families lists the registered family names, sorted.
func Families() []string {
	famMu.Lock()
	defer famMu.Unlock()
	var out []string
	for n := range families {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Suite is what a family's checks get: an engine on the device under
// test, an allocator, a seeded random source, and the precision.
type Suite struct {
	T    *testing.T
	E    *ops.Engine
	A    device.Allocator
	R    *rand.Rand
	Prec ops.Precision
	seed uint64
}

// CheckFamilies runs every registered family's checks (each a subtest
// named after the family) on an engine for dev with opts. Inputs are fresh
// random draws each run from a logged seed (GPUKIT_OPSTEST_SEED repeats
// it). prepare, when not nil, runs at the start of each subtest (a GPU test
// pins its goroutine and makes the context current there).
func CheckFamilies(t *testing.T, dev device.Device, opts ops.Options, prepare func(t *testing.T)) {
	t.Helper()
	checkFamilies(t, dev, opts, prepare, seed(t))
}

// CheckFamily runs the registered family name's checks as CheckFamilies
// runs them (a test that changes how an op runs: a kernel path).
func CheckFamily(t *testing.T, name string, dev device.Device, opts ops.Options, prepare func(t *testing.T)) {
	t.Helper()
	if _, ok := families[name]; !ok {
		t.Fatalf("opstest: no family %q (have %v)", name, Families())
	}
	checkFamilies(t, dev, opts, prepare, seed(t), name)
}

// checkFamilies is CheckFamilies with the seed given, for the families
// only (all when none are named).
func checkFamilies(t *testing.T, dev device.Device, opts ops.Options, prepare func(t *testing.T), seed uint64, only ...string) {
	t.Helper()
	e, err := ops.NewEngine(dev, opts)
	if err != nil {
		t.Fatalf("NewEngine(%v): %v", dev, err)
	}
	for i, name := range Families() {
		if len(only) > 0 && !slices.Contains(only, name) {
			continue
		}
		f := families[name]
		t.Run(name, func(t *testing.T) {
			if prepare != nil {
				prepare(t)
			}
			f.Check(&Suite{T: t, E: e, A: device.Local{Dev: dev}, Prec: opts.Precision,
				R: rand.New(rand.NewPCG(seed, uint64(i))), seed: seed})
		})
	}
}

// Run runs check as a subtest with a Suite of its own.
func (s *Suite) Run(name string, check func(s *Suite)) {
	s.T.Run(name, func(t *testing.T) {
		c := *s
		c.T = t
		check(&c)
	})
}

// DTypes are the float dtypes a family is checked at: f32 always, and
// bf16 (storage) too.
func (s *Suite) DTypes() []tensor.DType { return []tensor.DType{tensor.F32, tensor.BF16} }

// Tol is the relative-error bound (DEVELOPERS.md) for results stored in dt
// from f32 arithmetic: 1e-5 for f32, 1e-2 for bf16.
func (s *Suite) Tol(dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 1e-2
	}
	return 1e-5
}

// GemmTol is Tol for results of products of operands of dtype dt under the
// suite's precision: f32 1e-5, TF32 1e-3, bf16 1e-2.
func (s *Suite) GemmTol(dt tensor.DType) float64 {
	switch {
	case dt == tensor.BF16:
		return 1e-2
	case s.Prec != ops.PrecF32 && s.E.IsGraphCapable():
		return 1e-3 // TF32 tensor cores (the host computes f32)
	}
	return 1e-5
}

// Rand allocates a tensor of dtype dt and shape filled with draws from
// N(0, scale²), and returns it with its exact stored values (rounded to
// dt) as float64, so references start from what the device holds.
func (s *Suite) Rand(dt tensor.DType, scale float64, shape ...int) (*tensor.Tensor, []float64) {
	s.T.Helper()
	t := Empty(s.T, s.A, dt, shape...)
	v := make([]float32, t.Numel())
	for i := range v {
		v[i] = float32(scale * s.R.NormFloat64())
	}
	if err := t.WriteFloat32(v); err != nil {
		s.T.Fatalf("write %v: %v", shape, err)
	}
	got, err := t.ReadFloat32()
	if err != nil {
		s.T.Fatal(err)
	}
	return t, F64(got)
}

// Const allocates a tensor of dtype dt holding v (rounded to dt).
func (s *Suite) Const(dt tensor.DType, v []float64, shape ...int) *tensor.Tensor {
	s.T.Helper()
	t := Empty(s.T, s.A, dt, shape...)
	if err := t.WriteFloat32(F32(v)); err != nil {
		s.T.Fatalf("write %v: %v", shape, err)
	}
	return t
}

// Empty allocates a tensor poisoned with NaN (0xff bytes).
func (s *Suite) Empty(dt tensor.DType, shape ...int) *tensor.Tensor {
	s.T.Helper()
	return Empty(s.T, s.A, dt, shape...)
}

// Read waits for the engine and reads a float tensor (any strides) as
// float64.
func (s *Suite) Read(t *tensor.Tensor) []float64 {
	s.T.Helper()
	if err := s.E.Sync(); err != nil {
		s.T.Fatalf("sync: %v", err)
	}
	v, err := t.ReadFloat32()
	if err != nil {
		s.T.Fatalf("read %v: %v", t, err)
	}
	return F64(v)
}

// NoErr fails the test (and stops it) on err.
func (s *Suite) NoErr(what string, err error) {
	s.T.Helper()
	if err != nil {
		s.T.Fatalf("%s: %v", what, err)
	}
}

// Weights returns n draws from N(0, 1): the upstream gradient dy of a
// gradient check, so that L = Σ dy·y.
func (s *Suite) Weights(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = s.R.NormFloat64()
	}
	return v
}

// FDGrad is the central finite-difference gradient of L(x) = Σ w·f(x) at
// x (float64, evaluated on the float64 reference f), step h relative to
// max(1, |xᵢ|).
func FDGrad(f func(x []float64) []float64, x, w []float64, h float64) []float64 {
	g := make([]float64, len(x))
	dot := func() float64 {
		y := f(x)
		var s float64
		for i := range y {
			s += w[i] * y[i]
		}
		return s
	}
	for i := range x {
		old := x[i]
		hi := h * math.Max(1, math.Abs(old))
		x[i] = old + hi
		up := dot()
		x[i] = old - hi
		dn := dot()
		x[i] = old
		g[i] = (up - dn) / (2 * hi)
	}
	return g
}

// FDGradTerms is FDGrad with the terms' size of each gradient element
// (TermsErr): the backward sums w_k·∂y_k/∂x_i over the outputs k, so its
// terms are Σ_k |w_k·∂y_k/∂x_i|, each Jacobian element taken from the
// same central differences.
func FDGradTerms(f func(x []float64) []float64, x, w []float64, h float64) (g, terms []float64) {
	g, terms = make([]float64, len(x)), make([]float64, len(x))
	for i := range x {
		old := x[i]
		hi := h * math.Max(1, math.Abs(old))
		x[i] = old + hi
		up := f(x)
		x[i] = old - hi
		dn := f(x)
		x[i] = old
		for k := range w {
			d := w[k] * (up[k] - dn[k]) / (2 * hi)
			g[i] += d
			terms[i] += math.Abs(d)
		}
	}
	return g, terms
}

// Describe formats a shape for subtest names.
func Describe(shape ...int) string { return fmt.Sprint(shape) }
