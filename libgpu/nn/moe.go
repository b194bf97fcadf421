package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// MoEConfig makes some of a GPT's MLPs Mixture-of-Experts layers: Experts
// MLPs of width Width (each nanoGPT's c_fc → GELU → c_proj), a router in
// f32 choosing TopK of them per token with renormalised softmax weights,
// dropless token-choice routing (every token reaches its k experts; no
// capacity factor), the Switch load-balancing loss and the router z-loss
// added to the objective with coefficients AuxLoss and ZLoss (Shazeer et
// al. 2017; Fedus et al. 2021, "Switch Transformers"; Zoph et al. 2022,
// "ST-MoE"). Blocks l with (l+1) % Every == 0 have the MoE MLP (Every 2:
// blocks 1, 3, 5, ... — Switch's every other FFN). DefaultMoE is nanoMoE's
// shape (Wolfe's nanoMoE, github.com/wolfecameron/nanoMoE).
type MoEConfig struct {
	Experts int `json:"experts"`
	TopK    int `json:"top_k"`
	Every   int `json:"moe_every"`
	// Width is each expert's hidden width; 0 means 4·DModel (nanoGPT's MLP).
	Width   int     `json:"expert_width,omitempty"`
	AuxLoss float32 `json:"aux_loss"` // coefficient of the load-balancing loss
	ZLoss   float32 `json:"z_loss"`   // coefficient of the router z-loss
}

// DefaultMoE is nanoMoE's default: 8 experts, top-2, an MoE layer in every
// second block, aux-loss 0.01, z-loss 0.001.
func DefaultMoE() MoEConfig {
	return MoEConfig{Experts: 8, TopK: 2, Every: 2, AuxLoss: 0.01, ZLoss: 0.001}
}

// Validate checks the MoE configuration.
func (c MoEConfig) Validate() error {
	bad := func(v float32) bool { return !(v >= 0) || math.IsInf(float64(v), 0) }
	switch {
	case c.Experts < 1 || c.Experts > ops.GroupedMaxGroups:
		return fmt.Errorf("%w: --experts %d (want 1 to %d)", ErrGPTConfig, c.Experts, ops.GroupedMaxGroups)
	case c.TopK < 1 || c.TopK > min(c.Experts, ops.MoEMaxTopK):
		return fmt.Errorf("%w: --top-k %d (want 1 to min(--experts, %d))", ErrGPTConfig, c.TopK, ops.MoEMaxTopK)
	case c.Every < 1:
		return fmt.Errorf("%w: --moe-every %d (want ≥ 1)", ErrGPTConfig, c.Every)
	case c.Width < 0:
		return fmt.Errorf("%w: --expert-width %d (want ≥ 0; 0 is 4·d-model)", ErrGPTConfig, c.Width)
	case bad(c.AuxLoss) || bad(c.ZLoss):
		return fmt.Errorf("%w: --aux-loss %v, --z-loss %v (want finite ≥ 0)", ErrGPTConfig, c.AuxLoss, c.ZLoss)
	}
	return nil
}

// HiddenWidth is an expert's hidden width for model width d.
func (c MoEConfig) HiddenWidth(d int) int {
	if c.Width > 0 {
		return c.Width
	}
	return 4 * d
}

// IsMoE reports whether block l's MLP is a Mixture-of-Experts layer.
func (c GPTConfig) IsMoE(l int) bool { return c.MoE != nil && (l+1)%c.MoE.Every == 0 }

// MoELayers counts the blocks with an MoE MLP.
func (c GPTConfig) MoELayers() int {
	n := 0
	for l := 0; l < c.Layers; l++ {
		if c.IsMoE(l) {
			n++
		}
	}
	return n
}

