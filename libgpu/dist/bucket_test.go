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
		if r.IntN(2) == 0 {
			cfg.LastBytes = int64(1 + r.IntN(3000))
		}
		if r.IntN(2) == 0 {
			cfg.Shards = 1 + r.IntN(8)
		}
		l, err := Plan(ps, cfg)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		checkLayout(t, l, cfg)
		checkSegments(t, l)
		if t.Failed() {
			t.Fatalf("trial %d (seed %d): %+v with %+v", trial, seed, ps, cfg)
		}
	}
}

// checkLayout verifies a plan against its definition: every gradient in
// exactly one bucket of its dtype, buckets in reverse parameter order,
// gradients aligned, disjoint and inside their bucket, buckets aligned and
// back to back (and a multiple of Shards aligned parts), each bucket
// closed exactly when it reached its limit, except that with LastBytes the
// leading parameters of each dtype that fit in it (at least one) make the
// dtype's last bucket, whatever its size, and the bucket before it closes
// where they begin.
func checkLayout(t *testing.T, l *Layout, cfg BucketConfig) {
	t.Helper()
	if l.Shards != max(cfg.Shards, 1) {
		t.Errorf("layout of %d shards, configured %d", l.Shards, cfg.Shards)
	}
	// The tail: per dtype, the leading parameters whose aligned bytes fit
	// in LastBytes (at least one).
	inTail := make([]bool, len(l.Params))
	if cfg.LastBytes > 0 {
		filled, stop := map[tensor.DType]int64{}, map[tensor.DType]bool{}
		for i, p := range l.Params {
			if stop[p.DType] {
				continue
			}
			first := filled[p.DType] == 0
			end := (filled[p.DType]+l.Align-1)/l.Align*l.Align + int64(tensor.Numel(p.Shape)*p.DType.Size())
			if end > cfg.LastBytes && !first {
				stop[p.DType] = true
				continue
			}
			inTail[i], filled[p.DType] = true, end
		}
	}
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
		if b.Offset != off || b.Offset%l.Align != 0 || b.Bytes()%(l.Align*int64(l.Shards)) != 0 {
			t.Errorf("bucket %d at %d, %d bytes (want at %d, %d-aligned, %d parts)", bi, b.Offset, b.Bytes(), off, l.Align, l.Shards)
		}
		tail := len(b.Params) > 0 && inTail[b.Params[0]]
		for _, i := range b.Params {
			if inTail[i] != tail {
				t.Errorf("bucket %d mixes the last bucket's parameters with others: %v", bi, b.Params)
			}
		}
		if tail && bi != lastOfType[b.DType] {
			t.Errorf("bucket %d holds the leading parameters %v but is not its dtype's last", bi, b.Params)
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
			if full && !last && !tail {
				t.Errorf("bucket %d reached its limit %d at param %d but went on", bi, limit, i)
			}
			beforeTail := i > 0 && inTail[i-1] && l.Params[i-1].DType == b.DType
			for j := i - 1; j >= 0 && !beforeTail; j-- { // the next parameter of this dtype
				if l.Params[j].DType == b.DType {
					beforeTail = inTail[j]
					break
				}
			}
			if last && !full && bi != lastOfType[b.DType] && !beforeTail {
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

// checkSegments verifies Part and Segments: the parts of a bucket are
// equal, aligned and tile it; every element of every parameter is in
// exactly one segment of one rank, inside that rank's part, at its slot.
func checkSegments(t *testing.T, l *Layout) {
	t.Helper()
	covered := make([][]int, len(l.Params))
	for i, p := range l.Params {
		covered[i] = make([]int, tensor.Numel(p.Shape))
	}
	for b, bk := range l.Buckets {
		es := int64(bk.DType.Size())
		next := 0
		for r := range l.Shards {
			off, n := l.Part(b, r)
			if off != next || n*l.Shards != bk.Numel || int64(off)*es%l.Align != 0 {
				t.Errorf("bucket %d (%d elements): part %d at %d of %d", b, bk.Numel, r, off, n)
			}
			next = off + n
		}
	}
	for r := range l.Shards {
		prev := Segment{Bucket: -1}
		for _, s := range l.Segments(r) {
			off, n := l.Part(s.Bucket, r)
			slot := l.Slots[s.Param]
			if s.Bucket != slot.Bucket || s.At != slot.Offset+s.Offset || s.Numel <= 0 || s.At < off || s.At+s.Numel > off+n {
				t.Errorf("rank %d: segment %+v outside its part [%d, %d) or its slot %+v", r, s, off, off+n, slot)
				continue
			}
			if s.Bucket < prev.Bucket || s.Bucket == prev.Bucket && s.At < prev.At+prev.Numel {
				t.Errorf("rank %d: segment %+v after %+v", r, s, prev)
			}
			prev = s
			for k := range s.Numel {
				covered[s.Param][s.Offset+k]++
			}
		}
	}
	for i, c := range covered {
		for k, n := range c {
			if n != 1 {
				t.Fatalf("element %d of param %d in %d segments", k, i, n)
			}
		}
	}
}

// TestPlanLastBucket: with LastBytes the embeddings (the parameters the
// backward finishes last) get a small bucket of their own; without it,
// the position embedding shares the last block's bucket (which closes
// at 25 MiB with it).
func TestPlanLastBucket(t *testing.T) {
	d := 768
	ps := []Param{f32("wte", 65, d), f32("wpe", 1024, d)}
	for l := range 2 {
		ps = append(ps, f32(fmt.Sprintf("h%d.ln1.w", l), d), f32(fmt.Sprintf("h%d.attn.w", l), 3*d, d),
			f32(fmt.Sprintf("h%d.mlp.fc", l), 4*d, d))
	}
	names := func(l *Layout) [][]string {
		var got [][]string
		for _, b := range l.Buckets {
			var n []string
			for _, i := range b.Params {
				n = append(n, ps[i].Name)
			}
			got = append(got, n)
		}
		return got
	}
	cfg := BucketConfig{Bytes: 25 << 20, FirstBytes: 1 << 20}
	l, err := Plan(ps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"h1.mlp.fc"}, {"h1.attn.w", "h1.ln1.w", "h0.mlp.fc", "h0.attn.w", "h0.ln1.w", "wpe"}, {"wte"}}
	if got := names(l); !reflect.DeepEqual(got, want) {
		t.Fatalf("without LastBytes:\n got %q\nwant %q", got, want)
	}
	cfg.LastBytes = int64(65*d*4 + 1024*d*4) // wte and wpe fit exactly (wte ends aligned), h0.ln1.w not
	if l, err = Plan(ps, cfg); err != nil {
		t.Fatal(err)
	}
	want = [][]string{{"h1.mlp.fc"}, {"h1.attn.w", "h1.ln1.w", "h0.mlp.fc", "h0.attn.w", "h0.ln1.w"}, {"wpe", "wte"}}
	if got := names(l); !reflect.DeepEqual(got, want) {
		t.Fatalf("LastBytes of wte and wpe:\n got %q\nwant %q", got, want)
	}
	checkLayout(t, l, cfg)
	cfg.LastBytes = 1 // smaller than any parameter: the first one alone
	if l, err = Plan(ps, cfg); err != nil {
		t.Fatal(err)
	}
	if got := names(l); !reflect.DeepEqual(got[len(got)-1], []string{"wte"}) {
		t.Fatalf("LastBytes 1: buckets %q, want wte alone last", got)
	}
	checkLayout(t, l, cfg)
}

// TestPlanShards: buckets cut into 3 parts are padded to a multiple of 3
// aligned parts; rank 1's segments of a small layout are as worked out by
// hand.
func TestPlanShards(t *testing.T) {
	// One bucket of 10 + 3 f32 (align 16 bytes: 4 elements): slots a at
	// 0..10, b at 12..15; 16 elements → padded to 24 (3 × 8).
	l, err := Plan([]Param{f32("b", 3), f32("a", 10)}, BucketConfig{Bytes: 1 << 20, FirstBytes: 1 << 20, Align: 16, Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Buckets) != 1 || l.Buckets[0].Numel != 24 || l.Bytes != 96 {
		t.Fatalf("buckets %+v, %d bytes", l.Buckets, l.Bytes)
	}
	want := [][]Segment{
		{{Param: 1, Bucket: 0, Offset: 0, At: 0, Numel: 8}},
		{{Param: 1, Bucket: 0, Offset: 8, At: 8, Numel: 2}, {Param: 0, Bucket: 0, Offset: 0, At: 12, Numel: 3}},
		nil,
	}
	for r := range 3 {
		if got := l.Segments(r); !reflect.DeepEqual(got, want[r]) {
			t.Errorf("rank %d: segments %+v, want %+v", r, got, want[r])
		}
	}
	checkSegments(t, l)
	a := device.Local{Dev: device.NewHost()}
	g, err := l.Alloc(a, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	p, err := l.PartView(g.Buckets[0], 0, 2)
	if err != nil || p.Numel() != 8 || p.Offset != 16 {
		t.Fatalf("part 2: %v, %v", p, err)
	}
}

func TestPlanErrors(t *testing.T) {
	for name, c := range map[string]struct {
		ps  []Param
		cfg BucketConfig
	}{
		"no params":       {nil, BucketConfig{}},
		"empty param":     {[]Param{f32("a", 3, 0)}, BucketConfig{}},
		"negative dim":    {[]Param{f32("a", -3, -2)}, BucketConfig{}},
		"bad dtype":       {[]Param{{Name: "a", Shape: []int{3}}}, BucketConfig{}},
		"align 8":         {[]Param{f32("a", 3)}, BucketConfig{Align: 8}},
		"align 48":        {[]Param{f32("a", 3)}, BucketConfig{Align: 48}},
		"negative limit":  {[]Param{f32("a", 3)}, BucketConfig{Bytes: -1}},
		"negative first":  {[]Param{f32("a", 3)}, BucketConfig{FirstBytes: -5}},
		"negative last":   {[]Param{f32("a", 3)}, BucketConfig{LastBytes: -5}},
		"negative shards": {[]Param{f32("a", 3)}, BucketConfig{Shards: -2}},
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
