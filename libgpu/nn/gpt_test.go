package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// nanoGPTNames is nanoGPT's state-dict for a GPT of l layers, d model width,
// v vocabulary and b block, written out from its model.py (not from our
// spec list): name → shape.
func nanoGPTNames(l, d, v, b int, bias bool) map[string][]int {
	m := map[string][]int{
		"transformer.wte.weight": {v, d}, "transformer.wpe.weight": {b, d},
		"transformer.ln_f.weight": {d}, "lm_head.weight": {v, d},
	}
	if bias {
		m["transformer.ln_f.bias"] = []int{d}
	}
	for i := 0; i < l; i++ {
		p := fmt.Sprintf("transformer.h.%d.", i)
		m[p+"ln_1.weight"], m[p+"ln_2.weight"] = []int{d}, []int{d}
		m[p+"attn.c_attn.weight"], m[p+"attn.c_proj.weight"] = []int{3 * d, d}, []int{d, d}
		m[p+"mlp.c_fc.weight"], m[p+"mlp.c_proj.weight"] = []int{4 * d, d}, []int{d, 4 * d}
		if bias {
			m[p+"ln_1.bias"], m[p+"ln_2.bias"] = []int{d}, []int{d}
			m[p+"attn.c_attn.bias"], m[p+"attn.c_proj.bias"] = []int{3 * d}, []int{d}
			m[p+"mlp.c_fc.bias"], m[p+"mlp.c_proj.bias"] = []int{4 * d}, []int{d}
		}
	}
	return m
}

func TestGPTStateDictMatchesNanoGPT(t *testing.T) {
	for _, bias := range []bool{false, true} {
		cfg := nn.GPTConfig{Vocab: 65, Layers: 3, Heads: 4, DModel: 32, Block: 16, Bias: bias}
		m, err := nn.NewGPT(device.Local{Dev: device.NewHost()}, "", cfg, false, 1)
		if err != nil {
			t.Fatal(err)
		}
		want := nanoGPTNames(3, 32, 65, 16, bias)
		got := map[string][]int{}
		for _, p := range m.StateDict() {
			got[p.Name] = p.Value.Shape
		}
		if len(got) != len(want) {
			t.Errorf("bias=%v: %d tensors, nanoGPT has %d", bias, len(got), len(want))
		}
		for n, s := range want {
			if !slices.Equal(got[n], s) {
				t.Errorf("bias=%v: %s is %v, want %v", bias, n, got[n], s)
			}
		}
		// nanoGPT's count excludes wpe and counts the tied head once.
		n := 0
		for name, s := range want {
			if name != "lm_head.weight" && name != "transformer.wpe.weight" {
				n += tensor.Numel(s)
			}
		}
		if m.NumParams(true) != n {
			t.Errorf("bias=%v: NumParams %d, want %d", bias, m.NumParams(true), n)
		}
		// Residual projections have the smaller initial scale.
		p, _ := m.Param("transformer.h.0.mlp.c_proj.weight")
		v, _ := p.Value.F32()
		var ss float64
		for _, x := range v {
			ss += float64(x) * float64(x)
		}
		std := math.Sqrt(ss / float64(len(v)))
		if want := 0.02 / math.Sqrt(6); math.Abs(std-want) > 0.2*want {
			t.Errorf("c_proj std %.4f, want ≈ %.4f", std, want)
		}
		m.Free()
	}
}

// tinyGPT builds a small GPT and its training step on the host.
func tinyGPT(t *testing.T, cfg nn.GPTConfig, batch int, grads bool) (*nn.GPT, *nn.GPTStep, *ops.Engine) {
	t.Helper()
	host := device.NewHost()
	a := device.Local{Dev: host}
	e, err := ops.NewEngine(host, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := nn.NewGPT(a, "", cfg, grads, 7)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Record(e, a, "", batch, ops.GraphOptions{}, grads)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Free(); m.Free() })
	return m, s, e
}

func randTokens(r *rand.Rand, n, v int) []int32 {
	x := make([]int32, n)
	for i := range x {
		x[i] = int32(r.IntN(v))
	}
	return x
}