// moeSpecs are the parameters of block l's MoE MLP (prefix h =
// "transformer.h.l."), with names a PyTorch module can carry:
// mlp.router.weight [E, C]; mlp.experts.c_fc.weight [E, W, C] and
// mlp.experts.c_proj.weight [E, C, W] (each expert's nn.Linear weight,
// stacked), and their biases [E, W], [E, C] when the GPT has biases.
// Initialisation as nanoGPT's MLP: N(0, 0.02), c_proj N(0,
// 0.02/√(2·layers)), zero biases; the router N(0, 0.02).
func (c GPTConfig) moeSpecs(h string, w, proj, zero func(*rand.Rand, []float32)) []gptParam {
	m, C := c.MoE, c.DModel
	W := m.HiddenWidth(C)
	ps := []gptParam{{name: h + "mlp.router.weight", shape: []int{m.Experts, C}, init: w},
		{name: h + "mlp.experts.c_fc.weight", shape: []int{m.Experts, W, C}, init: w}}
	if c.Bias {
		ps = append(ps, gptParam{name: h + "mlp.experts.c_fc.bias", shape: []int{m.Experts, W}, init: zero})
	}
	ps = append(ps, gptParam{name: h + "mlp.experts.c_proj.weight", shape: []int{m.Experts, C, W}, init: proj})
	if c.Bias {
		ps = append(ps, gptParam{name: h + "mlp.experts.c_proj.bias", shape: []int{m.Experts, C}, init: zero})
	}
	return ps
}

// ActiveParams counts the parameters one token uses: NumParams with each
// MoE layer's experts counted TopK/Experts of their total (the router
// fully) — the N of MFU on active parameters.
func (m *GPT) ActiveParams(nonEmbedding bool) int {
	n := float64(m.NumParams(nonEmbedding))
	c := m.cfg
	if c.MoE == nil {
		return int(n)
	}
	for l := 0; l < c.Layers; l++ {
		if !c.IsMoE(l) {
			continue
		}
		h := "transformer.h." + strconv.Itoa(l) + ".mlp.experts."
		for _, s := range []string{"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"} {
			if p, ok := m.byName[h+s]; ok {
				n -= float64(p.Value.Numel()) * float64(c.MoE.Experts-c.MoE.TopK) / float64(c.MoE.Experts)
			}
		}
	}
	return int(math.Round(n))
}

// MoEMLP records a Mixture-of-Experts MLP on x ([T, C], e.g. a block's
// ln_2 output as rows): router logits in f32 (Graph.RouterLogits, router
// [E, C]), dropless top-k routing with the auxiliary losses
// (Graph.MoERoute with c's k and coefficients), the tokens permuted to
// expert order, each expert's c_fc → GELU (form) → c_proj as two grouped
// GEMMs (fcW [E, W, C], fcB [E, W] or nil, projW [E, C, W], projB [E, C]
// or nil), and the weighted combine back in token order. It returns y
// ([T, C], the graph's activation dtype) and the routing's losses ([2]
// f32: load-balancing, z; their gradients, scaled by c.AuxLoss and
// c.ZLoss, flow into the router). Errors latch on g.
func MoEMLP(g *ops.Graph, x, router, fcW, fcB, projW, projB *ops.Var, c MoEConfig, form ops.GELUForm) (y, losses *ops.Var) {
	r := g.MoERoute(g.RouterLogits(x, router), c.TopK, c.AuxLoss, c.ZLoss)
	if r == nil {
		return nil, nil
	}
	hs := g.GroupedLinear(g.MoEPermute(x, r), fcW, fcB, r.Offsets)
	ys := g.GroupedLinear(g.GELU(hs, form), projW, projB, r.Offsets)
	return g.MoECombine(ys, r), r.Losses
}

// moeMLP records block h's MoE MLP (MoEMLP with the block's parameters).
func (m *GPT) moeMLP(g *ops.Graph, f *ops.Var, h string, p func(string) *ops.Var) (*ops.Var, *ops.Var) {
	return MoEMLP(g, f, p(h+"mlp.router.weight"), p(h+"mlp.experts.c_fc.weight"), p(h+"mlp.experts.c_fc.bias"),
		p(h+"mlp.experts.c_proj.weight"), p(h+"mlp.experts.c_proj.bias"), *m.cfg.MoE, m.cfg.geluForm())
}

