package tensor

import (
	"errors"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
)

// at is the value of a row-major iota tensor of shape at index idx through
// the view's strides: what element idx of a view must read.
func viewAt(t *Tensor, idx []int) int {
	off := t.Offset
	for d, i := range idx {
		off += i * t.Strides[d]
	}
	return off
}

func iota3(t *testing.T, shape ...int) *Tensor {
	t.Helper()
	x, err := Alloc(device.Local{Dev: device.NewHost()}, "", F32, shape...)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := x.F32()
	for i := range v {
		v[i] = float32(i)
	}
	return x
}

func TestPermuteTransposeNarrowSelect(t *testing.T) {
	x := iota3(t, 2, 3, 4) // x[i,j,k] = 12i + 4j + k
	p, err := x.Permute(2, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !SameShape(p.Shape, []int{4, 2, 3}) || p.Contiguous() {
		t.Fatalf("permute: shape %v contiguous %v", p.Shape, p.Contiguous())
	}
	got, err := p.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	// p[k,i,j] = x[i,j,k]
	n := 0
	for k := 0; k < 4; k++ {
		for i := 0; i < 2; i++ {
			for j := 0; j < 3; j++ {
				if want := float32(12*i + 4*j + k); got[n] != want {
					t.Fatalf("permute[%d,%d,%d] = %v, want %v", k, i, j, got[n], want)
				}
				n++
			}
		}
	}
	tr, err := x.Transpose(-1, 0)
	if err != nil || !SameShape(tr.Shape, []int{4, 3, 2}) {
		t.Fatalf("transpose %v %v", tr, err)
	}
	if viewAt(tr, []int{3, 1, 1}) != 12+4+3 {
		t.Fatalf("transpose offset %d", viewAt(tr, []int{3, 1, 1}))
	}
	nw, err := x.Narrow(1, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = nw.ReadFloat32()
	want := []float32{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("narrow = %v, want %v", got, want)
		}
	}
	s, err := x.Select(2, 3)
	if err != nil || !SameShape(s.Shape, []int{2, 3}) {
		t.Fatalf("select %v %v", s, err)
	}
	got, _ = s.ReadFloat32()
	for i, w := range []float32{3, 7, 11, 15, 19, 23} {
		if got[i] != w {
			t.Fatalf("select = %v", got)
		}
	}
	for _, bad := range []func() error{
		func() error { _, err := x.Permute(0, 0, 1); return err },
		func() error { _, err := x.Permute(0, 1); return err },
		func() error { _, err := x.Narrow(1, 2, 2); return err },
		func() error { _, err := x.Select(0, 2); return err },
		func() error { _, err := x.Transpose(0, 3); return err },
	} {
		if err := bad(); !errors.Is(err, ErrShape) {
			t.Fatalf("bad view: %v", err)
		}
	}
}

func TestViewSplitsAndMerges(t *testing.T) {
	x := iota3(t, 2, 3, 4)
	// Split the last dimension of a contiguous tensor, infer one size.
	v, err := x.View(2, -1, 2, 2)
	if err != nil || !SameShape(v.Shape, []int{2, 3, 2, 2}) {
		t.Fatalf("view %v %v", v, err)
	}
	// A transposed tensor's dimensions cannot be merged without a copy...
	tr, _ := x.Transpose(1, 2) // [2,4,3]
	if _, err := tr.View(2, 12); !errors.Is(err, ErrLayout) {
		t.Fatalf("merge of transposed dims: %v", err)
	}
	// ...but its outer dimension can be split, and a narrowed last dim
	// merged with nothing.
	sp, err := tr.View(1, 2, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := tr.ReadFloat32()
	b, _ := sp.ReadFloat32()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("split view differs at %d", i)
		}
	}
	// The qkv pattern: [B,T,3C] narrowed to the q part, viewed as [B,T,H,D].
	qkv := iota3(t, 2, 5, 12)
	k, _ := qkv.Narrow(2, 4, 4)
	kh, err := k.View(2, 5, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !SameShape(kh.Strides, []int{60, 12, 2, 1}) || kh.Offset != 4 {
		t.Fatalf("qkv head view strides %v offset %d", kh.Strides, kh.Offset)
	}
	if _, err := x.View(5, -1); !errors.Is(err, ErrShape) {
		t.Fatalf("bad count: %v", err)
	}
	u, err := x.Unsqueeze(-1)
	if err != nil || !SameShape(u.Shape, []int{2, 3, 4, 1}) {
		t.Fatalf("unsqueeze %v %v", u, err)
	}
}

func TestWriteReadFloat32Strided(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for _, dt := range []DType{F32, BF16, F16} {
		x, err := Alloc(device.Local{Dev: device.NewHost()}, "", dt, 3, 4, 5)
		if err != nil {
			t.Fatal(err)
		}
		full := make([]float32, 60)
		if err := x.WriteFloat32(full); err != nil {
			t.Fatal(err)
		}
		v, _ := x.Permute(2, 0, 1)
		v, _ = v.Narrow(0, 1, 3) // [3,3,4] strided
		vals := make([]float32, v.Numel())
		for i := range vals {
			vals[i] = float32(r.NormFloat64())
		}
		if err := v.WriteFloat32(vals); err != nil {
			t.Fatal(err)
		}
		got, err := v.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		for i := range vals {
			want := vals[i]
			switch dt {
			case BF16:
				want = BF16ToF32(BF16FromF32(want))
			case F16:
				want = F16ToF32(F16FromF32(want))
			}
			if got[i] != want {
				t.Fatalf("%v: element %d = %v, want %v", dt, i, got[i], want)
			}
		}
		// Elements outside the view stay zero.
		all, _ := x.ReadFloat32()
		nonzero := 0
		for _, a := range all {
			if a != 0 {
				nonzero++
			}
		}
		if nonzero > v.Numel() {
			t.Fatalf("%v: %d elements written, view has %d", dt, nonzero, v.Numel())
		}
	}
}
