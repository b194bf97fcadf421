package nn_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data/sudoku"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// hrmContractNames is the weights file of bench/reference/hrm.py's
// layout contract at the default architecture, written out from its
// docstring (not from HRMConfig.Tensors): name → shape, in tensor_names
// order.
func hrmContractNames() ([]string, map[string][]int) {
	names := []string{"inner.embed_tokens.embedding_weight", "inner.puzzle_emb.weights", "inner.lm_head.weight",
		"inner.q_head.weight", "inner.q_head.bias", "inner.H_init", "inner.L_init"}
	shapes := map[string][]int{names[0]: {11, 512}, names[1]: {1, 512}, names[2]: {11, 512}, names[3]: {2, 512},
		names[4]: {2}, names[5]: {512}, names[6]: {512}}
	for _, lv := range []string{"H", "L"} {
		for i := 0; i < 4; i++ {
			p := fmt.Sprintf("inner.%s_level.layers.%d.", lv, i)
			for _, t := range []struct {
				n  string
				sh []int
			}{{"self_attn.qkv_proj.weight", []int{1536, 512}}, {"self_attn.o_proj.weight", []int{512, 512}},
				{"mlp.gate_up_proj.weight", []int{3072, 512}}, {"mlp.down_proj.weight", []int{512, 1536}}} {
				names = append(names, p+t.n)
				shapes[p+t.n] = t.sh
			}
		}
	}
	return names, shapes
}

// TestHRMTensorNamesMatchTheContract: the default HRM's tensors are the
// contract's names and shapes in its order.
func TestHRMTensorNamesMatchTheContract(t *testing.T) {
	names, shapes := hrmContractNames()
	ts, _ := nn.DefaultHRM().Tensors()
	if len(ts) != len(names) {
		t.Fatalf("%d tensors, the contract has %d", len(ts), len(names))
	}
	for i, x := range ts {
		if x.Name != names[i] || !slices.Equal(x.Shape, shapes[x.Name]) {
			t.Errorf("tensor %d: %s %v, the contract's %s %v", i, x.Name, x.Shape, names[i], shapes[names[i]])
		}
	}
	if got := nn.DefaultHRM().Inter(); got != 1536 {
		t.Errorf("SwiGLU width %d, want 1536", got)
	}
}

func tinySudokuHRM() nn.HRMConfig {
	c := nn.DefaultHRM()
	c.Hidden, c.Heads, c.HLayers, c.LLayers, c.Expansion, c.HaltMaxSteps = 32, 2, 1, 1, 2, 4
	return c
}

