package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/devflag"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
	"gpukit/sampler/internal/sample"
)

// env is what every subcommand sets up: the allocator, engine and model.
type env struct {
	a     device.Allocator
	e     *ops.Engine
	m     *sample.Model
	cast  tensor.DType
	graph bool
	// class is --class for the commands that have it (−1: all; the
	// model's class count: the null class), else 0.
	class int
	close []func()
}

func (v *env) Close() {
	for i := len(v.close) - 1; i >= 0; i-- {
		v.close[i]()
	}
}

// setup reads the device, model and precision flags (--device, --pool,
// --graph and --precision: libgpu/cli/devflag), and --class against the
// model's classes where the command has that flag.
func setup(c *cli.Context) (*env, error) {
	if err := kit.NoArgs(c); err != nil {
		return nil, err
	}
	graph, err := devflag.GraphOn(c)
	if err != nil {
		return nil, err
	}
	prec, err := devflag.PrecisionOf(c)
	if err != nil {
		return nil, err
	}
	ckpt, weights, sock, random := c.String("ckpt"), c.String("weights"), c.String("pool"), c.String("random-init")
	sources := 0
	for _, s := range []string{ckpt, weights, random} {
		if s != "" {
			sources++
		}
	}
	switch {
	case sources == 0 && hasFlag(c, randomFlag.Name):
		return nil, kit.Usagef("--ckpt FILE, --pool SOCK --weights PREFIX or --random-init CONFIG.json is required")
	case sources == 0:
		return nil, kit.Usagef("--ckpt FILE or --pool SOCK --weights PREFIX is required")
	case sources > 1:
		return nil, kit.Usagef("--ckpt, --weights and --random-init are sources of weights; give one")
	case weights != "" && sock == "":
		return nil, kit.Usagef("--weights names a snapshot in the pool: give --pool SOCK too")
	}
	var randomCfg diffusion.ModelConfig
	if random != "" {
		var err error
		if randomCfg, err = readModelConfig(random); err != nil {
			return nil, err
		}
	}
	v := &env{graph: graph}
	ok := false
	defer func() {
		if !ok {
			v.Close()
		}
	}()
	a, closeFn, err := devflag.Open(c)
	if err != nil {
		return nil, err
	}
	v.close = append(v.close, closeFn)
	v.a = a
	pc, _ := a.(*pool.Client) // with --pool: where --weights are read
	if v.e, err = ops.NewEngine(v.a.Device(), ops.Options{Precision: prec}); err != nil {
		return nil, err
	}
	v.close = append(v.close, func() { v.e.Close() })
	v.cast = tensor.F32
	if prec == ops.PrecBF16 && v.e.IsGraphCapable() {
		v.cast = tensor.BF16
	}
	switch {
	case random != "":
		v.m, err = sample.RandomModel(v.a, randomCfg, c.Uint64("seed"))
	case weights != "":
		v.m, err = sample.LoadSnapshot(pc, weights, c.Duration("wait"))
	default:
		v.m, err = sample.LoadCheckpoint(v.a, ckpt, c.Bool("raw-weights"))
	}
	if err != nil {
		if errors.Is(err, sample.ErrUsage) {
			return nil, fmt.Errorf("%w: %w", kit.ErrUsage, err)
		}
		return nil, err
	}
	v.close = append(v.close, func() { v.m.Free() })
	if hasFlag(c, classFlag.Name) {
		if v.class, err = parseClass(c, v.m.Config.UNet.Classes); err != nil {
			return nil, err
		}
	}
	ok = true
	return v, nil
}

// hasFlag reports whether the running command defines the flag name.
func hasFlag(c *cli.Context, name string) bool {
	for _, f := range c.Command.Flags {
		if slices.Contains(f.Names(), name) {
			return true
		}
	}
	return false
}

// readModelConfig reads --random-init's model configuration (the JSON a
// checkpoint stores: diffusion.ModelConfig); an unreadable, unknown or
// invalid one is a usage error naming the file.
func readModelConfig(path string) (diffusion.ModelConfig, error) {
	var cfg diffusion.ModelConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, kit.Usagef("--random-init %s: %v", path, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&cfg); err != nil {
		return cfg, kit.Usagef("--random-init %s: %v (want {\"unet\": {\"channels\": [64, 128, 256], \"in_channels\": 1, \"size\": 32, \"classes\": 10, \"groups\": 32, \"heads\": 4}, \"schedule\": \"linear\", \"timesteps\": 1000})", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, kit.Usagef("--random-init %s: %v", path, err)
	}
	return cfg, nil
}
