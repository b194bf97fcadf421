package nccltest

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func hostTensor(t *testing.T, dt tensor.DType, v ...float32) (*ops.Engine, *tensor.Tensor) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	x, err := tensor.Alloc(device.Local{Dev: h}, "", dt, len(v))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WriteFloat32(v); err != nil {
		t.Fatal(err)
	}
	return e, x
}

// TestWorldCollectives: three ranks' all-reduces (sum, avg, max, min;
// bf16 rounded per addition), reduce-scatter (in place), all-gather (in
// place) and broadcast give what the definitions say.
func TestWorldCollectives(t *testing.T) {
	const n = 3
	got := make([]map[string][]float32, n)
	err := Run(n, func(c *Comm) error {
		r := float32(c.Rank())
		out := map[string][]float32{}
		read := func(name string, x *tensor.Tensor) error {
			v, err := x.ReadFloat32()
			out[name] = v
			return err
		}
		for _, op := range []nccl.Op{nccl.Sum, nccl.Avg, nccl.Max, nccl.Min} {
			e, x := hostTensor(t, tensor.F32, r, 2*r, -r, 6)
			if err := c.AllReduce(e, x, x, op); err != nil {
				return err
			}
			if err := read("all-reduce "+op.String(), x); err != nil {
				return err
			}
		}
		e, b := hostTensor(t, tensor.BF16, 1, 1.0/256)
		if err := c.AllReduce(e, b, b, nccl.Sum); err != nil {
			return err
		}
		if err := read("bf16 sum", b); err != nil {
			return err
		}
		e, x := hostTensor(t, tensor.F32, r, r+10, r+20, r+30, r+40, r+50)
		part, err := x.Rows(2*c.Rank(), 2*c.Rank()+2)
		if err != nil {
			return err
		}
		if err := c.ReduceScatter(e, part, x, nccl.Sum); err != nil {
			return err
		}
		if err := read("reduce-scatter", part); err != nil {
			return err
		}
		if err := c.AllGather(e, x, part); err != nil {
			return err
		}
		if err := read("all-gather", x); err != nil {
			return err
		}
		e, y := hostTensor(t, tensor.F32, r, -r)
		if err := c.Broadcast(e, y, nil, 2); err != nil {
			return err
		}
		if err := read("broadcast", y); err != nil {
			return err
		}
		got[c.Rank()] = out
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]float32{
		"all-reduce sum": {3, 6, -3, 18}, "all-reduce avg": {1, 2, -1, 6}, "all-reduce max": {2, 4, 0, 6},
		"all-reduce min": {0, 0, -2, 6},
		// 1 + 1 + 1 in bf16, and 2⁻⁸ three times: exact; avg is not asked.
		"bf16 sum": {3, 3.0 / 256},
	}
	for r := range n {
		for k, w := range want {
			if !reflect.DeepEqual(got[r][k], w) {
				t.Errorf("rank %d: %s = %v, want %v", r, k, got[r][k], w)
			}
		}
		rs := []float32{float32(3 + 10*2*r*3), float32(3 + (10*2*r+10)*3)}
		if !reflect.DeepEqual(got[r]["reduce-scatter"], rs) {
			t.Errorf("rank %d: reduce-scatter %v, want %v", r, got[r]["reduce-scatter"], rs)
		}
		if ag := []float32{3, 33, 63, 93, 123, 153}; !reflect.DeepEqual(got[r]["all-gather"], ag) {
			t.Errorf("rank %d: all-gather %v, want %v", r, got[r]["all-gather"], ag)
		}
		if !reflect.DeepEqual(got[r]["broadcast"], []float32{2, -2}) {
			t.Errorf("rank %d: broadcast %v", r, got[r]["broadcast"])
		}
	}
}

// TestWorldMismatch: ranks calling different collectives fail (instead
// of exchanging wrong bytes), and a failed rank ends the others' waits.
func TestWorldMismatch(t *testing.T) {
	err := Run(2, func(c *Comm) error {
		e, x := hostTensor(t, tensor.F32, 1, 2)
		if c.Rank() == 0 {
			return c.AllReduce(e, x, x, nccl.Sum)
		}
		return c.Broadcast(e, x, nil, 0)
	})
	if !errors.Is(err, nccl.ErrArg) || !strings.Contains(err.Error(), "rank 1 called broadcast") {
		t.Errorf("mismatched collectives: %v", err)
	}
	boom := errors.New("boom")
	err = Run(3, func(c *Comm) error {
		if c.Rank() == 1 {
			return boom
		}
		e, x := hostTensor(t, tensor.F32, 1)
		return c.AllReduce(e, x, x, nccl.Sum)
	})
	if !errors.Is(err, boom) {
		t.Errorf("a failed rank: %v", err)
	}
}
