package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/device"
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
	if e := opstest.RelErr(got, fd); !(e < 2e-2) {
		t.Fatalf("gradients vs finite differences: relative error %.3g", e)
	}
	t.Logf("%d coordinates, relative error %.2g", len(got), opstest.RelErr(got, fd))
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
		if e := opstest.RelErr(opstest.F64(got), opstest.F64(want)); !(e < 1e-5) {
			t.Fatalf("position %d: decoder logits differ from the full forward (relative %.3g)", p, e)
		}
	}
}
