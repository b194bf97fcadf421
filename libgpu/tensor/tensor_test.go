package tensor

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
)

func TestAllocViewsAndHostSlices(t *testing.T) {
	a := device.Local{Dev: device.NewHost()}
	x, err := Alloc(a, "x", F32, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := x.F32()
	for i := range v {
		v[i] = float32(i)
	}
	r, err := x.Rows(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	rv, _ := r.F32()
	if len(rv) != 6 || rv[0] != 3 || rv[5] != 8 {
		t.Fatalf("rows view %v", rv)
	}
	got, err := r.ReadF32()
	if err != nil || got[0] != 3 {
		t.Fatalf("read %v %v", got, err)
	}
	y, err := x.Reshape(12)
	if err != nil || y.Shape[0] != 12 {
		t.Fatal(err)
	}
	if _, err := x.Reshape(5); !errors.Is(err, ErrShape) {
		t.Fatalf("bad reshape: %v", err)
	}
	if _, err := x.I32(); !errors.Is(err, ErrDType) {
		t.Fatalf("wrong dtype view: %v", err)
	}
	if _, err := x.Rows(2, 5); !errors.Is(err, ErrShape) {
		t.Fatalf("rows past end: %v", err)
	}
	if err := x.CheckShape("x", F32, 4, 3); err != nil {
		t.Fatal(err)
	}
	if err := x.CheckShape("x", F32, 3, 4); !errors.Is(err, ErrShape) {
		t.Fatal(err)
	}
}

func TestParseDType(t *testing.T) {
	for _, d := range []DType{F32, BF16, F16, I32, I64, U8} {
		got, err := ParseDType(d.SafetensorsName())
		if err != nil || got != d {
			t.Fatalf("%v: %v %v", d, got, err)
		}
	}
	if _, err := ParseDType("f8"); err == nil {
		t.Fatal("f8 accepted")
	}
}

func TestHalfConversions(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		f := float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(6)-3)))
		b := BF16ToF32(BF16FromF32(f))
		if rel := math.Abs(float64(b-f)) / math.Abs(float64(f)); rel > 1.0/256 {
			t.Fatalf("bf16(%g) = %g, rel %g", f, b, rel)
		}
		h := F16ToF32(F16FromF32(f))
		if math.Abs(float64(f)) > 6.2e-5 && math.Abs(float64(f)) < 65000 {
			if rel := math.Abs(float64(h-f)) / math.Abs(float64(f)); rel > 1.0/2048 {
				t.Fatalf("f16(%g) = %g, rel %g", f, h, rel)
			}
		}
	}
	// Every f16 pattern round-trips through f32 (except NaN payloads).
	for u := 0; u < 1<<16; u++ {
		h := uint16(u)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if back := F16FromF32(F16ToF32(h)); back != h {
			t.Fatalf("f16 %#04x -> %g -> %#04x", h, F16ToF32(h), back)
		}
	}
	if !math.IsNaN(float64(BF16ToF32(BF16FromF32(float32(math.NaN()))))) {
		t.Fatal("bf16 NaN lost")
	}
}