func hostEngine(t testing.TB) (*ops.Engine, device.Allocator) {
	t.Helper()
	d := device.NewHost()
	e, err := ops.NewEngine(d, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, device.Local{Dev: d}
}

// TestHRMInitAndWeightsFile: the initialisation as the reference's (Q
// head 0 and −5, zero puzzle embedding, H_init and L_init exact in bf16,
// truncated normals of std 1/√fan_in cut at two of them), and a weights
// file that loads back exactly and strictly.
func TestHRMInitAndWeightsFile(t *testing.T) {
	cfg := tinySudokuHRM()
	_, a := hostEngine(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	m, err := nn.NewHRM(a, "", cfg, false, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	read := func(name string) []float32 {
		p, ok := m.Param(name)
		if !ok {
			t.Fatalf("no %s", name)
		}
		v, err := p.Value.ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if b := read("inner.q_head.bias"); b[0] != -5 || b[1] != -5 {
		t.Errorf("q_head.bias %v", b)
	}
	for _, n := range []string{"inner.q_head.weight", "inner.puzzle_emb.weights"} {
		for _, v := range read(n) {
			if v != 0 {
				t.Fatalf("%s is not zero", n)
			}
		}
	}
	for _, n := range []string{"inner.H_init", "inner.L_init"} {
		v := read(n)
		if !slices.Equal(v, tensor.RoundBF16(v)) {
			t.Errorf("%s is not exact in bf16", n)
		}
	}
	for _, c := range []struct {
		name string
		std  float64
	}{{"inner.H_level.layers.0.mlp.gate_up_proj.weight", 1 / math.Sqrt(32)},
		{"inner.L_level.layers.0.mlp.down_proj.weight", 1 / math.Sqrt(float64(cfg.Inter()))},
		{"inner.embed_tokens.embedding_weight", 1 / math.Sqrt(32)}} {
		v := read(c.name)
		var s2, mx float64
		for _, x := range v {
			s2 += float64(x) * float64(x)
			mx = math.Max(mx, math.Abs(float64(x)))
		}
		std := math.Sqrt(s2 / float64(len(v)))
		// The cut at ±2 of the rescaled normal: 2·std/0.8796 (the std of
		// the unit normal cut at ±2).
		if math.Abs(std-c.std) > 0.1*c.std || mx > 2*c.std/0.8796*1.0001 {
			t.Errorf("%s: std %.4g (want %.4g), largest |w| %.4g", c.name, std, c.std, mx)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "init.safetensors")
	if err := m.SaveWeights(path, map[string]string{"seed": "1"}); err != nil {
		t.Fatal(err)
	}
	f, err := ckpt.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != nn.HRMFormat || !strings.Contains(f.Metadata["config"], `"h_cycles":2`) {
		t.Errorf("metadata %v", f.Metadata)
	}
	m2, err := nn.LoadHRM(a, "", f, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Free()
	if m2.Config() != cfg {
		t.Errorf("config %+v, saved %+v", m2.Config(), cfg)
	}
	w1, _ := m.Flat().ReadF32()
	w2, _ := m2.Flat().ReadF32()
	if !slices.Equal(w1, w2) {
		t.Error("the weights loaded back differ")
	}
	// Strictness: an extra tensor, a missing one, a wrong shape.
	var entries []ckpt.Entry
	for _, p := range m.Params() {
		b, _ := p.Value.Read()
		entries = append(entries, ckpt.Entry{Name: p.Name, DType: tensor.F32, Shape: p.Value.Shape, Data: b})
	}
	bad := map[string][]ckpt.Entry{
		"extra":   append(slices.Clone(entries), ckpt.Entry{Name: "inner.extra", DType: tensor.F32, Shape: []int{1}, Data: make([]byte, 4)}),
		"missing": entries[1:],
		"shape": append([]ckpt.Entry{{Name: entries[0].Name, DType: tensor.F32, Shape: []int{entries[0].Shape[1], entries[0].Shape[0]},
			Data: entries[0].Data}}, entries[1:]...),
	}
	for what, es := range bad {
		p := filepath.Join(dir, what+".safetensors")
		if err := ckpt.WriteFile(p, es, f.Metadata); err != nil {
			t.Fatal(err)
		}
		g, err := ckpt.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if m3, err := nn.LoadHRM(a, "", g, false); !errors.Is(err, nn.ErrHRMConfig) {
			t.Errorf("%s tensor: LoadHRM error %v, want ErrHRMConfig", what, err)
			if m3 != nil {
				m3.Free()
			}
		}
	}
}

// sudokuSet is n valid puzzles: a fixed solution under random symmetries
// (sudoku.RandomTransform), each cell blank with probability blank.
func sudokuSet(r *rand.Rand, n int, blank float64) *sudoku.Set {
	var base sudoku.Grid
	for i := range base {
		row, col := i/9, i%9
		base[i] = uint8((row*3+row/3+col)%9 + 1)
	}
	s := &sudoku.Set{Meta: map[string]string{"source": "test"}}
	for k := 0; k < n; k++ {
		sol := sudoku.RandomTransform(r).Apply(base)
		p := sol
		for i := range p {
			if r.Float64() < blank {
				p[i] = 0
			}
		}
		s.Inputs, s.Labels = append(s.Inputs, p), append(s.Labels, sol)
	}
	return s
}

func gridTokens(gs []sudoku.Grid) []uint8 {
	var out []uint8
	for _, g := range gs {
		out = append(out, nn.HRMTokens(g[:])...)
	}
	return out
}

// TestHRMLearnsPuzzles is the CPU short mode: a tiny HRM (width 32, one
// block per level, 2 × 2 cycles, at most 4 segments) trains on 8 Sudoku
// puzzles with AdamATan2 and sign-SGD on the host backend; its loss falls
// and it gets many more cells right than at the start (the givens, at
// least).
func TestHRMLearnsPuzzles(t *testing.T) {
	cfg := tinySudokuHRM()
	cfg.LCycles = 1
	const B, steps = 4, 80
	e, a := hostEngine(t)
	const seed = 20261128 // fixed: a short run's outcome is pinned (other seeds pass too)
	t.Logf("seed %d", seed)
	m, err := nn.NewHRM(a, "", cfg, true, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	tr, err := m.NewTrain(e, a, "train", nn.HRMTrainConfig{Batch: B, PoolSlots: 2, Warmup: 10, LRMinRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	adam, err := optim.NewAdamATan2(a, "train", m.AdamParams(), ops.AdamATan2Config{LR: 3e-3, Beta1: 0.9, Beta2: 0.95,
		WeightDecay: 0.1, LRScale: tr.LRScale()})
	if err != nil {
		t.Fatal(err)
	}
	defer adam.Free()
	sign, err := optim.NewSignSGD(m.SignParams(), ops.SignSGDConfig{LR: 3e-3, WeightDecay: 0.1, LRScale: tr.LRScale()})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetOptimizers(adam, sign)
	set := sudokuSet(rand.New(rand.NewPCG(seed, 1)), B, 0.5)
	in, lab := gridTokens(set.Inputs), gridTokens(set.Labels)
	ev, err := tr.Evaluator(a, "eval")
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Free()
	before, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var first, last float64
	for s := 0; s < steps; s++ {
		if err := tr.Stage(s, in, lab, nil); err != nil {
			t.Fatal(err)
		}
		if err := tr.Run(); err != nil {
			t.Fatal(err)
		}
		met, err := tr.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		if s == 0 {
			first = met.LMLoss
		}
		if s >= steps-10 {
			last += met.LMLoss / 10
		}
		if s%20 == 0 || s == steps-1 {
			t.Logf("step %d: loss %.4f lm %.4f count %d accuracy %.3f lr scale %.3f", met.Step, met.Loss, met.LMLoss, met.Count, met.Accuracy, met.LRScale)
		}
	}
	after, err := ev.Evaluate(in, lab, nn.HRMEvalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d steps in %v; lm loss %.4f → %.4f; cell accuracy %.3f → %.3f", steps, time.Since(start), first, last,
		before.CellAccuracy, after.CellAccuracy)
	if !(last < 0.7*first) {
		t.Errorf("lm loss %.4f at the start, %.4f at the end", first, last)
	}
	if !(after.CellAccuracy > 0.55 && after.CellAccuracy > before.CellAccuracy+0.3) {
		t.Errorf("cell accuracy %.3f before training, %.3f after", before.CellAccuracy, after.CellAccuracy)
	}
}
