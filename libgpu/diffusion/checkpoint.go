package diffusion

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/tensor"
)

// ModelConfig is what rebuilds a trained diffusion model: the network and
// the noise schedule it was trained with. Training runs store it (with
// their other settings) as the JSON metadata "config" of their
// checkpoints, and in the header of weight snapshots.
type ModelConfig struct {
	UNet      nn.UNetConfig `json:"unet"`
	Schedule  string        `json:"schedule"`  // linear or cosine
	Timesteps int           `json:"timesteps"` // T
}

// Validate checks the configuration.
func (c ModelConfig) Validate() error {
	if err := c.UNet.Validate(); err != nil {
		return err
	}
	_, err := NewSchedule(c.Schedule, c.Timesteps)
	return err
}

// NoiseSchedule is the configuration's schedule.
func (c ModelConfig) NoiseSchedule() (Schedule, error) { return NewSchedule(c.Schedule, c.Timesteps) }

// Checkpoint layout of a diffusion model: every parameter under its
// state-dict name in PyTorch's layout (conv weights [Cout, Cin, KH, KW]);
// metadata "model" = ModelName, "config" (JSON with ModelConfig's fields),
// "step". Which weights the plain names hold:
//
//   - metadata "weights" = "ema" (the trainer's files since the split of
//     model and state files): the EMA of the weights, what samplers use;
//     the raw weights, when the file has them (the run's state file), are
//     under RawPrefix + name.
//   - no "weights" key (earlier files): the raw weights, and the EMA under
//     EMAPrefix + name.
//
// Anything else (optimizer state) is under other prefixes.
const (
	ModelName   = "unet"
	EMAPrefix   = "ema/"
	RawPrefix   = "raw/"
	MetaWeights = "weights"
	WeightsEMA  = "ema"
)

// ErrCheckpoint reports a file that is not a usable diffusion checkpoint.
var ErrCheckpoint = errors.New("diffusion: unusable checkpoint")

// CheckpointEntries are the model's tensors for a checkpoint: params and
// ema (host copies of the flat buffers, ema may be nil) in PyTorch's
// layout.
func CheckpointEntries(m *nn.UNet, params, ema []float32) ([]ckpt.Entry, error) {
	var out []ckpt.Entry
	for _, w := range []struct {
		prefix string
		flat   []float32
	}{{"", params}, {EMAPrefix, ema}} {
		if w.flat == nil {
			continue
		}
		sd, err := m.StateDict(w.flat)
		if err != nil {
			return nil, err
		}
		for _, t := range sd {
			out = append(out, ckpt.Entry{Name: w.prefix + t.Name, DType: tensor.F32, Shape: t.Shape, Data: f32Bytes(t.Data)})
		}
	}
	return out, nil
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// Checkpoint is a diffusion model's checkpoint, read.
type Checkpoint struct {
	File   *ckpt.File
	Config ModelConfig
	Step   int
}

// ReadCheckpoint reads a checkpoint written by `trainer run --model unet`
// (or any safetensors file with that metadata and those names).
func ReadCheckpoint(path string) (*Checkpoint, error) {
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if m := f.Metadata["model"]; m != ModelName {
		return nil, fmt.Errorf("%s: %w: metadata model = %q, want %q", path, ErrCheckpoint, m, ModelName)
	}
	c := &Checkpoint{File: f}
	if err := json.Unmarshal([]byte(f.Metadata["config"]), &c.Config); err != nil {
		return nil, fmt.Errorf("%s: %w: config: %v", path, ErrCheckpoint, err)
	}
	if err := c.Config.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrCheckpoint, err)
	}
	if c.Step, err = strconv.Atoi(f.Metadata["step"]); err != nil || c.Step < 0 {
		return nil, fmt.Errorf("%s: %w: step %q", path, ErrCheckpoint, f.Metadata["step"])
	}
	return c, nil
}

// HasEMA reports whether the checkpoint holds EMA weights.
func (c *Checkpoint) HasEMA() bool {
	if c.File.Metadata[MetaWeights] == WeightsEMA {
		return true
	}
	_, ok := c.File.Tensors[EMAPrefix+"conv_in.weight"]
	return ok
}

// prefix is where the EMA (ema) or the raw weights are in the file.
func (c *Checkpoint) prefix(ema bool) (string, error) {
	switch {
	case c.File.Metadata[MetaWeights] != WeightsEMA && ema:
		return EMAPrefix, nil
	case c.File.Metadata[MetaWeights] != WeightsEMA:
		return "", nil
	case ema:
		return "", nil
	}
	if _, ok := c.File.Tensors[RawPrefix+"conv_in.weight"]; !ok {
		return "", fmt.Errorf("%w: the file holds the EMA of the weights only; the raw weights are in the run's state.safetensors", ErrCheckpoint)
	}
	return RawPrefix, nil
}

