package lm

import (
	"encoding/json"
	"fmt"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// modelMeta is the metadata a language model's checkpoint files carry
// besides the driver's: the tokenizer and the seed.
func modelMeta(cfg Config, tok *data.CharTokenizer) (map[string]string, error) {
	tb, err := json.Marshal(tok)
	if err != nil {
		return nil, err
	}
	return map[string]string{metaTok: string(tb), "seed": strconv.FormatUint(cfg.Seed, 10)}, nil
}

// ReadCheckpoint reads a language model's checkpoint (model, best or state
// file of any Variant): its configuration, tokenizer and the number of
// steps done.
func ReadCheckpoint(path string) (*ckpt.File, Config, *data.CharTokenizer, int, error) {
	var cfg Config
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, cfg, nil, 0, err
	}
	cfg, tok, step, err := parseMeta(f.Metadata)
	if err != nil {
		return nil, cfg, nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	return f, cfg, tok, step, nil
}

// parseMeta reads a language model's configuration, tokenizer and step
// from a checkpoint's metadata.
func parseMeta(m map[string]string) (Config, *data.CharTokenizer, int, error) {
	var cfg Config
	name := m[driver.MetaModel]
	if _, ok := variants[name]; !ok {
		return cfg, nil, 0, fmt.Errorf("%w: not a language model (metadata model = %q)", driver.ErrCheckpoint, name)
	}
	if err := json.Unmarshal([]byte(m[driver.MetaConfig]), &cfg); err != nil {
		return cfg, nil, 0, fmt.Errorf("%w: config: %v", driver.ErrCheckpoint, err)
	}
	var tok data.CharTokenizer
	if err := json.Unmarshal([]byte(m[metaTok]), &tok); err != nil {
		return cfg, nil, 0, fmt.Errorf("%w: tokenizer: %v", driver.ErrCheckpoint, err)
	}
	if tok.Vocab() != cfg.Model.Vocab {
		return cfg, nil, 0, fmt.Errorf("%w: tokenizer has %d tokens, model %d", driver.ErrCheckpoint, tok.Vocab(), cfg.Model.Vocab)
	}
	step, err := strconv.Atoi(m[driver.MetaStep])
	if err != nil || step < 0 {
		return cfg, nil, 0, fmt.Errorf("%w: step %q", driver.ErrCheckpoint, m[driver.MetaStep])
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, 0, fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
	}
	return cfg, &tok, step, nil
}

// WriteEvalBatches writes the fixed validation batches of cfg (what
// val_loss lines average over) as i32 "x", "y" [EvalBatches, batch, block]
// with the config in the metadata, for bench/reference/gpt.py eval.
func WriteEvalBatches(path string, cfg Config, corpus *data.Corpus) error {
	n := cfg.Batch * cfg.Model.Block
	x, y := make([]int32, cfg.EvalBatches*n), make([]int32, cfg.EvalBatches*n)
	for k := 0; k < cfg.EvalBatches; k++ {
		if err := data.Blocks(corpus.Val, x[k*n:(k+1)*n], y[k*n:(k+1)*n], cfg.Batch, cfg.Model.Block, cfg.Seed^evalSeed, uint64(k)); err != nil {
			return err
		}
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	shape := []int{cfg.EvalBatches, cfg.Batch, cfg.Model.Block}
	return ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "x", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(x)},
		{Name: "y", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(y)},
	}, map[string]string{"format": driver.FormatModel + "/lm-batches", "config": string(cb)})
}

// WriteBatches writes the batches and learning rates of a run's first
// steps to path: i32 "x", "y" [steps, batch, block] (data.Blocks of the
// training split, draw = step) and f32 "lr" [steps] (LRAt), with the run's
// config in the metadata — what bench/reference/gpt.py parity replays.
func WriteBatches(path string, cfg Config, corpus *data.Corpus, steps int) error {
	cfg.Model.Vocab = corpus.Tok.Vocab()
	if err := cfg.Validate(); err != nil {
		return err
	}
	n := cfg.Batch * cfg.Model.Block
	x, y := make([]int32, steps*n), make([]int32, steps*n)
	lr := make([]float32, steps)
	for s := 0; s < steps; s++ {
		if err := data.Blocks(corpus.Train, x[s*n:(s+1)*n], y[s*n:(s+1)*n], cfg.Batch, cfg.Model.Block, cfg.Seed, uint64(s)); err != nil {
			return err
		}
		lr[s] = cfg.LR * (cfg.LRAt(s) / cfg.LR) // the f32 value the device's scale gives
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	shape := []int{steps, cfg.Batch, cfg.Model.Block}
	err = ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "x", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(x)},
		{Name: "y", DType: tensor.I32, Shape: shape, Data: tensor.AsBytes(y)},
		{Name: "lr", DType: tensor.F32, Shape: []int{steps}, Data: tensor.AsBytes(lr)},
	}, map[string]string{"format": driver.FormatModel + "/lm-batches", "config": string(cb), "steps": strconv.Itoa(steps)})
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
