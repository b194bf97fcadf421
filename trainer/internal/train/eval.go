package train

import (
	"fmt"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

// Evaluate loads the parameters of f into a model of cfg (batch rows per
// forward pass) and returns its accuracy on set.
func Evaluate(a device.Allocator, prec ops.Precision, f *ckpt.File, cfg Config, batch int, set *data.Set) (float64, error) {
	if err := checkShapes(cfg, set); err != nil {
		return 0, err
	}
	if batch < 1 {
		return 0, fmt.Errorf("%w: --batch %d", ErrConfig, batch)
	}
	eng, err := ops.NewEngine(a.Device(), ops.Options{Precision: prec})
	if err != nil {
		return 0, err
	}
	defer closeEngine(eng)
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

// Init writes the initial parameters of cfg (as NewMLP draws them from
// cfg.Seed) to path, with the config in the metadata and step 0.
func Init(a device.Allocator, cfg Config, path string) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	m, err := newModel(a, cfg, "init", 1, false)
	if err != nil {
		return err
	}
	defer m.free()
	return m.save(path, Position{}, false)
}
