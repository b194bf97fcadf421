package autograd

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// A scalar calculator over the tape: every Var holds n f32 values on the
// host, and ops are element-wise. It checks the tape's bookkeeping (order,
// fan-out accumulation, aliases, loss roots) independent of any kernel.
type calc struct {
	t *testing.T
	a device.Allocator
	p *Tape
	n int
}

func newCalc(t *testing.T, n int) *calc {
	a := device.Local{Dev: device.NewHost()}
	fill := func(x *tensor.Tensor, v float64) error {
		s, err := x.F32()
		for i := range s {
			s[i] = float32(v)
		}
		return err
	}
	c := &calc{t: t, a: a, p: New(a, "test", fill), n: n}
	t.Cleanup(func() { c.p.Free() })
	return c
}

func f32(x *tensor.Tensor) []float32 {
	s, err := x.F32()
	if err != nil {
		panic(err)
	}
	return s
}

func (c *calc) param(name string, v []float32) *Var {
	x, _ := tensor.Alloc(c.a, "", tensor.F32, c.n)
	g, _ := tensor.Alloc(c.a, "", tensor.F32, c.n)
	copy(f32(x), v)
	for i := range f32(g) {
		f32(g)[i] = float32(math.NaN()) // must be written or zeroed
	}
	return c.p.Param(name, x, g)
}