// Flat assembles the weights (ema: the EMA's, else the raw parameters)
// as flat values of m's layout.
func (c *Checkpoint) Flat(m *nn.UNet, ema bool) ([]float32, error) {
	prefix, err := c.prefix(ema)
	if err != nil {
		return nil, err
	}
	return m.FlatFrom(func(name string) ([]float32, []int, error) {
		in, b, err := c.File.Bytes(prefix + name)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrCheckpoint, err)
		}
		if in.DType != tensor.F32 {
			return nil, nil, fmt.Errorf("%w: %s is %v, want f32", ErrCheckpoint, prefix+name, in.DType)
		}
		return bytesF32(b), in.Shape, nil
	})
}

// ---- weight snapshots in the pool ----

// A weight snapshot is one pool buffer named <prefix>@<step> (the step
// zero-padded to 10 digits, so names sort by step) holding a JSON header
// in its first SnapshotHeader bytes (NUL-padded: {"format", "step",
// "config", "elements"}) and then the flat f32 weights of the model's
// layout (nn.UNetConfig.Layout: conv weights [Cout, KH, KW, Cin]). A
// training run publishes one every N steps: it creates the buffer
// unsealed, writes the header and copies its EMA weights in stream order,
// waits for the copy, seals the buffer, and then removes the name of its
// previous-but-one snapshot. Consistency follows from the pool's life
// cycle: a buffer is written once, before it is sealed, and opens wait for
// the seal, so a reader never sees a snapshot being written; removing a
// name frees the memory only after the last lease on it is gone, so a
// sampler keeps the snapshot it opened for as long as it runs, while the
// trainer goes on. A sampler takes the newest sealed snapshot (or a given
// step) when it starts.
const (
	SnapshotHeader = 64 << 10
	SnapshotFormat = "gpukit.unet-snapshot/1"
)

// SnapshotHeaderJSON is a snapshot's header.
type SnapshotHeaderJSON struct {
	Format   string      `json:"format"`
	Step     int         `json:"step"`
	Config   ModelConfig `json:"config"`
	Elements int         `json:"elements"`
}

// SnapshotName is the pool name of the snapshot of step under prefix.
func SnapshotName(prefix string, step int) string { return fmt.Sprintf("%s@%010d", prefix, step) }

// SnapshotStep parses a snapshot name of prefix; ok is false for other
// names.
func SnapshotStep(prefix, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"@")
	if !ok || len(rest) != 10 {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// LatestSnapshot picks the newest snapshot of prefix among names.
func LatestSnapshot(prefix string, names []string) (string, bool) {
	var steps []int
	for _, n := range names {
		if s, ok := SnapshotStep(prefix, n); ok {
			steps = append(steps, s)
		}
	}
	if len(steps) == 0 {
		return "", false
	}
	sort.Ints(steps)
	return SnapshotName(prefix, steps[len(steps)-1]), true
}

// EncodeSnapshotHeader is the header's SnapshotHeader bytes.
func EncodeSnapshotHeader(step int, cfg ModelConfig, elements int) ([]byte, error) {
	j, err := json.Marshal(SnapshotHeaderJSON{Format: SnapshotFormat, Step: step, Config: cfg, Elements: elements})
	if err != nil {
		return nil, err
	}
	if len(j) >= SnapshotHeader {
		return nil, fmt.Errorf("%w: snapshot header of %d bytes", ErrConfig, len(j))
	}
	b := make([]byte, SnapshotHeader)
	copy(b, j)
	return b, nil
}

// DecodeSnapshotHeader parses and checks a header.
func DecodeSnapshotHeader(b []byte) (SnapshotHeaderJSON, error) {
	var h SnapshotHeaderJSON
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("%w: snapshot header: %v", ErrCheckpoint, err)
	}
	if h.Format != SnapshotFormat {
		return h, fmt.Errorf("%w: snapshot format %q, want %q", ErrCheckpoint, h.Format, SnapshotFormat)
	}
	if err := h.Config.Validate(); err != nil {
		return h, fmt.Errorf("%w: snapshot: %v", ErrCheckpoint, err)
	}
	if _, n := h.Config.UNet.Layout(); n != h.Elements {
		return h, fmt.Errorf("%w: snapshot of %d weights for a layout of %d", ErrCheckpoint, h.Elements, n)
	}
	return h, nil
}

// SnapshotBytes is the size of a snapshot of a model of n weights.
func SnapshotBytes(n int) int64 { return SnapshotHeader + 4*int64(n) }

// SnapshotWeights views the weights of a snapshot buffer (after its
// header) as f32 [n], with no copy.
func SnapshotWeights(buf *device.Buffer, n int) (*tensor.Tensor, error) {
	v, err := buf.View(SnapshotHeader, 4*int64(n))
	if err != nil {
		return nil, err
	}
	return tensor.New(v, tensor.F32, n)
}
