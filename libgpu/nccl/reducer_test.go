package nccl

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// reducerSetup: six f32 parameters of 64 bytes in buckets of at least 64
// (first) and 128 bytes: [5] [4 3] [2 1] [0].
func reducerSetup(t *testing.T) (*Reducer, *[]string) {
	e, a := hostSetup(t)
	var ps []dist.Param
	for i := range 6 {
		ps = append(ps, dist.Param{Name: fmt.Sprint("p", i), DType: tensor.F32, Shape: []int{16}})
	}
	l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 128, FirstBytes: 64, Align: 16})
	if err != nil {
		t.Fatal(err)
	}
	var got [][]int
	for _, b := range l.Buckets {
		got = append(got, b.Params)
	}
	if want := [][]int{{5}, {4, 3}, {2, 1}, {0}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("buckets %v, want %v", got, want)
	}
	g, err := l.Alloc(a, "grads")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReducer(e, Solo(e.Device()), l, g, Avg)
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	r.skip = false
	r.collective = func(b int, x *tensor.Tensor) error {
		if x != g.Buckets[b] {
			t.Errorf("bucket %d reduced through another tensor", b)
		}
		log = append(log, fmt.Sprint("bucket ", b))
		return nil
	}
	return r, &log
}

// TestReducerOrder: buckets are reduced as soon as they are complete and
// next in order; one completed early waits for those before it; Wait
// reduces the rest, then the reducer starts over.
func TestReducerOrder(t *testing.T) {
	r, log := reducerSetup(t)
	mark := func(ps ...int) {
		t.Helper()
		*log = append(*log, fmt.Sprint("ready ", ps))
		if err := r.Ready(ps...); err != nil {
			t.Fatal(err)
		}
	}
	for step := range 2 {
		*log = nil
		mark(5)
		mark(4)
		mark(1, 2) // bucket 2 completes before bucket 1: held
		mark(3)    // bucket 1 completes: 1 then 2
		*log = append(*log, "wait")
		if err := r.Wait(); err != nil { // p0 never marked: bucket 3 by Wait
			t.Fatal(err)
		}
		want := []string{"ready [5]", "bucket 0", "ready [4]", "ready [1 2]", "ready [3]", "bucket 1", "bucket 2", "wait", "bucket 3"}
		if !reflect.DeepEqual(*log, want) {
			t.Fatalf("step %d:\n got %q\nwant %q", step, *log, want)
		}
	}
}

func TestReducerErrors(t *testing.T) {
	r, _ := reducerSetup(t)
	if err := r.Ready(6); !errors.Is(err, ErrArg) {
		t.Errorf("unknown parameter: %v", err)
	}
	if err := r.Ready(2); err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(2); !errors.Is(err, ErrArg) {
		t.Errorf("marked twice: %v", err)
	}
	r.Reset()
	if err := r.Ready(2); err != nil {
		t.Errorf("after Reset: %v", err)
	}
	boom := errors.New("boom")
	r.collective = func(int, *tensor.Tensor) error { return boom }
	if err := r.Ready(5); !errors.Is(err, boom) {
		t.Errorf("failing all-reduce: %v", err)
	}
}

