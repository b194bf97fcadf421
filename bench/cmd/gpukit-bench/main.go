// Command gpukit-bench is gpukit's side of the side-by-side benchmarks: it runs
// every workload of bench/workloads.json once (one round: warm-up, then `iters`
// launches between two CUDA events) and prints one JSON line per workload,
// the same fields bench/reference/bench.py prints for PyTorch. bench/run.sh
// alternates the two and bench/report.py takes medians.
//
// It needs a GPU machine; without one it exits 1 with one line saying why.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"

	"gpukit/libgpu/cuda"
)

// Workload is one entry of workloads.json.
type Workload struct {
	Name    string `json:"name"`
	DType   string `json:"dtype,omitempty"`
	Act     string `json:"act,omitempty"`
	M       int    `json:"m,omitempty"`
	N       int    `json:"n,omitempty"`
	K       int    `json:"k,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	Kernels int    `json:"kernels,omitempty"`
	PCH     string `json:"pch,omitempty"`
	Iters   int    `json:"iters"`
}

// Key matches bench.py's key(): name then the fields that are set, in order.
func (w Workload) Key() string {
	parts := []string{w.Name}
	if w.DType != "" {
		parts = append(parts, "dtype="+w.DType)
	}
	if w.Act != "" {
		parts = append(parts, "act="+w.Act)
	}
	if w.M != 0 {
		parts = append(parts, fmt.Sprintf("m=%d", w.M), fmt.Sprintf("n=%d", w.N), fmt.Sprintf("k=%d", w.K))
	}
	if w.Bytes != 0 {
		parts = append(parts, fmt.Sprintf("bytes=%d", w.Bytes))
	}
	if w.Kernels != 0 {
		parts = append(parts, fmt.Sprintf("kernels=%d", w.Kernels))
	}
	if w.PCH != "" {
		parts = append(parts, "pch="+w.PCH)
	}
	return strings.Join(parts, " ")
}

// Result is one output line.
type Result struct {
	Impl   string  `json:"impl"`
	Key    string  `json:"key"`
	MS     float64 `json:"ms"`
	Flops  float64 `json:"flops"`
	Bytes  float64 `json:"bytes"`
	Device string  `json:"device"`
	Note   string  `json:"note,omitempty"`
}

func main() {
	spec := flag.String("spec", "bench/workloads.json", "workloads file")
	filter := flag.String("filter", "", "run only workloads whose key contains this")
	flag.Parse()
	if err := run(*spec, *filter); err != nil {
		fmt.Fprintln(os.Stderr, "gpukit-bench:", err)
		os.Exit(1)
	}
}

func run(specPath, filter string) error {
	raw, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec struct {
		Workloads []Workload `json:"workloads"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	runtime.LockOSThread()
	b, err := newBench()
	if err != nil {
		return err
	}
	defer b.close()
	enc := json.NewEncoder(os.Stdout)
	for _, w := range spec.Workloads {
		if filter != "" && !strings.Contains(w.Key(), filter) {
			continue
		}
		r, err := b.run(w)
		if errors.Is(err, errSkip) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", w.Key(), err)
		}
		r.Impl, r.Key, r.Device = "gpukit", w.Key(), b.name
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

var errSkip = errors.New("skip")

type bench struct {
	ctx    *cuda.Context
	name   string
	stream cuda.Stream
	start  cuda.Event
	stop   cuda.Event
	lt     *cuda.LtHandle
	rng    *rand.Rand
}

func newBench() (*bench, error) {
	if err := cuda.Init(); err != nil {
		return nil, err
	}
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return nil, err
	}
	ctx, err := cuda.PrimaryContext(dev)
	if err != nil {
		return nil, err
	}
	if err := ctx.SetCurrent(); err != nil {
		return nil, err
	}
	name, err := dev.Name()
	if err != nil {
		return nil, err
	}
	b := &bench{ctx: ctx, name: name, rng: rand.New(rand.NewPCG(1, 2))}
	if b.stream, err = cuda.StreamCreate(true); err != nil {
		return nil, err
	}
	if b.start, err = cuda.EventCreate(cuda.EventDefault); err != nil {
		return nil, err
	}
	if b.stop, err = cuda.EventCreate(cuda.EventDefault); err != nil {
		return nil, err
	}
	if b.lt, err = cuda.LtCreate(); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *bench) close() {
	b.lt.Destroy()
	b.start.Destroy()
	b.stop.Destroy()
	b.stream.Destroy()
	b.ctx.Release()
}

// timed runs fn 3 times to warm up, then iters times between two events, and
// returns milliseconds per call.
func (b *bench) timed(iters int, fn func() error) (float64, error) {
	for i := 0; i < 3; i++ {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	if err := b.stream.Synchronize(); err != nil {
		return 0, err
	}
	if err := b.start.Record(b.stream); err != nil {
		return 0, err
	}
	for i := 0; i < iters; i++ {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	if err := b.stop.Record(b.stream); err != nil {
		return 0, err
	}
	if err := b.stop.Synchronize(); err != nil {
		return 0, err
	}
	ms, err := cuda.EventElapsed(b.start, b.stop)
	return float64(ms) / float64(iters), err
}

func (b *bench) run(w Workload) (Result, error) {
	switch w.Name {
	case "copy":
		return b.copyBW(w)
	case "gemm":
		return b.gemm(w)
	case "linear_fwd", "linear_bwd":
		return b.linear(w)
	case "launch_eager", "launch_graph":
		return b.launch(w)
	case "compile_cold", "compile_warm":
		return b.compile(w)
	}
	return Result{}, fmt.Errorf("unknown workload %q", w.Name)
}

func (b *bench) copyBW(w Workload) (Result, error) {
	n := w.Bytes / 2
	src, err := b.randomBuffer(n, 1)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(src)
	dst, err := cuda.MemAlloc(n)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(dst)
	ms, err := b.timed(w.Iters, func() error { return cuda.MemcpyDtoDAsync(dst, src, n, b.stream) })
	return Result{MS: ms, Bytes: float64(2 * n)}, err
}

// randomBuffer allocates n bytes on the device filled with random elements of
// elemSize bytes (1: bytes, 2: bf16 in [-1, 1), 4: f32 in [-1, 1)).
func (b *bench) randomBuffer(n int64, elemSize int) (cuda.DevicePtr, error) {
	host := make([]byte, n)
	switch elemSize {
	case 1:
		for i := range host {
			host[i] = byte(b.rng.Uint32())
		}
	case 2:
		for i := 0; i+1 < len(host); i += 2 {
			h := bf16(float32(b.rng.Float64()*2 - 1))
			host[i], host[i+1] = byte(h), byte(h>>8)
		}
	case 4:
		f := bytesAsF32(host)
		for i := range f {
			f[i] = float32(b.rng.Float64()*2 - 1)
		}
	}
	p, err := cuda.MemAlloc(n)
	if err != nil {
		return 0, err
	}
	if err := cuda.MemcpyHtoD(p, ptrOf(host), n); err != nil {
		cuda.MemFree(p)
		return 0, err
	}
	return p, nil
}
