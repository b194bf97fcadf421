package train

import (
	"fmt"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/tensor"
)

// BatchesTensor is the name of the tensor WriteBatches stores.
const BatchesTensor = "indices"

// WriteBatches writes the training-set indices of every step of a run of
// cfg over n training examples (after --limit) to a safetensors file: one
// i32 tensor "indices" [steps, batch], row s being the examples of step s+1
// in batch order, with metadata config, steps and batches_per_epoch. It is
// what a reference implementation (bench/reference/mlp.py) needs to train
// on the same batches in the same order.
func WriteBatches(path string, cfg Config, n int) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Limit > 0 && cfg.Limit < n {
		n = cfg.Limit
	}
	nb := data.Batches(n, cfg.Batch, true)
	if nb == 0 {
		return fmt.Errorf("%w: %d training examples make no batch of %d", ErrConfig, n, cfg.Batch)
	}
	steps := nb * cfg.Epochs
	idx := make([]int32, 0, steps*cfg.Batch)
	for e := 0; e < cfg.Epochs; e++ {
		order := data.Order(n, cfg.Seed, e)
		for b := 0; b < nb; b++ {
			for _, i := range data.Batch(order, cfg.Batch, b) {
				idx = append(idx, int32(i))
			}
		}
	}
	meta := map[string]string{"format": formatName + "/batches", "config": cfg.marshal(),
		"steps": strconv.Itoa(steps), "batches_per_epoch": strconv.Itoa(nb)}
	err := ckpt.WriteFile(path, []ckpt.Entry{{Name: BatchesTensor, DType: tensor.I32, Shape: []int{steps, cfg.Batch},
		Data: tensor.AsBytes(idx)}}, meta)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
