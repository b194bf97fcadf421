package autograd

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestGradReadyAfterLastWriter: OnGradReady reports each param once per
// Backward, right after the backward step of the last writer of its
// gradient: a tied weight (E, read by the first node and again by a later
// one, as a GPT's embedding and head) only after the first node's step,
// which runs last; params nothing writes, and params only a loss node
// writes (in the forward), before any step. At the moment it is reported,
// each gradient already holds its final value (host: steps run at once).
func TestGradReadyAfterLastWriter(t *testing.T) {
	c := newCalc(t, 3)
	E := c.param("E", []float32{0.5, -1, 2})
	V := c.param("V", []float32{1.5, 2, -0.5})
	P := c.param("P", []float32{-2, 0.25, 1})
	U := c.param("U", []float32{1, 1, 1})
	L := c.param("L", []float32{3, 4, 5})
	var log []string
	h := c.logMul("embed", &log, E, V) // E and V: written last here
	y := c.logMul("head", &log, h, E)  // E's first contribution
	z := c.logMul("proj", &log, y, P)
	c.sum(z)
	c.sum(L) // L: written only by a loss node, in the forward
	_ = U    // U: nothing writes it
	if err := c.p.Build(true); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Var{"E": E, "V": V, "P": P, "U": U, "L": L}
	atReady := map[string][]float32{}
	c.p.OnGradReady(func(v *Var) error {
		if !v.IsParam() || byName[v.Name] != v {
			t.Errorf("hook got %s (param %v), not one of the params", v.Name, v.IsParam())
		}
		log = append(log, "ready:"+v.Name)
		atReady[v.Name] = append([]float32(nil), f32(v.Grad)...)
		return nil
	})
	want := []string{"ready:U", "ready:L", "bwd:proj", "ready:P", "bwd:head", "bwd:embed", "ready:E", "ready:V"}
	for step := 0; step < 2; step++ {
		log = log[:0]
		if err := c.p.Forward(); err != nil {
			t.Fatal(err)
		}
		if err := c.p.Backward(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(log, want) {
			t.Fatalf("step %d: order\n %v\nwant\n %v", step, log, want)
		}
		for name, v := range byName {
			if !slices.Equal(atReady[name], f32(v.Grad)) {
				t.Fatalf("step %d: %s's gradient was %v when reported ready, %v after the backward", step, name, atReady[name], f32(v.Grad))
			}
		}
	}
	// loss = Σ E²·V·P + Σ L: dE = 2·E·V·P, the sum of both writers.
	for i := range 3 {
		e, v, p := f32(E.Value)[i], f32(V.Value)[i], f32(P.Value)[i]
		if got, w := f32(E.Grad)[i], 2*e*v*p; got != w {
			t.Fatalf("dE[%d] = %v, want %v", i, got, w)
		}
	}
	// An error from the hook stops the backward and names the param; nil
	// removes the hook.
	boom := errors.New("boom")
	c.p.OnGradReady(func(v *Var) error {
		if v.Name == "P" {
			return boom
		}
		return nil
	})
	log = log[:0]
	if err := c.p.Forward(); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Backward(); !errors.Is(err, boom) || !strings.Contains(err.Error(), "P") {
		t.Fatalf("hook error: %v", err)
	}
	if !slices.Equal(log, []string{"bwd:proj"}) {
		t.Fatalf("the backward went on after the hook failed: %v", log)
	}
	c.p.OnGradReady(nil)
	log = log[:0]
	if err := c.p.Forward(); err != nil {
		t.Fatal(err)
	}
	if err := c.p.Backward(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(log, []string{"bwd:proj", "bwd:head", "bwd:embed"}) {
		t.Fatalf("without a hook: %v", log)
	}
}
