package lm

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"gpukit/libgpu/data"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/trainer/internal/driver"
)

// moeTestConfig is lmTestConfig with an MoE MLP of 4 experts, top-2, in
// both blocks, and the given coefficients.
func moeTestConfig(aux, z float32) Config {
	cfg := lmTestConfig()
	cfg.Model.MoE = &nn.MoEConfig{Experts: 4, TopK: 2, Every: 1, Width: 24, AuxLoss: aux, ZLoss: z}
	return cfg
}

// moeTermLine is a loss line's two MoE terms.
type moeTermLine struct {
	Step int      `json:"step"`
	Aux  *float64 `json:"aux_loss"`
	Z    *float64 `json:"z_loss"`
}

func moeTerms(t *testing.T, lines []string) []moeTermLine {
	t.Helper()
	var out []moeTermLine
	for _, s := range lines {
		var l moeTermLine
		if err := json.Unmarshal([]byte("{"+s+"}"), &l); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if strings.Contains(s, `"loss"`) {
			if l.Aux == nil || l.Z == nil {
				t.Fatalf("a loss line without aux_loss and z_loss: %s", s)
			}
			out = append(out, l)
		}
	}
	return out
}

// TestLMMoERanksEqualOne: a Mixture-of-Experts GPT (experts replicated)
// on 2 and 4 ranks. Each rank's auxiliary losses are over its own
// tokens. The z-loss is a mean over tokens, so the ranks' averaged
// gradient is the global batch's and, with the load-balancing loss off,
// every line — cross-entropy, gradient norm, validation loss and the
// logged z_loss (averaged across ranks) — is one process's within 1e-5.
// The load-balancing loss E·Σ fᵢ·Pᵢ is a product of two means over the
// tokens, not a mean: with it on, the ranks' averaged gradient differs
// from one process's, so only the first step's cross-entropy and z-loss
// (before any update) match within 1e-5; the later losses stay close
// (measured, logged) but not equal.
func TestLMMoERanksEqualOne(t *testing.T) {
	corpus := testCorpus(t)
	cfg := moeTestConfig(0, 1e-3)
	one, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
	want, wantZ := parseLMLines(t, one), moeTerms(t, one)
	if len(want) != 14 || len(wantZ) != 12 {
		t.Fatalf("%d lines, %d loss lines", len(want), len(wantZ))
	}
	for _, c := range []struct {
		n     int
		shard bool
	}{{2, false}, {4, false}, {2, true}, {4, true}} {
		n := c.n
		got, _ := lmHostRanks(t, corpus, cfg, n, LMOptions{Out: t.TempDir(), BucketBytes: 4 << 10, Shard: c.shard}, nil)
		what := fmt.Sprintf("%d ranks, z-loss only, --shard-optimizer %v", n, c.shard)
		closeLines(t, what, parseLMLines(t, got), want, 1e-5)
		for i, l := range moeTerms(t, got) {
			if d := math.Abs(*l.Z-*wantZ[i].Z) / *wantZ[i].Z; !(d <= 1e-5) {
				t.Fatalf("%s: step %d: z_loss %v, one process %v", what, l.Step, *l.Z, *wantZ[i].Z)
			}
		}
	}

	cfg = moeTestConfig(0.01, 1e-3)
	one, _ = lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
	want, wantZ = parseLMLines(t, one), moeTerms(t, one)
	got, _ := lmHostRanks(t, corpus, cfg, 2, LMOptions{Out: t.TempDir()}, nil)
	gl, gz := parseLMLines(t, got), moeTerms(t, got)
	if len(gl) != len(want) {
		t.Fatalf("2 ranks: %d lines, want %d", len(gl), len(want))
	}
	if d := math.Abs(*gl[0].Loss-*want[0].Loss) / *want[0].Loss; !(d <= 1e-5) {
		t.Fatalf("2 ranks with the load-balancing loss: step 1 cross-entropy %v, one process %v", *gl[0].Loss, *want[0].Loss)
	}
	if d := math.Abs(*gz[0].Z-*wantZ[0].Z) / *wantZ[0].Z; !(d <= 1e-5) {
		t.Fatalf("2 ranks with the load-balancing loss: step 1 z_loss %v, one process %v", *gz[0].Z, *wantZ[0].Z)
	}
	worst, auxDiff := 0.0, 0.0
	for i := range gl {
		if gl[i].Loss != nil {
			worst = max(worst, math.Abs(*gl[i].Loss-*want[i].Loss) / *want[i].Loss)
		}
	}
	for i := range gz {
		auxDiff = max(auxDiff, math.Abs(*gz[i].Aux-*wantZ[i].Aux) / *wantZ[i].Aux)
	}
	if !(auxDiff > 0) {
		t.Fatalf("2 ranks logged the load-balancing loss of one process exactly: not each rank's own over its tokens")
	}
	t.Logf("2 ranks with the load-balancing loss: largest relative cross-entropy difference %.2g, aux_loss %.2g", worst, auxDiff)
}

