package unet

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/trainer/internal/driver"
)

// TinyUNet is the diffusion run CI trains on the host: 8-8-16 channels
// at 32×32 (attention at 8×8 with 2 heads), batch 8.
func TinyUNet() Config {
	c := Default()
	c.UNet = nn.UNetConfig{Channels: []int{8, 8, 16}, InChannels: 1, Size: 32, Classes: 10, Groups: 4, Heads: 2}
	c.Batch, c.Steps, c.Warmup, c.SaveEvery, c.LR = 8, 12, 2, 1000, 1e-3
	return c
}

// fakeFashion is a labelled set of 28×28 images: class k is a bright
// square at a position of its own on a dark background, so a model can
// learn classes in a few steps.
func fakeFashion(n int, seed uint64) *data.Set {
	r := rand.New(rand.NewPCG(seed, 1))
	s := &data.Set{N: n, Rows: 28, Cols: 28, Images: make([]uint8, n*28*28), Labels: make([]uint8, n)}
	for i := 0; i < n; i++ {
		k := i % 10
		s.Labels[i] = uint8(k)
		x0, y0 := 2+(k%5)*5, 4+(k/5)*12
		for y := 0; y < 28; y++ {
			for x := 0; x < 28; x++ {
				v := r.IntN(20)
				if x >= x0 && x < x0+6 && y >= y0 && y < y0+8 {
					v = 200 + r.IntN(56)
				}
				s.Images[i*784+y*28+x] = uint8(v)
			}
		}
	}
	return s
}