// TestReducerSolo: with one rank the gradients are left as they are.
func TestReducerSolo(t *testing.T) {
	e, a := hostSetup(t)
	l, err := dist.Plan([]dist.Param{{Name: "w", DType: tensor.F32, Shape: []int{3}}}, dist.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.Alloc(a, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Params[0].WriteFloat32([]float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	r, err := NewReducer(e, Solo(e.Device()), l, g, Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(0); err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := values(t, g.Params[0]); !reflect.DeepEqual(got, []float32{1, 2, 3}) {
		t.Fatalf("gradient %v", got)
	}
}

// doubling is a Collective of two ranks that hold the same values: a sum
// doubles each element (exactly, in any float dtype). It records the
// dtype and length of what it reduced.
type doubling struct{ seen []string }

func (d *doubling) IsSolo() bool { return false }

func (d *doubling) AllReduce(e *ops.Engine, dst, src *tensor.Tensor, op Op) error {
	d.seen = append(d.seen, fmt.Sprintf("%v %v ×%d", op, src.DType, src.Numel()))
	v, err := src.ReadFloat32()
	if err != nil {
		return err
	}
	for i := range v {
		v[i] *= 2
	}
	return dst.WriteFloat32(v)
}

// TestReducerCompress: with Compress(BF16) each f32 bucket is cast to a
// bf16 staging copy, that copy is all-reduced (with the reducer's op) and
// cast back, so the gradients come back as the bf16 rounding of their
// reduction; a bucket of bf16 gradients is reduced in place; Compress(F32)
// goes back to f32 all-reduces; bad dtypes and a Compress during a step
// are refused; a one-rank reducer allocates nothing.
func TestReducerCompress(t *testing.T) {
	e, a := hostSetup(t)
	ps := []dist.Param{{Name: "w", DType: tensor.F32, Shape: []int{5, 3}}, {Name: "h", DType: tensor.BF16, Shape: []int{4}},
		{Name: "b", DType: tensor.F32, Shape: []int{7}}}
	l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 32, FirstBytes: 16, Align: 16})
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.Alloc(a, "grads")
	if err != nil {
		t.Fatal(err)
	}
	c := &doubling{}
	r, err := NewReducer(e, c, l, g, Sum)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Free()
	if err := r.Compress(a, "stage", tensor.F16); !errors.Is(err, ErrArg) {
		t.Errorf("f16: %v", err)
	}
	if err := r.Compress(a, "stage", tensor.BF16); err != nil {
		t.Fatal(err)
	}
	if want := (l.Buckets[0].Numel*2+15)/16*16 + (l.Buckets[2].Numel*2+15)/16*16; l.Buckets[1].DType != tensor.BF16 ||
		r.stageBuf == nil || r.stageBuf.Size() != int64(want) {
		t.Fatalf("buckets %+v; staging of %v bytes", l.Buckets, r.stageBuf)
	}
	in := make([][]float32, len(ps))
	for i, p := range ps {
		in[i] = make([]float32, tensor.Numel(p.Shape))
		for j := range in[i] {
			in[i][j] = 1 + float32(10*i+j)/1000 // not bf16 numbers
		}
	}
	step := func() {
		t.Helper()
		c.seen = nil
		for i := range ps {
			if err := g.Params[i].WriteFloat32(in[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Ready(2, 1); err != nil {
			t.Fatal(err)
		}
		if err := r.Compress(a, "stage", tensor.F32); !errors.Is(err, ErrArg) {
			t.Errorf("Compress during a step: %v", err)
		}
		if err := r.Ready(0); err != nil {
			t.Fatal(err)
		}
		if err := r.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	step()
	want := []string{fmt.Sprintf("sum bf16 ×%d", l.Buckets[0].Numel), fmt.Sprintf("sum bf16 ×%d", l.Buckets[1].Numel),
		fmt.Sprintf("sum bf16 ×%d", l.Buckets[2].Numel)}
	if !reflect.DeepEqual(c.seen, want) {
		t.Fatalf("reduced %q, want %q", c.seen, want)
	}
	for i := range ps {
		w := tensor.RoundBF16(slices.Clone(in[i]))
		for j := range w {
			w[j] *= 2
		}
		if got := values(t, g.Params[i]); !reflect.DeepEqual(got, w) {
			t.Fatalf("compressed: gradient %s %v, want %v", ps[i].Name, got, w)
		}
	}
	// Back to f32: the f32 buckets are reduced in place, unrounded.
	if err := r.Compress(a, "stage", tensor.F32); err != nil {
		t.Fatal(err)
	}
	if r.stage != nil || r.stageBuf != nil {
		t.Fatal("staging kept after Compress(F32)")
	}
	step()
	if want[0], want[2] = strings.Replace(want[0], "bf16", "f32", 1), strings.Replace(want[2], "bf16", "f32", 1); !reflect.DeepEqual(c.seen, want) {
		t.Fatalf("reduced %q, want %q", c.seen, want)
	}
	for _, i := range []int{0, 2} {
		w := slices.Clone(in[i])
		for j := range w {
			w[j] *= 2
		}
		if got := values(t, g.Params[i]); !reflect.DeepEqual(got, w) {
			t.Fatalf("f32: gradient %s %v, want %v", ps[i].Name, got, w)
		}
	}
	// One rank: nothing to stage.
	solo, err := NewReducer(e, Solo(e.Device()), l, g, Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := solo.Compress(a, "stage", tensor.BF16); err != nil || solo.stageBuf != nil {
		t.Fatalf("solo: %v, staging %v", err, solo.stageBuf)
	}
}
