package nn

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// GPTDecoder runs a GPT one token at a time with a key/value cache, for
// generation: the caller writes the token and its position into Token and
// Pos, queues Step, and reads Logits. Every buffer is allocated once and
// the position is read on the device, so on a GPU a Step can be captured
// once as a CUDA graph and replayed for every token. It computes in f32
// (TF32 GEMMs under the engine's precision) from the model's masters.
type GPTDecoder struct {
	m      *GPT
	e      *ops.Engine
	Token  *tensor.Tensor // [1] i32: the token at Pos
	Pos    *tensor.Tensor // [1] i32: its position, 0 ≤ Pos < Block
	Logits *tensor.Tensor // [1, vocab] f32: the next token's logits

	x, h, qkv, att, proj, fc, fcg, tok, pos *tensor.Tensor
	mean, rstd                              *tensor.Tensor
	kc, vc                                  []*tensor.Tensor // per layer [1, block, heads, headdim]
	moe                                     *decoderMoE      // the MoE MLP's buffers (nil: a dense GPT)
	bufs                                    []*tensor.Tensor
}

// NewDecoder allocates a decoder for m on e's device through a.
func (m *GPT) NewDecoder(e *ops.Engine, a device.Allocator) (d *GPTDecoder, err error) {
	c := m.cfg
	C := c.DModel
	d = &GPTDecoder{m: m, e: e}
	defer func() {
		if err != nil {
			d.Free()
			d = nil
		}
	}()
	alloc := func(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, "", dt, shape...)
		if err == nil {
			d.bufs = append(d.bufs, t)
		}
		return t, err
	}
	type slot struct {
		p     **tensor.Tensor
		dt    tensor.DType
		shape []int
	}
	for _, s := range []slot{
		{&d.Token, tensor.I32, []int{1}}, {&d.Pos, tensor.I32, []int{1}},
		{&d.Logits, tensor.F32, []int{1, c.Vocab}},
		{&d.x, tensor.F32, []int{1, C}}, {&d.h, tensor.F32, []int{1, C}},
		{&d.qkv, tensor.F32, []int{1, 3 * C}}, {&d.att, tensor.F32, []int{1, 1, c.Heads, c.HeadDim()}},
		{&d.proj, tensor.F32, []int{1, C}}, {&d.fc, tensor.F32, []int{1, 4 * C}}, {&d.fcg, tensor.F32, []int{1, 4 * C}},
		{&d.tok, tensor.F32, []int{1, C}}, {&d.pos, tensor.F32, []int{1, C}},
		{&d.mean, tensor.F32, []int{1}}, {&d.rstd, tensor.F32, []int{1}},
	} {
		if *s.p, err = alloc(s.dt, s.shape...); err != nil {
			return d, fmt.Errorf("nn: decoder: %w", err)
		}
	}
	if err := d.allocMoE(alloc); err != nil {
		return d, err
	}
	for l := 0; l < c.Layers; l++ {
		k, err := alloc(tensor.F32, 1, c.Block, c.Heads, c.HeadDim())
		if err != nil {
			return d, fmt.Errorf("nn: decoder key cache: %w", err)
		}
		v, err := alloc(tensor.F32, 1, c.Block, c.Heads, c.HeadDim())
		if err != nil {
			return d, fmt.Errorf("nn: decoder value cache: %w", err)
		}
		d.kc, d.vc = append(d.kc, k), append(d.vc, v)
	}
	return d, nil
}

// Free releases the decoder's buffers.
func (d *GPTDecoder) Free() error {
	var errs []error
	for _, t := range d.bufs {
		errs = append(errs, t.Buf.Free())
	}
	d.bufs = nil
	return errors.Join(errs...)
}

func (d *GPTDecoder) param(name string) *tensor.Tensor {
	if p, ok := d.m.byName[name]; ok {
		return p.Value
	}
	return nil
}

