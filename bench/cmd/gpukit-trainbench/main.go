// Command gpukit-trainbench times one training step of an MLP classifier
// (Linear+ReLU ×2, Linear, softmax cross-entropy, backward, multi-tensor
// AdamW) on the GPU, the step the trainer runs, for the shapes of
// bench/reference/trainstep.py, and prints one JSON line per (shape,
// precision, mode) with the fields of gpukit-bench: impl, key, ms (per
// step, median over --repeats), flops (nn.MLPStepFLOPs), bytes (0), device,
// plus mfu (against ops.PeakFLOPS) and the repeats' spread.
//
// Modes: "graph" replays the step captured as one CUDA graph; "eager"
// launches its ops one by one; "gemm" replays a graph of the step's GEMMs
// alone (forward x·wᵀ, dx = dz·w, dw = dzᵀ·x; no bias, activation, loss or
// optimizer), the floor the fused step is measured against. Inputs are
// random and stay on the device (no dataset, no host copy in the step),
// as in trainstep.py. Each repeat times --iters steps (or at least 20 ms of
// them) between two CUDA events after warm-up.
//
// It needs a GPU; without one it exits 1 with one line saying why.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// Shape is one benchmarked MLP: layer widths and batch size.
type Shape struct {
	Widths []int
	Batch  int
}

// DefaultShapes are the three sizes (784-256-256-10 batch 256,
// 784-1024-1024-10 batch 1024, 784-4096-4096-10 batch 4096).
var DefaultShapes = []Shape{
	{[]int{784, 256, 256, 10}, 256},
	{[]int{784, 1024, 1024, 10}, 1024},
	{[]int{784, 4096, 4096, 10}, 4096},
}

// Key matches trainstep.py's key().
func Key(s Shape, prec, mode string) string {
	ws := make([]string, len(s.Widths))
	for i, w := range s.Widths {
		ws[i] = strconv.Itoa(w)
	}
	return fmt.Sprintf("trainstep widths=%s batch=%d prec=%s mode=%s", strings.Join(ws, "-"), s.Batch, prec, mode)
}

// Result is one output line.
type Result struct {
	Impl    string    `json:"impl"`
	Key     string    `json:"key"`
	MS      float64   `json:"ms"`
	Flops   float64   `json:"flops"`
	Bytes   float64   `json:"bytes"`
	Device  string    `json:"device"`
	MFU     float64   `json:"mfu,omitempty"`
	Repeats []float64 `json:"repeats_ms"`
}

var precisions = map[string]ops.Precision{"f32": ops.PrecF32, "tf32": ops.PrecTF32, "bf16": ops.PrecBF16}

// noLinearChain is the opposite of --fuse-backward (the trainer's default: off).
var noLinearChain bool

func main() {
	precs := flag.String("precision", "tf32", "comma-separated precisions: f32, tf32, bf16")
	modes := flag.String("modes", "graph,eager,gemm", "comma-separated modes: graph, eager, gemm")
	repeats := flag.Int("repeats", 7, "timed repeats per line (the median is printed; at least 5)")
	only := flag.String("shape", "", "run only shapes whose key contains this (e.g. batch=4096)")
	fuse := flag.Bool("fuse-backward", false, "fuse activation derivatives into the dx GEMMs, as trainer run --fuse-backward")
	flag.Parse()
	noLinearChain = !*fuse
	if err := run(strings.Split(*precs, ","), strings.Split(*modes, ","), max(*repeats, 5), *only); err != nil {
		fmt.Fprintln(os.Stderr, "gpukit-trainbench:", err)
		os.Exit(1)
	}
}