// sumLosses records the sum of the MoE layers' loss pairs into one [2]
// tensor (load-balancing, z), unscaled: what a trainer logs.
func sumLosses(g *ops.Graph, ls []*ops.Var) *ops.Var {
	out := g.NewOut("moe.losses.sum", tensor.F32, 2)
	if out == nil {
		return nil
	}
	e := g.Engine()
	g.Record("moe_losses", ls, []*ops.Var{out}, func(*ops.Grads) error {
		if err := e.Copy(out.Value, ls[0].Value); err != nil {
			return err
		}
		for _, l := range ls[1:] {
			if err := e.Add(out.Value, out.Value, l.Value); err != nil {
				return err
			}
		}
		return nil
	}, nil)
	return out
}

// decoderMoE holds a GPTDecoder's buffers for one token's MoE MLP.
type decoderMoE struct {
	logits, weights, experts, counts, offsets, perm, rows *tensor.Tensor
	xs, hs, hg, ys                                        *tensor.Tensor
}

func (d *GPTDecoder) allocMoE(alloc func(dt tensor.DType, shape ...int) (*tensor.Tensor, error)) error {
	c := d.m.cfg
	if c.MoE == nil {
		return nil
	}
	E, k, C, W := c.MoE.Experts, c.MoE.TopK, c.DModel, c.MoE.HiddenWidth(c.DModel)
	mo := &decoderMoE{}
	for _, s := range []struct {
		p     **tensor.Tensor
		dt    tensor.DType
		shape []int
	}{
		{&mo.logits, tensor.F32, []int{1, E}}, {&mo.weights, tensor.F32, []int{1, k}}, {&mo.experts, tensor.I32, []int{1, k}},
		{&mo.counts, tensor.I32, []int{E}}, {&mo.offsets, tensor.I32, []int{E + 1}}, {&mo.perm, tensor.I32, []int{1, k}},
		{&mo.rows, tensor.I32, []int{k}}, {&mo.xs, tensor.F32, []int{k, C}}, {&mo.hs, tensor.F32, []int{k, W}},
		{&mo.hg, tensor.F32, []int{k, W}}, {&mo.ys, tensor.F32, []int{k, C}},
	} {
		var err error
		if *s.p, err = alloc(s.dt, s.shape...); err != nil {
			return fmt.Errorf("nn: decoder: %w", err)
		}
	}
	d.moe = mo
	return nil
}

// moeStep queues block l's MoE MLP for the decoder's one token: d.h → d.proj.
func (d *GPTDecoder) moeStep(h string) error {
	e, mo, c := d.e, d.moe, d.m.cfg
	if err := e.Matmul(ops.Matmul{A: d.h, B: d.param(h + "mlp.router.weight"), D: mo.logits, TransB: true, FullF32: true}); err != nil {
		return err
	}
	if err := e.MoETopK(mo.weights, mo.experts, mo.logits); err != nil {
		return err
	}
	if err := e.MoERoute(mo.counts, mo.offsets, mo.perm, mo.rows, mo.experts); err != nil {
		return err
	}
	if err := e.MoEPermute(mo.xs, d.h, mo.rows); err != nil {
		return err
	}
	if err := e.GroupedMatmul(mo.hs, mo.xs, d.param(h+"mlp.experts.c_fc.weight"), d.param(h+"mlp.experts.c_fc.bias"), mo.offsets, false); err != nil {
		return err
	}
	if err := e.GELU(mo.hg, mo.hs, c.geluForm()); err != nil {
		return err
	}
	if err := e.GroupedMatmul(mo.ys, mo.hg, d.param(h+"mlp.experts.c_proj.weight"), d.param(h+"mlp.experts.c_proj.bias"), mo.offsets, false); err != nil {
		return err
	}
	return e.MoECombine(d.proj, mo.ys, mo.weights, mo.perm)
}