func unetLosses(t *testing.T, out string) []float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, driver.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var ls []float64
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var v struct {
			Loss float64 `json:"loss"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, v.Loss)
	}
	return ls
}

// TestUNetRunResume: a diffusion run interrupted (its context cancelled)
// and resumed from its checkpoint logs the same losses as an
// uninterrupted one (batches, dropped labels, timesteps and noise are
// functions of the seed and the step; the noise's counter is the
// optimizer's step, restored from the checkpoint); the checkpoint reads
// back as a diffusion model whose EMA differs from its raw weights.
func TestUNetRunResume(t *testing.T) {
	cfg := TinyUNet()
	cfg.Steps = 6
	set := fakeFashion(40, 1)
	opts := func(out string) UNetOptions {
		return UNetOptions{Alloc: host(), Run: "u", Train: set, Out: out, LogEvery: 1, Stdout: io.Discard}
	}
	full := t.TempDir()
	if _, err := RunUNet(context.Background(), cfg, opts(full)); err != nil {
		t.Fatal(err)
	}
	part := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stops after the first step
	res, err := RunUNet(ctx, cfg, opts(part))
	if err != nil || !res.Interrupted || res.Step != 1 {
		t.Fatalf("interrupted run: %+v, %v", res, err)
	}
	r, err := driver.ReadResume(part)
	if err != nil {
		t.Fatal(err)
	}
	rcfg, err := storedConfig(r.Stored.Config)
	if err != nil {
		t.Fatal(err)
	}
	o := opts(part)
	o.Resume = r
	if _, err := RunUNet(context.Background(), rcfg, o); err != nil {
		t.Fatal(err)
	}
	a, b := unetLosses(t, full), unetLosses(t, part)
	if len(a) != 6 || len(b) != 6 {
		t.Fatalf("%d and %d loss lines, want 6", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("step %d: loss %v uninterrupted, %v resumed", i+1, a[i], b[i])
		}
	}
	// The state file holds both the EMA and the raw weights (the model
	// file the EMA alone: TestUNetModelFileIsEMA).
	c, err := diffusion.ReadCheckpoint(filepath.Join(full, driver.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if c.Step != 6 || !c.HasEMA() || c.Config.UNet.Channels[2] != 16 {
		t.Fatalf("checkpoint step %d, EMA %v, config %+v", c.Step, c.HasEMA(), c.Config)
	}
	m, err := nn.NewUNet(host(), "", c.Config.UNet, nn.UNetOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	raw, err := c.Flat(m, false)
	if err != nil {
		t.Fatal(err)
	}
	ema, err := c.Flat(m, true)
	if err != nil {
		t.Fatal(err)
	}
	diff := 0
	for i := range raw {
		if raw[i] != ema[i] {
			diff++
		}
	}
	if diff == 0 {
		t.Error("the EMA equals the raw weights after 6 steps")
	}
}

// TestUNetBatch: images are padded with the background (−1) and scaled to
// [−1, 1]; about PUncond of the labels become the null class; timesteps
// cover [0, T).
func TestUNetBatch(t *testing.T) {
	cfg := TinyUNet()
	cfg.Batch = 200
	set := fakeFashion(50, 2)
	x := make([]float32, cfg.Batch*32*32)
	y := make([]int32, cfg.Batch)
	ts := make([]int32, cfg.Batch)
	null, maxT := 0, int32(0)
	for step := 0; step < 20; step++ {
		batch(cfg, set, step, x, y, ts)
		for b := 0; b < cfg.Batch; b++ {
			img := x[b*1024 : (b+1)*1024]
			if img[0] != -1 || img[2*32+1] != -1 || img[31*32+31] != -1 {
				t.Fatal("border not the background value -1")
			}
			for _, v := range img {
				if v < -1 || v > 1 {
					t.Fatalf("pixel %v outside [-1, 1]", v)
				}
			}
			if y[b] == 10 {
				null++
			}
			maxT = max(maxT, ts[b])
			if ts[b] < 0 || ts[b] >= 1000 {
				t.Fatalf("timestep %d", ts[b])
			}
		}
	}
	// 4000 labels at p = 0.1: 400 ± 19 (σ); 5σ bounds.
	if null < 300 || null > 500 {
		t.Errorf("%d of 4000 labels dropped, want about 400", null)
	}
	if maxT < 990 {
		t.Errorf("largest timestep %d of 4000 draws", maxT)
	}
}

func host() device.Allocator { return device.Local{Dev: device.NewHost()} }

// UNetOptions are a test run's options: what the trainer's command line
// gives the driver, and the data.
type UNetOptions struct {
	Alloc     device.Allocator
	Precision ops.Precision
	Graph     bool
	Run       string
	Train     *data.Set
	Out       string
	LogEvery  int
	Stdout    io.Writer
	Resume    *driver.Resume
}

// RunUNet trains cfg on o.Train as `trainer run --model unet` does.
func RunUNet(ctx context.Context, cfg Config, o UNetOptions) (driver.Result, error) {
	t := &task{cfg: cfg, train: o.Train}
	if cfg.Limit > 0 {
		t.train = o.Train.Limit(cfg.Limit)
	}
	return driver.Run(ctx, t, driver.Options{Model: Name, Alloc: o.Alloc, Precision: o.Precision, Graph: o.Graph, Run: o.Run,
		Out: o.Out, LogEvery: o.LogEvery, Stdout: o.Stdout, Settings: driver.Settings{LogEvery: o.LogEvery}, Resume: o.Resume})
}

// TestUNetModelFileIsEMA: model.safetensors holds the EMA of the weights
// alone, under the state-dict names (metadata weights = ema), which is
// what samplers read; the raw weights are in the state file only; the
// plot labels the loss as the noise prediction's squared error, not a
// cross-entropy.
func TestUNetModelFileIsEMA(t *testing.T) {
	cfg := TinyUNet()
	cfg.Steps = 3
	out := t.TempDir()
	if _, err := RunUNet(context.Background(), cfg, UNetOptions{Alloc: host(), Run: "u", Train: fakeFashion(40, 4), Out: out, LogEvery: 1,
		Stdout: io.Discard}); err != nil {
		t.Fatal(err)
	}
	model, err := diffusion.ReadCheckpoint(filepath.Join(out, driver.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	state, err := diffusion.ReadCheckpoint(filepath.Join(out, driver.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	m, err := nn.NewUNet(host(), "", model.Config.UNet, nn.UNetOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	fromModel, err := model.Flat(m, true)
	if err != nil {
		t.Fatal(err)
	}
	ema, err := state.Flat(m, true)
	if err != nil {
		t.Fatal(err)
	}
	if !model.HasEMA() || !slices.Equal(fromModel, ema) {
		t.Fatal("model.safetensors does not hold the state's EMA")
	}
	if _, err := model.Flat(m, false); err == nil || !strings.Contains(err.Error(), "state.safetensors") {
		t.Fatalf("raw weights from model.safetensors: %v", err)
	}
	for _, n := range model.File.Names() {
		if strings.Contains(n, "/") {
			t.Fatalf("model.safetensors holds %s", n)
		}
	}
	tr, err := (&task{cfg: cfg, train: fakeFashion(40, 4)}).Build(&driver.Env{Engine: hostEngine(t), Alloc: host()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	if l := tr.Metrics().LossName; strings.Contains(l, "entropy") || !strings.Contains(l, "MSE") {
		t.Fatalf("the U-Net's loss is labelled %q", l)
	}
}

// TestEMAWarmup: the decay is 0 at the first step (the average starts at
// the weights), (1+s)/(10+s) while that is below --ema-decay, then
// --ema-decay; without the warm-up, --ema-decay throughout.
func TestEMAWarmup(t *testing.T) {
	c := Default()
	for s, want := range map[int]float32{0: 0, 1: 2.0 / 11, 8: 0.5, 90: 0.91, 100000: 0.9995} {
		if got := c.EMADecayAt(s); math.Abs(float64(got-want)) > 1e-7 {
			t.Errorf("step %d: decay %v, want %v", s, got, want)
		}
	}
	c.EMAWarmup = false
	if got := c.EMADecayAt(0); got != c.EMADecay {
		t.Errorf("without warm-up: %v", got)
	}
}

func hostEngine(t *testing.T) *ops.Engine {
	e, err := ops.NewEngine(device.NewHost(), ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestEMAFollowsShortRuns: after 8 steps the warmed-up EMA is nearer the
// raw weights than to the initial ones by a factor of 4 or more (with the
// constant 0.9995 it would be 99.4% the initial weights: noise to a
// sampler); with --ema-warmup=false it stays within 1% of them.
func TestEMAFollowsShortRuns(t *testing.T) {
	for _, warm := range []bool{true, false} {
		cfg := TinyUNet()
		cfg.Steps, cfg.EMAWarmup = 8, warm
		out := t.TempDir()
		if _, err := RunUNet(context.Background(), cfg, UNetOptions{Alloc: host(), Run: "u", Train: fakeFashion(40, 5), Out: out,
			LogEvery: 4, Stdout: io.Discard}); err != nil {
			t.Fatal(err)
		}
		state, err := diffusion.ReadCheckpoint(filepath.Join(out, driver.StateFile))
		if err != nil {
			t.Fatal(err)
		}
		m, err := nn.NewUNet(host(), "", cfg.UNet, nn.UNetOptions{}, cfg.Seed) // the initial weights
		if err != nil {
			t.Fatal(err)
		}
		init, err := m.Flat().ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := state.Flat(m, false)
		if err != nil {
			t.Fatal(err)
		}
		ema, err := state.Flat(m, true)
		m.Free()
		if err != nil {
			t.Fatal(err)
		}
		dist := func(a, b []float32) float64 {
			s := 0.0
			for i := range a {
				d := float64(a[i] - b[i])
				s += d * d
			}
			return math.Sqrt(s)
		}
		toRaw, toInit, moved := dist(ema, raw), dist(ema, init), dist(raw, init)
		t.Logf("warm-up %v: |ema−raw| %.4g, |ema−init| %.4g, |raw−init| %.4g", warm, toRaw, toInit, moved)
		if warm && !(toRaw*4 <= toInit) {
			t.Errorf("with the warm-up the EMA is %.3g from the raw weights, %.3g from the initial ones", toRaw, toInit)
		}
		if !warm && !(toInit <= 0.01*moved) {
			t.Errorf("without the warm-up the EMA moved %.3g from the initial weights (the raw ones %.3g)", toInit, moved)
		}
	}
}
