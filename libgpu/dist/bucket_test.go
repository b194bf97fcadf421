package dist

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

func f32(name string, shape ...int) Param { return Param{Name: name, DType: tensor.F32, Shape: shape} }

// TestPlanGPTLike: a small transformer's parameters, in forward order, go
// into buckets last layer first; the first bucket closes at 1 MiB, the
// next at 25 MiB; a gradient bigger than the limit closes its bucket.
func TestPlanGPTLike(t *testing.T) {
	d, v := 768, 50304
	ps := []Param{f32("wte", v, d), f32("wpe", 1024, d)}
	for l := range 2 {
		ps = append(ps,
			f32(fmt.Sprintf("h%d.ln1.w", l), d), f32(fmt.Sprintf("h%d.attn.w", l), 3*d, d),
			f32(fmt.Sprintf("h%d.attn.proj", l), d, d), f32(fmt.Sprintf("h%d.mlp.fc", l), 4*d, d),
			f32(fmt.Sprintf("h%d.mlp.proj", l), d, 4*d))
	}
	ps = append(ps, f32("lnf.w", d))
	l, err := Plan(ps, BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, b := range l.Buckets {
		var names []string
		for _, i := range b.Params {
			names = append(names, ps[i].Name)
		}
		got = append(got, names)
	}
	want := [][]string{
		// lnf.w (3 KiB) + h1.mlp.proj (9 MiB) passes 1 MiB: the first bucket.
		{"lnf.w", "h1.mlp.proj"},
		// 9 + 2.25 + 6.75 + 3 MiB = 21 MiB < 25, + h0.mlp.proj's 9: closes.
		{"h1.mlp.fc", "h1.attn.proj", "h1.attn.w", "h1.ln1.w", "h0.mlp.proj"},
		{"h0.mlp.fc", "h0.attn.proj", "h0.attn.w", "h0.ln1.w", "wpe", "wte"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("buckets\n got %q\nwant %q", got, want)
	}
	checkLayout(t, l, BucketConfig{Bytes: DefaultBucketBytes, FirstBytes: DefaultFirstBucketBytes, Align: DefaultAlign})
}

// TestPlanDTypes: each dtype fills buckets of its own, each with a small
// first bucket.
func TestPlanDTypes(t *testing.T) {
	ps := []Param{
		{"a", tensor.F32, []int{100}}, {"b", tensor.BF16, []int{300}}, {"c", tensor.F32, []int{100}},
		{"d", tensor.BF16, []int{10}}, {"e", tensor.F32, []int{50}},
	}
	cfg := BucketConfig{Bytes: 1000, FirstBytes: 200, Align: 16}
	l, err := Plan(ps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []Bucket{
		{DType: tensor.F32, Params: []int{4}, Numel: 52, Offset: 0},        // e: 200 B ≥ 200 closes at once (padded to 208)
		{DType: tensor.BF16, Params: []int{3, 1}, Numel: 320, Offset: 208}, // d: 20 B, b at 32: 632 ≥ 200 (padded to 640)
		{DType: tensor.F32, Params: []int{2, 0}, Numel: 200, Offset: 848},  // c, a: 800 < 1000, left open
	}
	if !reflect.DeepEqual(l.Buckets, want) {
		t.Fatalf("buckets\n got %+v\nwant %+v", l.Buckets, want)
	}
	wantSlots := []Slot{{2, 100}, {1, 16}, {2, 0}, {1, 0}, {0, 0}}
	if !reflect.DeepEqual(l.Slots, wantSlots) || l.Bytes != 1648 {
		t.Fatalf("slots %+v, %d bytes", l.Slots, l.Bytes)
	}
	checkLayout(t, l, cfg)
}

// TestPlanRandom checks the layout's invariants over random parameter
// lists and limits.
func TestPlanRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	dts := []tensor.DType{tensor.F32, tensor.BF16, tensor.F16}
	for trial := range 300 {
		n := 1 + r.IntN(40)
		ps := make([]Param, n)
		for i := range ps {
			shape := []int{1 + r.IntN(300)}
			if r.IntN(2) == 0 {
				shape = append(shape, 1+r.IntN(50))
			}
			ps[i] = Param{Name: fmt.Sprint("p", i), DType: dts[r.IntN(len(dts))], Shape: shape}
		}
		cfg := BucketConfig{Bytes: int64(1 + r.IntN(20000)), FirstBytes: int64(1 + r.IntN(5000)), Align: int64(16 << r.IntN(5))}
		l, err := Plan(ps, cfg)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		checkLayout(t, l, cfg)
		if t.Failed() {
			t.Fatalf("trial %d (seed %d): %+v with %+v", trial, seed, ps, cfg)
		}
	}
}

// checkLayout verifies a plan against its definition: every gradient in
// exactly one bucket of its dtype, buckets in reverse parameter order,
// gradients aligned, disjoint and inside their bucket, buckets aligned and
// back to back, and each bucket closed exactly when it reached its limit.
func checkLayout(t *testing.T, l *Layout, cfg BucketConfig) {
	t.Helper()
	seen := make([]int, len(l.Params))
	var off int64
	closedPerType := map[tensor.DType]int{}
	lastOfType := map[tensor.DType]int{}
	for bi, b := range l.Buckets {
		lastOfType[b.DType] = bi
	}
	prevFirst := len(l.Params)
	for bi, b := range l.Buckets {
		es := int64(b.DType.Size())
		if b.Offset != off || b.Offset%l.Align != 0 || b.Bytes()%l.Align != 0 {
			t.Errorf("bucket %d at %d, %d bytes (want at %d, %d-aligned)", bi, b.Offset, b.Bytes(), off, l.Align)
		}
		off += b.Bytes()
		if len(b.Params) == 0 || b.Params[0] >= prevFirst {
			t.Errorf("bucket %d starts with param %v after a bucket starting at %d", bi, b.Params, prevFirst)
		}
		if len(b.Params) > 0 {
			prevFirst = b.Params[0]
		}
		var end int64 // bytes filled
		for k, i := range b.Params {
			seen[i]++
			p, s := l.Params[i], l.Slots[i]
			if p.DType != b.DType || s.Bucket != bi {
				t.Errorf("param %d (%v) in bucket %d (%v), slot %+v", i, p.DType, bi, b.DType, s)
			}
			if k > 0 && i >= b.Params[k-1] {
				t.Errorf("bucket %d not in reverse order: %v", bi, b.Params)
			}
			start := int64(s.Offset) * es
			if start%l.Align != 0 || start < end || start >= end+l.Align && start != 0 {
				t.Errorf("param %d at byte %d of bucket %d after %d filled (align %d)", i, start, bi, end, l.Align)
			}
			end = start + int64(tensor.Numel(p.Shape))*es
			if end > b.Bytes() {
				t.Errorf("param %d runs past bucket %d", i, bi)
			}
			limit := cfg.Bytes
			if closedPerType[b.DType] == 0 {
				limit = cfg.FirstBytes
			}
			full := end >= limit
			last := k == len(b.Params)-1
			if full && !last {
				t.Errorf("bucket %d reached its limit %d at param %d but went on", bi, limit, i)
			}
			if last && !full && bi != lastOfType[b.DType] {
				t.Errorf("bucket %d closed below its limit %d (%d bytes)", bi, limit, end)
			}
		}
		closedPerType[b.DType]++
	}
	if off != l.Bytes {
		t.Errorf("layout bytes %d, buckets sum to %d", l.Bytes, off)
	}
	for i, n := range seen {
		if n != 1 {
			t.Errorf("param %d in %d buckets", i, n)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	for name, c := range map[string]struct {
		ps  []Param
		cfg BucketConfig
	}{
		"no params":      {nil, BucketConfig{}},
		"empty param":    {[]Param{f32("a", 3, 0)}, BucketConfig{}},
		"negative dim":   {[]Param{f32("a", -3, -2)}, BucketConfig{}},
		"bad dtype":      {[]Param{{Name: "a", Shape: []int{3}}}, BucketConfig{}},
		"align 8":        {[]Param{f32("a", 3)}, BucketConfig{Align: 8}},
		"align 48":       {[]Param{f32("a", 3)}, BucketConfig{Align: 48}},
		"negative limit": {[]Param{f32("a", 3)}, BucketConfig{Bytes: -1}},
		"negative first": {[]Param{f32("a", 3)}, BucketConfig{FirstBytes: -5}},
	} {
		if _, err := Plan(c.ps, c.cfg); !errors.Is(err, ErrBucket) {
			t.Errorf("%s: %v, want ErrBucket", name, err)
		}
	}
}

// TestGradsViews: gradients written through their views land in their
// bucket at their slot; the padding stays zero; a buffer too small or
// misaligned is refused.
func TestGradsViews(t *testing.T) {
	ps := []Param{f32("w", 3, 5), {"b", tensor.BF16, []int{7}}, f32("v", 4), {"c", tensor.BF16, []int{2, 2}}}
	l, err := Plan(ps, BucketConfig{Bytes: 64, FirstBytes: 16, Align: 16})
	if err != nil {
		t.Fatal(err)
	}
	a := device.Local{Dev: device.NewHost()}
	g, err := l.Alloc(a, "grads")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	if len(g.Params) != len(ps) || len(g.Buckets) != len(l.Buckets) {
		t.Fatalf("%d param views, %d bucket views", len(g.Params), len(g.Buckets))
	}
	for i, p := range g.Params {
		if !reflect.DeepEqual(p.Shape, ps[i].Shape) || p.DType != ps[i].DType || !p.Contiguous() {
			t.Fatalf("view %d: %v %v", i, p.DType, p.Shape)
		}
		vals := make([]float32, p.Numel())
		for j := range vals {
			vals[j] = float32(10*(i+1) + j) // exact in bf16
		}
		if err := p.WriteFloat32(vals); err != nil {
			t.Fatal(err)
		}
	}
	for bi, b := range g.Buckets {
		got, err := b.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, len(got))
		for _, i := range l.Buckets[bi].Params {
			for j := range tensor.Numel(ps[i].Shape) {
				want[l.Slots[i].Offset+j] = float32(10*(i+1) + j)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("bucket %d holds %v, want %v (padding zero)", bi, got, want)
		}
	}
	small, err := a.Alloc("", l.Bytes-1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.View(small); !errors.Is(err, ErrBucket) {
		t.Errorf("View of a short buffer: %v", err)
	}
	big, err := a.Alloc("", l.Bytes+64)
	if err != nil {
		t.Fatal(err)
	}
	odd, err := big.View(8, l.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.View(odd); !errors.Is(err, ErrBucket) {
		t.Errorf("View of a misaligned buffer: %v", err)
	}
}
