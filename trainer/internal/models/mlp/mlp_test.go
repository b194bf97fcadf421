package mlp

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

func host() device.Allocator { return device.Local{Dev: device.NewHost()} }

func randomSteps(t *testing.T, m *model, e *ops.Engine, rng *rand.Rand, n int) {
	t.Helper()
	b, d := m.mlp.Config().Batch, m.cfg.Widths[0]
	x := make([]float32, b*d)
	y := make([]int32, b)
	for range n {
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for i := range y {
			y[i] = int32(rng.IntN(m.cfg.Widths[len(m.cfg.Widths)-1]))
		}
		if err := m.mlp.Input().WriteF32(x); err != nil {
			t.Fatal(err)
		}
		if err := m.mlp.Labels().Write(tensor.AsBytes(y)); err != nil {
			t.Fatal(err)
		}
		if err := m.compute(e, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckpointRoundTrip: parameters and optimizer state saved after a few
// steps load bitwise into a model initialised differently, and saving that
// model again gives the same file.
func TestCheckpointRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, opt := range []string{"adamw", "sgd"} {
		cfg := Default()
		cfg.Widths, cfg.Batch, cfg.Optim, cfg.Seed = []int{20, 16, 8, 5}, 4, opt, rng.Uint64()
		e, err := ops.NewEngine(device.NewHost(), ops.Options{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := newModel(host(), cfg, "a", cfg.Batch, true)
		if err != nil {
			t.Fatal(err)
		}
		defer m.free()
		randomSteps(t, m, e, rng, 3)
		dir := t.TempDir()
		p1, p2 := filepath.Join(dir, "1.safetensors"), filepath.Join(dir, "2.safetensors")
		pos := Position{Step: 3, Epoch: 1, Batch: 2}
		if err := saveState(m, p1, pos); err != nil {
			t.Fatal(err)
		}
		other := cfg
		other.Seed++
		m2, err := newModel(host(), other, "b", cfg.Batch, true)
		if err != nil {
			t.Fatal(err)
		}
		defer m2.free()
		f, gotCfg, gotStep, err := ReadCheckpoint(p1, "relu")
		if err != nil {
			t.Fatal(err)
		}
		gotPos := Position{Step: gotStep}
		gotPos.Epoch, _ = strconv.Atoi(f.Metadata["epoch"])
		gotPos.Batch, _ = strconv.Atoi(f.Metadata["batch"])
		if gotPos != pos || !slices.Equal(gotCfg.Widths, cfg.Widths) || gotCfg.Seed != cfg.Seed || gotCfg.Optim != opt {
			t.Fatalf("read back %+v %+v", gotCfg, gotPos)
		}
		if err := m2.load(f, true); err != nil {
			t.Fatal(err)
		}
		a, b := m.tensors(true), m2.tensors(true)
		if len(a) != len(b) || len(a) <= len(m.mlp.Params()) {
			t.Fatalf("%d and %d tensors", len(a), len(b))
		}
		for i := range a {
			x, _ := a[i].T.Read()
			y, _ := b[i].T.Read()
			if a[i].Name != b[i].Name || !bytes.Equal(x, y) {
				t.Fatalf("%s differs after load", a[i].Name)
			}
		}
		m2.cfg = cfg
		if err := saveState(m2, p2, pos); err != nil {
			t.Fatal(err)
		}
		b1, _ := os.ReadFile(p1)
		b2, _ := os.ReadFile(p2)
		if !bytes.Equal(b1, b2) {
			t.Fatal("saving the loaded model gave another file")
		}
		// Both models take the same next step.
		r1, r2 := rand.New(rand.NewPCG(9, 9)), rand.New(rand.NewPCG(9, 9))
		randomSteps(t, m, e, r1, 1)
		randomSteps(t, m2, e, r2, 1)
		l1, _ := m.mlp.Loss().ReadF32()
		l2, _ := m2.mlp.Loss().ReadF32()
		w1, _ := m.mlp.Params()[0].Value.Read()
		w2, _ := m2.mlp.Params()[0].Value.Read()
		if l1[0] != l2[0] || !bytes.Equal(w1, w2) {
			t.Fatalf("next step differs: loss %v vs %v", l1[0], l2[0])
		}
	}
}

// TestReadCheckpointInfers: a file with only fc<i> tensors (as PyTorch would
// write) gets widths from their shapes; inconsistent shapes are refused.
func TestReadCheckpointInfers(t *testing.T) {
	dir := t.TempDir()
	ent := func(name string, shape ...int) ckpt.Entry {
		return ckpt.Entry{Name: name, DType: tensor.F32, Shape: shape, Data: make([]byte, 4*tensor.Numel(shape))}
	}
	p := filepath.Join(dir, "pt.safetensors")
	if err := ckpt.WriteFile(p, []ckpt.Entry{ent("fc0.weight", 7, 12), ent("fc0.bias", 7), ent("fc1.weight", 3, 7), ent("fc1.bias", 3)}, nil); err != nil {
		t.Fatal(err)
	}
	_, cfg, step, err := ReadCheckpoint(p, "gelu")
	if err != nil || !slices.Equal(cfg.Widths, []int{12, 7, 3}) || cfg.Act != "gelu" || step != 0 {
		t.Fatalf("%+v %+v %v", cfg, step, err)
	}
	bad := filepath.Join(dir, "bad.safetensors")
	ckpt.WriteFile(bad, []ckpt.Entry{ent("fc0.weight", 7, 12), ent("fc1.weight", 3, 6)}, nil)
	if _, _, _, err := ReadCheckpoint(bad, "relu"); !errors.Is(err, driver.ErrCheckpoint) {
		t.Fatalf("inconsistent shapes: %v", err)
	}
	none := filepath.Join(dir, "none.safetensors")
	ckpt.WriteFile(none, []ckpt.Entry{ent("w", 2)}, nil)
	if _, _, _, err := ReadCheckpoint(none, "relu"); !errors.Is(err, driver.ErrCheckpoint) {
		t.Fatalf("no fc0.weight: %v", err)
	}
}

func TestValidate(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, edit := range []func(*Config){
		func(c *Config) { c.Model = "cnn" },
		func(c *Config) { c.Widths = []int{784} },
		func(c *Config) { c.Widths = []int{784, 0, 10} },
		func(c *Config) { c.Act = "tanh" },
		func(c *Config) { c.Optim = "lbfgs" },
		func(c *Config) { c.LR = 0 },
		func(c *Config) { c.WeightDecay = -1 },
		func(c *Config) { c.Momentum = 1 },
		func(c *Config) { c.Batch = 0 },
		func(c *Config) { c.Epochs = 0 },
		func(c *Config) { c.Limit = -1 },
		func(c *Config) { c.Clip = -1 },
		func(c *Config) { c.Clip = float32(math.Inf(1)) },
	} {
		c := Default()
		edit(&c)
		if err := c.Validate(); !errors.Is(err, driver.ErrConfig) {
			t.Fatalf("%+v accepted (%v)", c, err)
		}
	}
}

// saveState writes m's checkpoint at pos as the driver's state file holds
// it: the model's tensors, then the optimizer state under optim/, with the
// configuration, the step and the position.
func saveState(m *model, path string, pos Position) error {
	ck, err := m.checkpoint(pos)
	if err != nil {
		return err
	}
	meta := map[string]string{driver.MetaConfig: m.cfg.marshal(), driver.MetaStep: strconv.Itoa(pos.Step)}
	for _, mm := range []map[string]string{ck.Meta, ck.StateMeta} {
		for k, v := range mm {
			meta[k] = v
		}
	}
	return ckpt.WriteFile(path, append(ck.Model, ck.State...), meta)
}
