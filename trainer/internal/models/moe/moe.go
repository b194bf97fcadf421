// Package moe is `trainer run --model moe`: a GPT whose MLP in every
// --moe-every-th block is a Mixture-of-Experts layer (libgpu/nn's
// GPTConfig with MoE set: an f32 router choosing --top-k of --experts
// expert MLPs per token, dropless token-choice routing through the
// routing and grouped GEMM op families, the Switch load-balancing loss and
// the router z-loss in the objective), trained on any UTF-8 text with a
// character tokenizer through the language-model task of internal/lm.
// Its default is nanoMoE's shape (Wolfe, github.com/wolfecameron/nanoMoE:
// 6 layers, 6 heads, d 384, 8 experts, top-2, an MoE layer in every second
// block, coefficients 0.01 and 0.001); the rest is the GPT's default run.
//
// Loss lines carry aux_loss and z_loss after grad_norm: the step's
// load-balancing loss (E·Σᵢ fᵢ·Pᵢ, Fedus et al. 2021) and z-loss (mean
// logsumexp², Zoph et al. 2022), each summed over the MoE layers and
// unscaled (the objective adds them times --aux-loss and --z-loss); in a
// data-parallel run each rank's are over its own tokens, averaged across
// ranks as the loss is. `loss` stays the cross-entropy.
//
// Checkpoints carry nanoGPT's names for the attention and dense blocks
// and, for block N's MoE MLP, transformer.h.N.mlp.router.weight [E, d],
// .mlp.experts.c_fc.weight [E, W, d], .mlp.experts.c_proj.weight [E, d, W]
// (and with --bias .mlp.experts.c_fc.bias [E, W], .c_proj.bias [E, d]):
// bench/reference/moe.py's module loads them with load_state_dict(strict=True).
// The configuration is stored as the GPT's with "moe": {experts, top_k,
// moe_every, expert_width, aux_loss, z_loss}, which moe.py reads.
package moe

import (
	"fmt"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/nn"
	"gpukit/trainer/internal/driver"
	"gpukit/trainer/internal/lm"
)

// DefaultConfig is `trainer run --model moe` without flags: nanoMoE's
// network (6 layers, 6 heads, d 384; nn.DefaultMoE) on the GPT's default
// run (block 64, batch 16, 300 steps, AdamW; lm.DefaultConfig).
func DefaultConfig() lm.Config {
	c := lm.DefaultConfig()
	c.Model.Layers, c.Model.Heads, c.Model.DModel = 6, 6, 384
	m := nn.DefaultMoE()
	c.Model.MoE = &m
	return c
}

func init() {
	d := DefaultConfig()
	m := *d.Model.MoE
	lm.Register(lm.Variant{
		Name:    "moe",
		Summary: "character-level Mixture-of-Experts GPT on any text (nanoMoE's shape)",
		Kind:    "MoE GPT",
		Default: d,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "experts", Value: m.Experts, Usage: "expert MLPs of each MoE layer"},
			&cli.IntFlag{Name: "top-k", Value: m.TopK, Usage: "experts each token is routed to (renormalised softmax weights over the k largest router logits)"},
			&cli.IntFlag{Name: "moe-every", Value: m.Every, Usage: "an MoE MLP in blocks l with (l+1) % N == 0 (2: blocks 1, 3, 5, ...; 1: every block)"},
			&cli.IntFlag{Name: "expert-width", Value: m.Width, DefaultText: "0: 4·d-model", Usage: "hidden width of each expert"},
			&cli.Float64Flag{Name: "aux-loss", Value: kit.F32(m.AuxLoss), Usage: "coefficient α of the Switch load-balancing loss E·Σ fᵢ·Pᵢ in the objective"},
			&cli.Float64Flag{Name: "z-loss", Value: kit.F32(m.ZLoss), Usage: "coefficient of the router z-loss (mean logsumexp² of the router logits) in the objective"},
		},
		Configure: func(c *cli.Context, g *nn.GPTConfig) error {
			g.MoE = &nn.MoEConfig{Experts: c.Int("experts"), TopK: c.Int("top-k"), Every: c.Int("moe-every"),
				Width: c.Int("expert-width"), AuxLoss: float32(c.Float64("aux-loss")), ZLoss: float32(c.Float64("z-loss"))}
			if g.MoE.Width == 0 {
				g.MoE.Width = g.MoE.HiddenWidth(g.DModel) // stored explicitly: moe.py and a reader see the width
			}
			if g.MoE.Every > g.Layers {
				return driver.Configf("--moe-every %d with %d layers: no block would have an MoE MLP", g.MoE.Every, g.Layers)
			}
			return nil
		},
		Terms: Terms,
		Lines: "\n" + `Loss lines end with aux_loss and z_loss: the step's load-balancing and router z-losses summed over
the MoE layers, unscaled (the objective is loss + --aux-loss·aux_loss + --z-loss·z_loss; with
several ranks, each rank's over its own tokens, averaged).`,
		Describe: func(m *nn.GPT, c nn.GPTConfig) string {
			return fmt.Sprintf("%.2fM active per token; %d experts of width %d, top-%d, in %d of %d blocks",
				float64(m.ActiveParams(true))/1e6, c.MoE.Experts, c.MoE.HiddenWidth(c.DModel), c.MoE.TopK, c.MoELayers(), c.Layers)
		},
	})
}

// Terms are the loss lines' aux_loss and z_loss: the two elements of the
// recorded step's AuxLosses ([2] f32 on the device).
func Terms(s *nn.GPTStep) []driver.Term {
	if s.AuxLosses == nil {
		return nil
	}
	aux, err1 := s.AuxLosses.Rows(0, 1)
	z, err2 := s.AuxLosses.Rows(1, 2)
	if err1 != nil || err2 != nil {
		return nil // a [2] tensor always has these rows
	}
	return []driver.Term{{Name: "aux_loss", T: aux}, {Name: "z_loss", T: z}}
}