// TestGPTGradientsFiniteDifferences: every parameter's gradient of a
// 2-layer GPT (tied head, residual fan-out, attention, layernorms) agrees
// with central finite differences of the loss at sampled coordinates.
func TestGPTGradientsFiniteDifferences(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	cfg := nn.GPTConfig{Vocab: 11, Layers: 2, Heads: 2, DModel: 8, Block: 5, Bias: true}
	m, s, _ := tinyGPT(t, cfg, 3, true)
	// Larger weights than the 0.02 initialisation, so every path matters.
	for _, p := range m.Params() {
		v, _ := p.Value.F32()
		for i := range v {
			v[i] += float32(0.3 * r.NormFloat64())
		}
	}
	if err := s.Idx.Write(tensor.AsBytes(randTokens(r, 15, 11))); err != nil {
		t.Fatal(err)
	}
	if err := s.Targets.Write(tensor.AsBytes(randTokens(r, 15, 11))); err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		if err := s.Graph.Forward(); err != nil {
			t.Fatal(err)
		}
		l, _ := s.Loss.F32()
		return float64(l[0])
	}
	loss()
	if err := s.Graph.Backward(); err != nil {
		t.Fatal(err)
	}
	var got, fd []float64
	for _, p := range m.Params() {
		v, _ := p.Value.F32()
		g, _ := p.Grad.F32()
		grad := append([]float32(nil), g...)
		for k := 0; k < 4; k++ {
			i := r.IntN(len(v))
			old := v[i]
			const h = 1e-2
			v[i] = old + h
			up := loss()
			v[i] = old - h
			dn := loss()
			v[i] = old
			got = append(got, float64(grad[i]))
			fd = append(fd, (up-dn)/(2*h))
		}
	}
	if e := opstest.TermsErr(got, fd, nil); !(e < 2e-2) {
		t.Fatalf("gradients vs finite differences: relative error %.3g", e)
	}
	t.Logf("%d coordinates, relative error %.2g", len(got), opstest.TermsErr(got, fd, nil))
}