// linear queues y = x·wᵀ + b for one row.
func (d *GPTDecoder) linear(y, x *tensor.Tensor, w, b string) error {
	return d.e.Matmul(ops.Matmul{A: x, B: d.param(w), D: y, TransB: true, Bias: d.param(b)})
}

// qkvPart is part i (0 q, 1 k, 2 v) of the qkv row as [1, 1, heads, headdim].
func (d *GPTDecoder) qkvPart(i int) (*tensor.Tensor, error) {
	c := d.m.cfg
	p, err := d.qkv.Narrow(1, i*c.DModel, c.DModel)
	if err != nil {
		return nil, err
	}
	return p.View(1, 1, c.Heads, c.HeadDim())
}

// Step queues the forward pass of Token at Pos: it writes the token's keys
// and values into the caches at Pos and the logits of the next token into
// Logits. Positions before Pos must have been stepped since the caches
// were last filled.
func (d *GPTDecoder) Step() error {
	c, e := d.m.cfg, d.e
	const eps = 1e-5
	if err := e.Embedding(d.tok, d.param("transformer.wte.weight"), d.Token); err != nil {
		return err
	}
	if err := e.Embedding(d.pos, d.param("transformer.wpe.weight"), d.Pos); err != nil {
		return err
	}
	if err := e.Add(d.x, d.tok, d.pos); err != nil {
		return err
	}
	scale := float32(1 / math.Sqrt(float64(c.HeadDim())))
	att2, err := d.att.View(1, c.DModel)
	if err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		h := "transformer.h." + strconv.Itoa(l) + "."
		steps := []func() error{
			func() error {
				return e.LayerNorm(d.h, d.mean, d.rstd, d.x, d.param(h+"ln_1.weight"), d.param(h+"ln_1.bias"), eps)
			},
			func() error { return d.linear(d.qkv, d.h, h+"attn.c_attn.weight", h+"attn.c_attn.bias") },
			func() error {
				q, err := d.qkvPart(0)
				if err != nil {
					return err
				}
				k, err := d.qkvPart(1)
				if err != nil {
					return err
				}
				v, err := d.qkvPart(2)
				if err != nil {
					return err
				}
				if err := e.KVWrite(d.kc[l], k, d.Pos); err != nil {
					return err
				}
				if err := e.KVWrite(d.vc[l], v, d.Pos); err != nil {
					return err
				}
				return e.AttentionDecode(d.att, q, d.kc[l], d.vc[l], d.Pos, scale)
			},
			func() error { return d.linear(d.proj, att2, h+"attn.c_proj.weight", h+"attn.c_proj.bias") },
			func() error { return e.Add(d.x, d.x, d.proj) },
			func() error {
				return e.LayerNorm(d.h, d.mean, d.rstd, d.x, d.param(h+"ln_2.weight"), d.param(h+"ln_2.bias"), eps)
			},
		}
		if c.IsMoE(l) {
			steps = append(steps, func() error { return d.moeStep(h) })
		} else {
			steps = append(steps,
				func() error { return d.linear(d.fc, d.h, h+"mlp.c_fc.weight", h+"mlp.c_fc.bias") },
				func() error { return e.GELU(d.fcg, d.fc, c.geluForm()) },
				func() error { return d.linear(d.proj, d.fcg, h+"mlp.c_proj.weight", h+"mlp.c_proj.bias") })
		}
		steps = append(steps, func() error { return e.Add(d.x, d.x, d.proj) })
		for _, f := range steps {
			if err := f(); err != nil {
				return fmt.Errorf("nn: decoder layer %d: %w", l, err)
			}
		}
	}
	if err := e.LayerNorm(d.h, d.mean, d.rstd, d.x, d.param("transformer.ln_f.weight"), d.param("transformer.ln_f.bias"), eps); err != nil {
		return err
	}
	return d.linear(d.Logits, d.h, "transformer.wte.weight", "")
}
