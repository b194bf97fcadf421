package mlp

import (
	"fmt"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// pixelTable maps a raw pixel to its normalised value exactly as
// data.Set.Normalize computes it ((p/255 − Mean)/Std in float32).
var pixelTable = func() (t [256]float32) {
	for p := range t {
		t[p] = (float32(p)/255 - data.Mean) / data.Std
	}
	return t
}()

// fill writes batch idx of set into x (normalised pixels, through
// pixelTable) and y (labels): data.Set.Fill's output, without a division
// per pixel.
func fill(set *data.Set, x []float32, y []int32, idx []int) error {
	d := set.Dim()
	if len(x) < len(idx)*d || len(y) < len(idx) {
		return fmt.Errorf("%w: %d examples into x of %d and y of %d elements", data.ErrBatch, len(idx), len(x), len(y))
	}
	for k, i := range idx {
		if i < 0 || i >= set.N {
			return fmt.Errorf("%w: example %d of %d", data.ErrBatch, i, set.N)
		}
		row := x[k*d : (k+1)*d]
		for j, p := range set.Images[i*d : (i+1)*d] {
			row[j] = pixelTable[p]
		}
		y[k] = int32(set.Labels[i])
	}
	return nil
}

func checkShapes(cfg Config, sets ...*data.Set) error {
	for _, s := range sets {
		if s == nil {
			continue
		}
		if cfg.Widths[0] != s.Dim() {
			return driver.Configf("--widths starts with %d, the images have %d pixels", cfg.Widths[0], s.Dim())
		}
		if c := s.Classes(); cfg.Widths[len(cfg.Widths)-1] < c {
			return driver.Configf("--widths ends with %d, the data has %d classes", cfg.Widths[len(cfg.Widths)-1], c)
		}
	}
	return nil
}

// evaluate returns the fraction of set the model classifies correctly, in
// batches of the model's static size (the last one padded with zeros).
func evaluate(e *ops.Engine, a device.Allocator, run string, m *model, set *data.Set) (float64, error) {
	if set == nil || set.N == 0 {
		return 0, driver.Configf("empty evaluation set")
	}
	bsz := m.mlp.Config().Batch
	d := set.Dim()
	x := make([]float32, bsz*d)
	y := make([]int32, bsz)
	pred, err := tensor.Alloc(a, driver.Join(run, "acts/predictions"), tensor.I32, bsz)
	if err != nil {
		return 0, err
	}
	defer pred.Buf.Free()
	order := make([]int, set.N)
	for i := range order {
		order[i] = i
	}
	correct := 0
	for b := range data.Batches(set.N, bsz, false) {
		idx := data.Batch(order, bsz, b)
		clear(x)
		clear(y)
		if err := set.Fill(x, y, idx); err != nil {
			return 0, err
		}
		if err := m.mlp.Input().WriteF32(x); err != nil {
			return 0, err
		}
		if err := m.mlp.Labels().Write(tensor.AsBytes(y)); err != nil {
			return 0, err
		}
		if err := m.mlp.Forward(e); err != nil {
			return 0, err
		}
		if err := m.mlp.Predict(e, pred); err != nil {
			return 0, err
		}
		raw, err := pred.Read()
		if err != nil {
			return 0, err
		}
		p := tensor.BytesAs[int32](raw)
		for k, i := range idx {
			if p[k] == int32(set.Labels[i]) {
				correct++
			}
		}
	}
	return float64(correct) / float64(set.N), nil
}

// Evaluate loads the parameters of f into a model of cfg (batch rows per
// forward pass) and returns its accuracy on set.
func Evaluate(a device.Allocator, prec ops.Precision, f *ckpt.File, cfg Config, batch int, set *data.Set) (float64, error) {
	if err := checkShapes(cfg, set); err != nil {
		return 0, err
	}
	if batch < 1 {
		return 0, driver.Configf("--batch %d (want ≥ 1)", batch)
	}
	eng, err := ops.NewEngine(a.Device(), ops.Options{Precision: prec})
	if err != nil {
		return 0, err
	}
	defer driver.CloseEngine(eng)
	m, err := newModel(a, cfg, "eval", batch, false)
	if err != nil {
		return 0, err
	}
	defer m.free()
	if err := m.load(f, false); err != nil {
		return 0, err
	}
	return evaluate(eng, a, "eval", m, set)
}

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
		return driver.Configf("%d training examples make no batch of %d", n, cfg.Batch)
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
	meta := map[string]string{"format": driver.FormatModel + "/batches", "config": cfg.marshal(),
		"steps": strconv.Itoa(steps), "batches_per_epoch": strconv.Itoa(nb)}
	err := ckpt.WriteFile(path, []ckpt.Entry{{Name: BatchesTensor, DType: tensor.I32, Shape: []int{steps, cfg.Batch},
		Data: tensor.AsBytes(idx)}}, meta)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