// TestGPTDecoderMatchesForward: the KV-cache decoder's logits at every
// position equal the full forward's logits of the same sequence.
func TestGPTDecoderMatchesForward(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 12))
	cfg := nn.GPTConfig{Vocab: 13, Layers: 2, Heads: 2, DModel: 16, Block: 9}
	m, s, e := tinyGPT(t, cfg, 1, false)
	for _, p := range m.Params() {
		v, _ := p.Value.F32()
		for i := range v {
			v[i] += float32(0.2 * r.NormFloat64())
		}
	}
	toks := randTokens(r, cfg.Block, cfg.Vocab)
	if err := s.Idx.Write(tensor.AsBytes(toks)); err != nil {
		t.Fatal(err)
	}
	if err := s.Targets.Write(tensor.AsBytes(toks)); err != nil {
		t.Fatal(err)
	}
	if err := s.Graph.Forward(); err != nil {
		t.Fatal(err)
	}
	full, err := s.Logits.Value.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.NewDecoder(e, device.Local{Dev: device.NewHost()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	for p, tok := range toks {
		if err := d.Token.Write(tensor.AsBytes([]int32{tok})); err != nil {
			t.Fatal(err)
		}
		if err := d.Pos.Write(tensor.AsBytes([]int32{int32(p)})); err != nil {
			t.Fatal(err)
		}
		if err := d.Step(); err != nil {
			t.Fatal(err)
		}
		got, _ := d.Logits.ReadFloat32()
		want := full[p*cfg.Vocab : (p+1)*cfg.Vocab]
		if e := opstest.TermsErr(opstest.F64(got), opstest.F64(want), nil); !(e < 1e-5) {
			t.Fatalf("position %d: decoder logits differ from the full forward (relative %.3g)", p, e)
		}
	}
}

// TestGPTGradsInBuckets: a GPT whose gradients live in dist.Layout's
// bucket buffers (SetGrads) computes bitwise the gradients of one with
// gradients of its own, and the training graph's OnGradReady reports every
// parameter once, with its final gradient, in the reverse of Params'
// order (the order dist.Plan fills buckets in, so each bucket's last
// gradient arrives before any of the next bucket's) and the tied token
// embedding last (the embedding's backward is its last writer, after the
// head's GEMM). With biases, the parameters are moved into bucket storage
// too (SetParams, ZeRO-1's layout), and the gradients must not change.
func TestGPTGradsInBuckets(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 13))
	for _, bias := range []bool{false, true} {
		cfg := nn.GPTConfig{Vocab: 11, Layers: 2, Heads: 2, DModel: 8, Block: 5, Bias: bias}
		own, s1, _ := tinyGPT(t, cfg, 3, true)
		host := device.NewHost()
		a := device.Local{Dev: host}
		e, err := ops.NewEngine(host, ops.Options{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := nn.NewGPT(a, "", cfg, false, 7)
		if err != nil {
			t.Fatal(err)
		}
		var ps []dist.Param
		for _, p := range m.Params() {
			ps = append(ps, dist.Param{Name: p.Name, DType: tensor.F32, Shape: p.Value.Shape})
		}
		l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 1 << 10, FirstBytes: 256})
		if err != nil {
			t.Fatal(err)
		}
		g, err := l.Alloc(a, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetGrads(g.Params); err != nil {
			t.Fatal(err)
		}
		if err := m.SetGrads(g.Params); err == nil {
			t.Fatal("SetGrads twice: no error")
		}
		if bias {
			// The parameters too in bucket storage (ZeRO-1's layout: the
			// gradients' plan, here cut in 3 parts).
			pl, err := dist.Plan(ps, dist.BucketConfig{Bytes: 1 << 10, FirstBytes: 256, Shards: 3})
			if err != nil {
				t.Fatal(err)
			}
			pv, err := pl.Alloc(a, "")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pv.Free() })
			if err := m.SetParams(pv.Params[1:]); err == nil {
				t.Fatal("SetParams of too few tensors: no error")
			}
			if err := m.SetParams(pv.Params); err != nil {
				t.Fatal(err)
			}
			for i, p := range m.Params() {
				want, _ := own.Params()[i].Value.ReadFloat32()
				got, _ := p.Value.ReadFloat32()
				if p.Value != pv.Params[i] || !slices.Equal(got, want) {
					t.Fatalf("%s after SetParams: not the given storage, or other values", p.Name)
				}
				if q, _ := m.Param(p.Name); q.Value != pv.Params[i] {
					t.Fatalf("Param(%q) is not the given storage", p.Name)
				}
			}
		}
		s2, err := m.Record(e, a, "", 3, ops.GraphOptions{}, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s2.Free(); m.Free(); g.Free() })
		if len(l.Buckets) < 3 {
			t.Fatalf("%d buckets: the test wants several", len(l.Buckets))
		}
		idx := map[string]int{}
		for i, p := range m.Params() {
			idx[p.Name] = i
		}
		var order []int
		atReady := map[int][]float32{}
		s2.Graph.Tape().OnGradReady(func(v *ops.Var) error {
			i, ok := idx[v.Name]
			if !ok {
				t.Fatalf("hook reports %s, not a parameter", v.Name)
			}
			order = append(order, i)
			atReady[i], _ = v.Grad.ReadFloat32()
			return nil
		})
		for step := range 2 {
			x, y := randTokens(r, 15, 11), randTokens(r, 15, 11)
			for _, s := range []*nn.GPTStep{s1, s2} {
				if err := s.Idx.Write(tensor.AsBytes(x)); err != nil {
					t.Fatal(err)
				}
				if err := s.Targets.Write(tensor.AsBytes(y)); err != nil {
					t.Fatal(err)
				}
				if err := s.Graph.Forward(); err != nil {
					t.Fatal(err)
				}
				if err := s.Graph.Backward(); err != nil {
					t.Fatal(err)
				}
			}
			n := len(m.Params())
			if len(order) != n {
				t.Fatalf("bias %v step %d: %d parameters reported, want %d", bias, step, len(order), n)
			}
			if last := m.Params()[order[n-1]].Name; last != "transformer.wte.weight" {
				t.Fatalf("bias %v: %s reported last, want the tied transformer.wte.weight", bias, last)
			}
			for k, i := range order {
				if !bias && i != n-1-k {
					t.Fatalf("step %d: report %d is %s, want %s (the reverse of Params)", step, k, m.Params()[i].Name, m.Params()[n-1-k].Name)
				}
				p, q := own.Params()[i], m.Params()[i]
				a, _ := p.Grad.ReadFloat32()
				b, _ := q.Grad.ReadFloat32()
				if !slices.Equal(a, b) {
					t.Fatalf("bias %v step %d: %s's gradient in a bucket differs from its own buffer's", bias, step, p.Name)
				}
				if !slices.Equal(atReady[i], b) {
					t.Fatalf("bias %v step %d: %s's gradient when reported is not its final value", bias, step, p.Name)
				}
			}
			order = order[:0]
		}
	}
}
