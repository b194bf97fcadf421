// Package gpt is `trainer run --model gpt`: a decoder-only transformer in
// nanoGPT's shape (libgpu/nn.GPT) trained on any UTF-8 text with a
// character tokenizer, through the language-model task of internal/lm.
// Its checkpoints load strictly into nanoGPT's GPT module.
package gpt

import "gpukit/trainer/internal/lm"

func init() {
	lm.Register(lm.Variant{
		Name:    "gpt",
		Summary: "character-level GPT on any text (nanoGPT's model)",
		Kind:    "GPT",
		Default: lm.DefaultConfig(),
	})
}