func (c *calc) out(name string) *Var {
	v, err := c.p.Alloc(name, tensor.F32, c.n)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// put writes or adds into a gradient as Grads says.
func put(dst *tensor.Tensor, acc bool, i int, v float32) {
	if dst == nil {
		return
	}
	if acc {
		f32(dst)[i] += v
	} else {
		f32(dst)[i] = v
	}
}

// mul records z = x·y.
func (c *calc) mul(x, y *Var) *Var { return c.logMul("mul", nil, x, y) }

// logMul records z = x·y as node name; when log is not nil, its backward
// step appends "bwd:name" to it.
func (c *calc) logMul(name string, log *[]string, x, y *Var) *Var {
	z := c.out(name)
	err := c.p.Op(name, []*Var{x, y}, []*Var{z}, func(*Grads) error {
		for i := range f32(z.Value) {
			f32(z.Value)[i] = f32(x.Value)[i] * f32(y.Value)[i]
		}
		return nil
	}, func(g *Grads) error {
		if log != nil {
			*log = append(*log, "bwd:"+name)
		}
		dz := g.Out(0)
		for i := range f32(z.Value) {
			d := f32(dz)[i]
			put(g.In(0), g.Acc(0), i, d*f32(y.Value)[i])
			put(g.In(1), g.Acc(1), i, d*f32(x.Value)[i])
		}
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return z
}

// sum records loss = Σ x (a loss node: writes dx = 1 in the forward).
func (c *calc) sum(x *Var) *Var {
	l, err := c.p.Alloc("loss", tensor.F32, 1)
	if err != nil {
		c.t.Fatal(err)
	}
	err = c.p.Loss("sum", []*Var{x}, l, func(g *Grads) error {
		var s float32
		for i, v := range f32(x.Value) {
			s += v
			put(g.In(0), g.Acc(0), i, 1)
		}
		f32(l.Value)[0] = s
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

func TestFanOutAccumulates(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	c := newCalc(t, 4)
	a := make([]float32, 4)
	b := make([]float32, 4)
	for i := range a {
		a[i], b[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	w := c.param("w", a)
	v := c.param("v", b)
	unused := c.param("unused", a)
	// h = w·v; loss = Σ (h·w + h·h): w and h each feed two ops.
	h := c.mul(w, v)
	y := c.mul(h, w)
	z := c.mul(h, h)
	s := c.mul(y, z) // loss = Σ (h·w)·(h·h) = Σ w⁴v³
	c.sum(s)
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	for step := 0; step < 2; step++ { // a second step overwrites, not adds
		if err := c.p.Forward(); err != nil {
			t.Fatal(err)
		}
		if err := c.p.Backward(); err != nil {
			t.Fatal(err)
		}
		for i := range a {
			wi, vi := float64(a[i]), float64(b[i])
			dw := 4 * math.Pow(wi, 3) * math.Pow(vi, 3)
			dv := 3 * math.Pow(wi, 4) * math.Pow(vi, 2)
			if got := float64(f32(w.Grad)[i]); math.Abs(got-dw) > 1e-4*math.Max(1, math.Abs(dw)) {
				t.Fatalf("step %d dw[%d] = %v, want %v", step, i, got, dw)
			}
			if got := float64(f32(v.Grad)[i]); math.Abs(got-dv) > 1e-4*math.Max(1, math.Abs(dv)) {
				t.Fatalf("step %d dv[%d] = %v, want %v", step, i, got, dv)
			}
			if f32(unused.Grad)[i] != 0 {
				t.Fatalf("unused param's gradient %v, want zeroed", f32(unused.Grad)[i])
			}
		}
	}
}

func TestAliasSharesRootGradient(t *testing.T) {
	c := newCalc(t, 3)
	w := c.param("w", []float32{1, 2, 3})
	// A "cast" alias: another buffer holding w's values, whose gradient
	// is w's own.
	cv, _ := tensor.Alloc(c.a, "", tensor.F32, 3)
	wc, err := c.p.Alias("w.cast", w, cv, func(root *tensor.Tensor) (*tensor.Tensor, error) { return root, nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.p.Op("cast", []*Var{w}, nil, func(*Grads) error { copy(f32(cv), f32(w.Value)); return nil }, nil); err != nil {
		t.Fatal(err)
	}
	y := c.mul(wc, w) // w² through the alias and the root: dw = 2w
	c.sum(y)
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Forward(); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Backward(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float32{2, 4, 6} {
		if got := f32(w.Grad)[i]; got != want {
			t.Fatalf("dw[%d] = %v, want %v", i, got, want)
		}
	}
	if wc.Grad != w.Grad {
		t.Fatal("cast alias does not share the root's gradient")
	}
}

func TestBackwardNeedsForwardAndGrads(t *testing.T) {
	c := newCalc(t, 1)
	w := c.param("w", []float32{2})
	c.sum(c.mul(w, w))
	if err := c.p.Forward(); !errors.Is(err, ErrBuilt) {
		t.Fatalf("forward before build: %v", err)
	}
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Backward(); !errors.Is(err, ErrNoForward) {
		t.Fatalf("backward first: %v", err)
	}
	if err := c.p.Op("late", nil, nil, nil, nil); !errors.Is(err, ErrBuilt) {
		t.Fatalf("record after build: %v", err)
	}
	e := newCalc(t, 1)
	x := e.param("x", []float32{1})
	e.sum(e.mul(x, x))
	if err := e.p.Build(false); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Forward(); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Backward(); !errors.Is(err, ErrBuilt) {
		t.Fatalf("backward on a forward-only tape: %v", err)
	}
}

func TestErrorsNameTheNode(t *testing.T) {
	c := newCalc(t, 1)
	boom := errors.New("boom")
	w := c.param("w", []float32{1})
	o := c.out("o")
	if err := c.p.Op("fc3", []*Var{w}, []*Var{o}, func(*Grads) error { return boom }, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	err := c.p.Forward()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "fc3") {
		t.Fatalf("error %v, want wrapped boom naming fc3", err)
	}
	other := newCalc(t, 1)
	if err := c.p.Op("x", []*Var{other.param("p", []float32{0})}, nil, nil, nil); !errors.Is(err, ErrArg) && !errors.Is(err, ErrBuilt) {
		t.Fatalf("foreign var: %v", err)
	}
}

func TestNoGradientWhereNothingFlows(t *testing.T) {
	c := newCalc(t, 2)
	w := c.param("w", []float32{1, 2})
	in := c.p.Input("x", w.Value)
	side := c.mul(w, w) // computed from a param, never reaches the loss
	y := c.mul(in, w)
	c.sum(y)
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	if side.Grad != nil {
		t.Fatal("a value that never reaches the loss got a gradient buffer")
	}
	if in.Grad != nil || in.RequiresGrad() {
		t.Fatal("an input got a gradient")
	}
	if err := c.p.Forward(); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Backward(); err != nil {
		t.Fatal(err)
	}
	if f32(w.Grad)[1] != 2 {
		t.Fatalf("dw = %v, want x = [1 2]", f32(w.Grad))
	}
}

// TestSoleWriter: Grads.Sole is true only where a node is the one writer
// of an input's gradient (not for a value read twice, not through an alias
// of a value read elsewhere).
func TestSoleWriter(t *testing.T) {
	c := newCalc(t, 2)
	w := c.param("w", []float32{1, 2}) // read by two nodes
	v := c.param("v", []float32{3, 4}) // read once
	u := c.param("u", []float32{5, 6}) // read once, through an alias, and directly
	uc, _ := tensor.Alloc(c.a, "", tensor.F32, 2)
	ua, err := c.p.Alias("u.alias", u, uc, func(g *tensor.Tensor) (*tensor.Tensor, error) { return g, nil })
	if err != nil {
		t.Fatal(err)
	}
	a := c.mul(w, v)
	b := c.mul(w, ua)
	d := c.mul(a, b)
	e := c.mul(d, u)
	c.sum(e)
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	sole := map[string][]bool{}
	for _, n := range c.p.nodes {
		for i, in := range n.in {
			if n.wantsIn[i] {
				sole[in.Name] = append(sole[in.Name], n.grads.Sole(i))
			}
		}
	}
	for name, want := range map[string]bool{"w": false, "v": true, "u": false, "u.alias": false} {
		for _, got := range sole[name] {
			if got != want {
				t.Errorf("%s: Sole %v, want %v (%v)", name, got, want, sole[name])
			}
		}
	}
}
