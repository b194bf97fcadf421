package nccl

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"gpukit/libgpu/dist"
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
	r.allReduce = func(b int, x *tensor.Tensor) error {
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
	r.allReduce = func(int, *tensor.Tensor) error { return boom }
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
