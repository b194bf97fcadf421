package zero_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// shards is the number of data shards of every synthetic global batch: n
// ranks (n dividing it) each average shards/n of them, so every world
// size trains on the same global gradient, as ranks taking equal rows of
// a global batch do.
const shards = 4

// problem is a synthetic training problem over parameters of various
// shapes: data shard k's gradient of parameter i at step s is
// w_k ⊙ (p − target) + 0.05·sin(s + j + k), a loss each shard pulls
// towards the target with its own weights, so that the updates depend on
// the parameters (a closed loop) and the shards' gradients differ.
type problem struct {
	names  []string
	shapes [][]int
	init   [][]float32
	target [][]float32
	weight [shards][][]float32
}

func newProblem(t *testing.T, shapes [][]int) *problem {
	seed := rand.Uint64()
	t.Logf("problem seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 27))
	pb := &problem{shapes: shapes}
	draw := func(n int, lo, hi float64) []float32 {
		v := make([]float32, n)
		for j := range v {
			v[j] = float32(lo + (hi-lo)*r.Float64())
		}
		return v
	}
	for i, s := range shapes {
		n := tensor.Numel(s)
		pb.names = append(pb.names, fmt.Sprintf("layer%d.p", i))
		pb.init = append(pb.init, draw(n, -1, 1))
		pb.target = append(pb.target, draw(n, -2, 2))
		for k := range shards {
			pb.weight[k] = append(pb.weight[k], draw(n, 0.1, 2))
		}
	}
	return pb
}

// distParams is the problem's parameters for dist.Plan.
func (pb *problem) distParams() []dist.Param {
	var ps []dist.Param
	for i, s := range pb.shapes {
		ps = append(ps, dist.Param{Name: pb.names[i], DType: tensor.F32, Shape: s})
	}
	return ps
}

// noDecay exempts vectors from weight decay (nanoGPT's groups).
func (pb *problem) noDecay() []bool {
	nd := make([]bool, len(pb.shapes))
	for i, s := range pb.shapes {
		nd[i] = len(s) < 2
	}
	return nd
}

// grad is the mean of shards [lo, hi)'s gradients of parameter i at
// values p and step s, in float64, rounded to f32.
func (pb *problem) grad(i int, p []float32, s, lo, hi int) []float32 {
	g := make([]float32, len(p))
	for j := range g {
		sum := 0.0
		for k := lo; k < hi; k++ {
			sum += float64(pb.weight[k][i][j])*float64(p[j]-pb.target[i][j]) + 0.05*math.Sin(float64(s+j+k))
		}
		g[j] = float32(sum / float64(hi-lo))
	}
	return g
}

// hostEngine is an engine on the host and its allocator (t may be nil:
// the host engine cannot fail to start).
func hostEngine(t testing.TB) (*ops.Engine, device.Allocator) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		panic(err)
	}
	return e, device.Local{Dev: h}
}

// read is t's values (f32).
func read(t testing.TB, x *tensor.Tensor) []float32 {
	v, err := x.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// within checks got against want: max |got − want| ≤ tol × max |want|
// (errors relative to the size of the values, which the updates move by
// amounts of the learning rate's order).
func within(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	withinScale(t, what, got, want, tol, 0)
}

// withinScale is within with the scale at least floor (the size of the
// terms a value sums, where the value itself may be near a cancellation:
// a moment of gradients that changed sign).
func withinScale(t testing.TB, what string, got, want []float32, tol, floor float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	scale, diff := floor, 0.0
	for j := range want {
		scale = max(scale, math.Abs(float64(want[j])))
		diff = max(diff, math.Abs(float64(got[j])-float64(want[j])))
	}
	if !(diff <= tol*scale) {
		t.Errorf("%s: max difference %.3g, %.3g of the scale %.3g (bound %.0e)", what, diff, diff/scale, scale, tol)
	}
}

// maxAbs is the largest |value| of the vectors in vs whose key ends in
// suffix.
func maxAbs(vs map[string][]float32, suffix string) float64 {
	m := 0.0
	for k, v := range vs {
		if strings.HasSuffix(k, suffix) {
			for _, x := range v {
				m = max(m, math.Abs(float64(x)))
			}
		}
	}
	return m
}

// named is the nn.Params of host tensors holding vals.
func named(t testing.TB, a device.Allocator, names []string, shapes [][]int, vals [][]float32) []nn.Param {
	var ps []nn.Param
	for i, n := range names {
		v, err := tensor.Alloc(a, "", tensor.F32, shapes[i]...)
		if err != nil {
			t.Fatal(err)
		}
		if vals != nil {
			if err := v.WriteF32(vals[i]); err != nil {
				t.Fatal(err)
			}
		}
		g, err := tensor.Alloc(a, "", tensor.F32, shapes[i]...)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, nn.Param{Name: n, Value: v, Grad: g})
	}
	return ps
}