func run(precs, modes []string, repeats int, only string) error {
	for _, p := range precs {
		if _, ok := precisions[p]; !ok {
			return fmt.Errorf("--precision %q: want f32, tf32 or bf16", p)
		}
	}
	for _, m := range modes {
		if m != "graph" && m != "eager" && m != "gemm" {
			return fmt.Errorf("--modes %q: want graph, eager or gemm", m)
		}
	}
	d, err := device.NewCUDA(0)
	if err != nil {
		return err
	}
	defer d.Close()
	enc := json.NewEncoder(os.Stdout)
	for _, p := range precs {
		for _, s := range DefaultShapes {
			if only != "" && !strings.Contains(Key(s, p, ""), only) {
				continue
			}
			rs, err := benchShape(d, s, p, modes, repeats)
			if err != nil {
				return fmt.Errorf("%s: %w", Key(s, p, ""), err)
			}
			for _, r := range rs {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// setup is one model, optimizer and engine on the GPU.
type setup struct {
	d    *device.CUDA
	e    *ops.Engine
	s    cuda.Stream
	mlp  *nn.MLP
	opt  *optim.AdamW
	bufs []*tensor.Tensor // extra buffers of the GEMM-only step
}

func newSetup(d *device.CUDA, s Shape, prec ops.Precision) (*setup, error) {
	e, err := ops.NewEngine(d, ops.Options{Precision: prec, NoLinearChain: noLinearChain})
	if err != nil {
		return nil, err
	}
	a := device.Local{Dev: d}
	mc := nn.MLPConfig{Widths: s.Widths, Act: ops.ActReLU, Batch: s.Batch, Seed: 1}
	if prec == ops.PrecBF16 {
		// bf16 storage: the MLP on an ops.Graph with bf16 activations, as
		// the trainer runs it (issue 10), not the chain's per-GEMM casts.
		mc.Graph, mc.Autocast = e, tensor.BF16
	}
	mlp, err := nn.NewMLP(a, mc)
	if err != nil {
		return nil, err
	}
	opt, err := optim.NewAdamW(a, "", mlp.Params(), ops.DefaultAdamW)
	if err != nil {
		mlp.Free()
		return nil, err
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, mlp.Input().Numel())
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	y := make([]int32, s.Batch)
	for i := range y {
		y[i] = int32(r.IntN(s.Widths[len(s.Widths)-1]))
	}
	if err := mlp.Input().WriteF32(x); err != nil {
		return nil, err
	}
	if err := mlp.Labels().Write(tensor.AsBytes(y)); err != nil {
		return nil, err
	}
	return &setup{d: d, e: e, s: e.Stream(), mlp: mlp, opt: opt}, nil
}

func (u *setup) close() {
	u.d.Sync()
	for _, b := range u.bufs {
		b.Buf.Free()
	}
	u.opt.Free()
	u.mlp.Free()
	u.e.Close()
}

// step queues one whole training step.
func (u *setup) step() error {
	if err := u.mlp.Forward(u.e); err != nil {
		return err
	}
	if err := u.mlp.Backward(u.e); err != nil {
		return err
	}
	return u.opt.Step(u.e)
}

// gemms queues the step's GEMMs alone: per layer the forward product, the
// weight gradient and (but for the first layer) the input gradient, on
// buffers of the right shapes.
func (u *setup) gemms() error {
	ws := u.mlp.Config().Widths
	b := u.mlp.Config().Batch
	if u.bufs == nil {
		a := device.Local{Dev: u.d}
		r := rand.New(rand.NewPCG(3, 4))
		for i := 0; i+1 < len(ws); i++ {
			for _, sh := range [][]int{{b, ws[i]}, {b, ws[i+1]}, {b, ws[i]}, {ws[i+1], ws[i]}} {
				t, err := tensor.Alloc(a, "", tensor.F32, sh...)
				if err != nil {
					return err
				}
				u.bufs = append(u.bufs, t)
				v := make([]float32, t.Numel()) // random inputs: no zeros or NaN shortcuts
				for j := range v {
					v[j] = float32(r.NormFloat64())
				}
				if err := t.WriteF32(v); err != nil {
					return err
				}
			}
		}
	}
	ps := u.mlp.Params()
	for i := 0; i+1 < len(ws); i++ {
		x, y, dx, dw := u.bufs[4*i], u.bufs[4*i+1], u.bufs[4*i+2], u.bufs[4*i+3]
		w := ps[2*i].Value
		if err := u.e.Linear(y, x, w, nil, nil, ops.ActNone); err != nil {
			return err
		}
		if i == 0 {
			dx = nil
		}
		if err := u.e.LinearBackward(dx, dw, nil, y, x, w, nil, ops.ActNone); err != nil {
			return err
		}
	}
	return nil
}

// graphOf captures fn into a graph (after one eager run for scratch).
func (u *setup) graphOf(fn func() error) (cuda.GraphExec, func(), error) {
	if err := fn(); err != nil {
		return 0, nil, err
	}
	var g cuda.Graph
	var x cuda.GraphExec
	err := u.d.Do(func() error {
		if err := u.s.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
			return err
		}
		ferr := fn()
		var err error
		g, err = u.s.EndCapture()
		if ferr != nil {
			return ferr
		}
		if err != nil {
			return err
		}
		x, err = g.Instantiate()
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return x, func() { u.d.Do(func() error { x.Destroy(); return g.Destroy() }) }, nil
}

// timeIt runs fn for warm-up, picks an iteration count of at least 20 ms,
// and returns the per-call milliseconds of each of repeats timed runs.
func (u *setup) timeIt(fn func() error, repeats int) ([]float64, error) {
	var start, stop cuda.Event
	err := u.d.Do(func() error {
		var err error
		if start, err = cuda.EventCreate(cuda.EventDefault); err != nil {
			return err
		}
		stop, err = cuda.EventCreate(cuda.EventDefault)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer u.d.Do(func() error { start.Destroy(); return stop.Destroy() })
	once := func(iters int) (float64, error) {
		var ms float32
		err := u.d.Do(func() error {
			if err := u.s.Synchronize(); err != nil {
				return err
			}
			if err := start.Record(u.s); err != nil {
				return err
			}
			for range iters {
				if err := fn(); err != nil {
					return err
				}
			}
			if err := stop.Record(u.s); err != nil {
				return err
			}
			if err := stop.Synchronize(); err != nil {
				return err
			}
			var err error
			ms, err = cuda.EventElapsed(start, stop)
			return err
		})
		return float64(ms) / float64(iters), err
	}
	warm, err := once(10)
	if err != nil {
		return nil, err
	}
	iters := max(20, int(20/max(warm, 1e-3)))
	out := make([]float64, repeats)
	for i := range out {
		if out[i], err = once(iters); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func benchShape(d *device.CUDA, s Shape, precName string, modes []string, repeats int) ([]Result, error) {
	prec := precisions[precName]
	u, err := newSetup(d, s, prec)
	if err != nil {
		return nil, err
	}
	defer u.close()
	flops := nn.MLPStepFLOPs(s.Widths, s.Batch)
	peak, havePeak := ops.PeakFLOPS(d, prec)
	var out []Result
	for _, mode := range modes {
		var fn func() error
		switch mode {
		case "eager":
			fn = u.step
		case "graph", "gemm":
			body := u.step
			if mode == "gemm" {
				body = u.gemms
			}
			x, free, err := u.graphOf(body)
			if err != nil {
				return nil, fmt.Errorf("%s: capture: %w", mode, err)
			}
			defer free()
			fn = func() error { return x.Launch(u.s) }
		}
		rs, err := u.timeIt(fn, repeats)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		med := median(rs)
		r := Result{Impl: "gpukit", Key: Key(s, precName, mode), MS: med, Flops: flops, Device: d.Name(), Repeats: rs}
		if havePeak {
			r.MFU = flops / (med * 1e-3) / peak
		}
		out = append(out, r)
	}
	return out, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
