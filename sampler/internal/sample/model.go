package sample

import (
	"errors"
	"fmt"
	"time"

	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
)

// ErrUsage marks errors in what the user asked for (a bad flag value).
var ErrUsage = errors.New("sample: bad request")

// Model is a diffusion model ready to sample: its configuration, the
// U-Net over weights on the sampler's device, and where they came from.
type Model struct {
	Config diffusion.ModelConfig
	UNet   *nn.UNet
	Step   int    // training steps behind the weights
	Source string // "ckpt PATH (ema)" or "pool NAME"
	free   func() error
}

// Free releases the weights (or the pool lease).
func (m *Model) Free() error {
	if m.free == nil {
		return nil
	}
	err := m.free()
	m.free = nil
	return err
}

// LoadCheckpoint reads a diffusion checkpoint and puts its weights (the
// EMA unless raw, or when the file has none) into one flat buffer from a.
func LoadCheckpoint(a device.Allocator, path string, raw bool) (*Model, error) {
	c, err := diffusion.ReadCheckpoint(path)
	if err != nil {
		return nil, err
	}
	ema := !raw && c.HasEMA()
	// A model over host memory only to assemble the flat values.
	host, err := nn.NewUNet(device.Local{Dev: device.NewHost()}, "", c.Config.UNet, nn.UNetOptions{}, 0)
	if err != nil {
		return nil, err
	}
	flat, err := c.Flat(host, ema)
	host.Free()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t, err := tensor.Alloc(a, "sampler/weights", tensor.F32, len(flat))
	if err != nil {
		return nil, err
	}
	if err := t.WriteF32(flat); err != nil {
		t.Buf.Free()
		return nil, err
	}
	u, err := nn.UNetOn(c.Config.UNet, t)
	if err != nil {
		t.Buf.Free()
		return nil, err
	}
	kind := "raw weights"
	if ema {
		kind = "EMA weights"
	}
	return &Model{Config: c.Config, UNet: u, Step: c.Step, Source: fmt.Sprintf("%s (%s)", path, kind),
		free: t.Buf.Free}, nil
}

// RandomModel is a model of cfg with random weights (nn.NewUNet's
// initialisation, seeded), allocated through a: for measuring speed at a
// model size no training run has produced; its samples are noise.
func RandomModel(a device.Allocator, cfg diffusion.ModelConfig, seed uint64) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	u, err := nn.NewUNet(a, "sampler/weights", cfg.UNet, nn.UNetOptions{}, seed)
	if err != nil {
		return nil, err
	}
	_, n := cfg.UNet.Layout()
	return &Model{Config: cfg, UNet: u, Source: fmt.Sprintf("random initialisation (seed %d, %d parameters; the samples are noise)", seed, n),
		free: u.Free}, nil
}

// LoadSnapshot opens a weight snapshot in the pool (diffusion.SnapshotName):
// weights is a prefix (the newest snapshot under it) or a full name
// <prefix>@<step>; it waits up to wait for a snapshot being written to be
// sealed. The weights are used where they are, with no copy; the lease is
// held until Free, so the snapshot stays valid while the trainer moves on.
func LoadSnapshot(c *pool.Client, weights string, wait time.Duration) (*Model, error) {
	name := weights
	if _, _, ok := cutStep(weights); !ok {
		infos, err := c.Ls()
		if err != nil {
			return nil, err
		}
		names := make([]string, len(infos))
		for i, in := range infos {
			names[i] = in.Name
		}
		var found bool
		if name, found = diffusion.LatestSnapshot(weights, names); !found {
			return nil, fmt.Errorf("%w: no snapshot %s@<step> in the pool at %s (is a trainer publishing with --publish-every?)", ErrUsage, weights, c.Path())
		}
	}
	b, err := c.OpenWait(name, wait)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", name, err)
	}
	fail := func(err error) (*Model, error) {
		b.Free()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if b.Size() < diffusion.SnapshotHeader {
		return fail(fmt.Errorf("%w: %d bytes", diffusion.ErrCheckpoint, b.Size()))
	}
	hv, err := b.View(0, diffusion.SnapshotHeader)
	if err != nil {
		return fail(err)
	}
	ht, err := tensor.New(hv, tensor.U8, diffusion.SnapshotHeader)
	if err != nil {
		return fail(err)
	}
	hb, err := ht.Read()
	if err != nil {
		return fail(err)
	}
	h, err := diffusion.DecodeSnapshotHeader(hb)
	if err != nil {
		return fail(err)
	}
	if b.Size() < diffusion.SnapshotBytes(h.Elements) {
		return fail(fmt.Errorf("%w: %d bytes for %d weights", diffusion.ErrCheckpoint, b.Size(), h.Elements))
	}
	w, err := diffusion.SnapshotWeights(b.Buffer, h.Elements)
	if err != nil {
		return fail(err)
	}
	u, err := nn.UNetOn(h.Config.UNet, w)
	if err != nil {
		return fail(err)
	}
	return &Model{Config: h.Config, UNet: u, Step: h.Step, Source: "pool " + name, free: b.Free}, nil
}

// cutStep splits "<prefix>@<step>".
func cutStep(name string) (string, int, bool) {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '@' {
			s, ok := diffusion.SnapshotStep(name[:i], name)
			return name[:i], s, ok
		}
	}
	return "", 0, false
}