// TestDecayed: AdamW decays the weights of rank ≥ 2 and no bias (a
// Mixture-of-Experts layer's [E, W] expert biases included) and no norm
// weight — moe.py's optimizer groups.
func TestDecayed(t *testing.T) {
	cfg := moeTestConfig(0.01, 1e-3).Model
	cfg.Vocab, cfg.Bias, cfg.Layers = 10, true, 2
	m, err := nn.NewGPT(host(), "", cfg, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	seen := 0
	for _, p := range m.Params() {
		// Decayed: the embeddings and every Linear's weight, the router's
		// and the stacked experts' too; not LayerNorm weights nor biases.
		want := strings.HasSuffix(p.Name, ".weight") && !strings.Contains(p.Name, ".ln_")
		if strings.Contains(p.Name, "experts.c_fc.bias") {
			seen++
			if p.Value.Rank() != 2 {
				t.Fatalf("%s has rank %d", p.Name, p.Value.Rank())
			}
		}
		if got := Decayed(p); got != want {
			t.Errorf("%s %v: decayed %v, want %v", p.Name, p.Value.Shape, got, want)
		}
	}
	if seen != 2 {
		t.Fatalf("%d expert c_fc biases", seen)
	}
}

// TestMoEMetrics: a Mixture-of-Experts run's loss lines count the FLOPs
// of the active parameters for MFU (nanoGPT's 6N + 12·L·d·T per token, N
// without the experts a token does not use: each MoE layer's experts k/E
// of their total, the router whole).
func TestMoEMetrics(t *testing.T) {
	cfg := moeTestConfig(0.01, 1e-3)
	cfg.Model.Layers, cfg.Model.MoE.Every = 3, 2 // one MoE MLP (block 1) between dense ones
	tk := &task{v: testMoEVariant, cfg: cfg}
	tk.cfg.Data = data.DefaultTextPath()
	if err := tk.Load(dist.World{}); err != nil {
		t.Fatal(err)
	}
	a := host()
	e, err := ops.NewEngine(a.Device(), ops.Options{Precision: ops.PrecF32})
	if err != nil {
		t.Fatal(err)
	}
	defer driver.CloseEngine(e)
	tr, err := tk.Build(&driver.Env{Engine: e, Alloc: a, Precision: ops.PrecF32})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	c := tk.cfg.Model
	var all, experts float64
	for _, p := range tr.(*trainer).l.m.Params() {
		if p.Name == "transformer.wpe.weight" {
			continue
		}
		all += float64(p.Value.Numel())
		if strings.Contains(p.Name, ".mlp.experts.") {
			experts += float64(p.Value.Numel())
		}
	}
	E, k := float64(c.MoE.Experts), float64(c.MoE.TopK)
	active := all - experts*(E-k)/E
	perToken := 6*active + 12*float64(c.Layers*c.DModel*c.Block)
	m := tr.Metrics()
	if want := perToken * float64(cfg.Batch*c.Block); math.Abs(m.FLOPs-want) > 1e-9*want {
		t.Errorf("FLOPs per step %v, want %v (active parameters %v of %v)", m.FLOPs, want, active, all)
	}
}
