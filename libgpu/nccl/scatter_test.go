package nccl_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// TestReducerScatter: with Scatter, ranks of the in-process stand-in
// marking their gradients in backward order end the step with the average
// over the ranks in their part of every bucket (and their own gradients
// elsewhere), bitwise what an all-reduce gives there; compressed to bf16,
// the part holds the bf16 average. 1 to 4 ranks, random parameter lists,
// a small last bucket.
func TestReducerScatter(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for n := 1; n <= 4; n++ {
		for _, comm := range []tensor.DType{tensor.F32, tensor.BF16} {
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			var ps []dist.Param
			for i := range 3 + rng.IntN(8) {
				ps = append(ps, dist.Param{Name: fmt.Sprint("p", i), DType: tensor.F32, Shape: []int{1 + rng.IntN(40), 1 + rng.IntN(9)}})
			}
			cfg := dist.BucketConfig{Bytes: int64(256 + rng.IntN(2048)), FirstBytes: 64, LastBytes: 128, Align: 16, Shards: n}
			l, err := dist.Plan(ps, cfg)
			if err != nil {
				t.Fatal(err)
			}
			grad := func(r, i, j int) float32 { return float32(((r+1)*(i+3)*(j+7))%23-11)/8 + float32(j%5)/1000 } // not bf16 numbers
			// What each element becomes: every rank computes every reduced
			// value with an all-reduce of its own for comparison.
			got := make([][][]float32, n)  // rank, param: values after Wait
			want := make([][][]float32, n) // rank, param: the all-reduced values
			err = nccltest.Run(n, func(c *nccltest.Comm) error {
				e, a := hostEngine(t)
				g, err := l.Alloc(a, "grads")
				if err != nil {
					return err
				}
				defer g.Free()
				red, err := nccl.NewReducer(e, c, l, g, nccl.Avg)
				if err != nil {
					return err
				}
				if err := red.Scatter(true); err != nil {
					return err
				}
				if err := red.Compress(a, "stage", comm); err != nil {
					return err
				}
				defer red.Free()
				fill := func() error {
					for i, p := range g.Params {
						v := make([]float32, p.Numel())
						for j := range v {
							v[j] = grad(c.Rank(), i, j)
						}
						if err := p.WriteFloat32(v); err != nil {
							return err
						}
					}
					return nil
				}
				if err := fill(); err != nil {
					return err
				}
				for i := len(ps) - 1; i >= 0; i-- {
					if err := red.Ready(i); err != nil {
						return err
					}
				}
				if err := red.Wait(); err != nil {
					return err
				}
				for _, p := range g.Params {
					v, err := p.ReadFloat32()
					if err != nil {
						return err
					}
					got[c.Rank()] = append(got[c.Rank()], v)
				}
				// The reference: the same reducer all-reducing.
				if err := red.Scatter(false); err != nil {
					return err
				}
				if err := fill(); err != nil {
					return err
				}
				for i := len(ps) - 1; i >= 0; i-- {
					if err := red.Ready(i); err != nil {
						return err
					}
				}
				if err := red.Wait(); err != nil {
					return err
				}
				for _, p := range g.Params {
					v, err := p.ReadFloat32()
					if err != nil {
						return err
					}
					want[c.Rank()] = append(want[c.Rank()], v)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%d ranks: %v", n, err)
			}
			for r := range n {
				mine := map[[2]int]bool{}
				for _, s := range l.Segments(r) {
					for k := range s.Numel {
						mine[[2]int{s.Param, s.Offset + k}] = true
					}
				}
				for i := range ps {
					for j, v := range got[r][i] {
						w := grad(r, i, j)
						if mine[[2]int{i, j}] {
							w = want[r][i][j]
						}
						if v != w {
							t.Fatalf("%d ranks, %v: rank %d, %s[%d] = %v, want %v (in its part: %v)", n, comm, r, ps[i].Name, j, v, w, mine[[2]int{i, j}])
						}
					}
				}
			}
		}
	}
}

// TestReducerScatterErrors: Scatter needs a communicator that can
// reduce-scatter, a layout of one part per rank and no step under way.
func TestReducerScatterErrors(t *testing.T) {
	e, a := hostEngine(t)
	ps := []dist.Param{{Name: "w", DType: tensor.F32, Shape: []int{64}}, {Name: "v", DType: tensor.F32, Shape: []int{64}}}
	l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 16, FirstBytes: 16, Shards: 2}) // [v] [w]
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.Alloc(a, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	r, err := nccl.NewReducer(e, nccl.Solo(e.Device()), l, g, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Scatter(true); !errors.Is(err, nccl.ErrArg) {
		t.Errorf("2 parts for 1 rank: %v", err)
	}
	r, err = nccl.NewReducer(e, allReduceOnly{}, l, g, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Scatter(true); !errors.Is(err, nccl.ErrArg) {
		t.Errorf("a communicator without reduce-scatter: %v", err)
	}
	r, err = nccl.NewReducer(e, nccltest.NewWorld(2).Comm(0), l, g, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(0); err != nil { // bucket 1 of 2: held until bucket 0 completes
		t.Fatal(err)
	}
	if err := r.Scatter(true); !errors.Is(err, nccl.ErrArg) {
		t.Errorf("Scatter during a step: %v", err)
	}
	r.Reset()
	if err := r.Scatter(true); err != nil {
		t.Errorf("between steps: %v", err)
	}
}

// allReduceOnly is a Collective that cannot reduce-scatter.
type allReduceOnly struct{}

func (allReduceOnly) IsSolo() bool { return false }
func (allReduceOnly) AllReduce(*ops.Engine, *tensor.Tensor, *tensor.Tensor, nccl.Op) error {
	return nil
}

func hostEngine(t *testing.T) (*ops.Engine, device.Allocator) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, device.Local{Dev: h}
}
