package nccl_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/dist/launch"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// GPU tests. One GPU: the library, and a communicator of one rank whose
// collectives run through NCCL eagerly and inside a captured graph. Two
// GPUs (TestMultiGPU*, run with GPUKIT_TEST_RUN='^TestMultiGPU' on a
// 2-GPU machine; they skip elsewhere unless GPUKIT_REQUIRE_GPUS=2): two
// ranks started through dist/launch as re-executions of this test binary
// (TestRankHelper), joined through dist.Rendezvous, checking every
// collective exactly (f32 and bf16, up to 256 MiB), the Reducer's bucketed
// all-reduce on the communication stream inside a replayed graph (f32 and
// compressed to bf16), and the same over
// NCCL's socket transport with the ranks as two machines on 127.0.0.1.

// requireNCCL is cudatest.RequireGPU plus a loadable NCCL: on the GPU
// machine (GPUKIT_REQUIRE_GPU=1) a missing NCCL fails the test.
func requireNCCL(t *testing.T) {
	t.Helper()
	cudatest.RequireGPU(t)
	if _, err := nccl.LibraryVersion(); err != nil {
		if os.Getenv(cudatest.EnvRequireGPU) == "1" {
			t.Fatalf("NCCL required (%s=1): %v", cudatest.EnvRequireGPU, err)
		}
		t.Skipf("no NCCL: %v", err)
	}
}

func TestNCCLLibrary(t *testing.T) {
	requireNCCL(t)
	v, _ := nccl.LibraryVersion()
	t.Logf("NCCL %v from %s", v, nccl.LibraryPath())
	if v < nccl.MinVersion || nccl.LibraryPath() == "" {
		t.Fatalf("version %v, path %q", v, nccl.LibraryPath())
	}
	if os.Getenv(nccl.EnvNVLS) == "" {
		t.Fatalf("%s unset after loading NCCL", nccl.EnvNVLS)
	}
	id, err := nccl.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	if id == (nccl.UniqueID{}) {
		t.Fatal("unique id of zeros")
	}
}

// pattern is rank r's element i: a small integer, so that sums, averages
// over a power-of-two number of ranks and maxima are exact in f32 and bf16.
func pattern(r, i, salt int) float32 { return float32((i*7+r*13+salt*5)%17 - 8) }

// setup opens this rank's GPU and an engine on it.
func setup(t *testing.T, ordinal int) (*ops.Engine, device.Allocator) {
	t.Helper()
	d, err := device.NewCUDA(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	e, err := ops.NewEngine(d, ops.Options{Precision: ops.PrecF32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, device.Local{Dev: d}
}

func alloc(t *testing.T, a device.Allocator, dt tensor.DType, n int, f func(i int) float32) *tensor.Tensor {
	t.Helper()
	x, err := tensor.Alloc(a, "", dt, n)
	if err != nil {
		t.Fatal(err)
	}
	if f != nil {
		v := make([]float32, n)
		for i := range v {
			v[i] = f(i)
		}
		if err := x.WriteFloat32(v); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// expect compares x (read after all queued work) with want(i), exactly, or
// within tol.
func expect(t *testing.T, what string, x *tensor.Tensor, tol float64, want func(i int) float64) {
	t.Helper()
	got, err := x.ReadFloat32()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for i, g := range got {
		if w := want(i); math.Abs(float64(g)-w) > tol || math.IsNaN(float64(g)) {
			t.Fatalf("%s: element %d of %d is %v, want %v", what, i, len(got), g, w)
		}
	}
}

// TestNCCLOneRank: a communicator of one rank made through NCCL (not
// Solo; its collectives are copies, see Comm.local): every collective,
// eagerly and replayed in a captured graph, the Reducer on the communication stream
// inside the graph; AsyncError stays nil.
func TestNCCLOneRank(t *testing.T) {
	requireNCCL(t)
	e, a := setup(t, 0)
	id, err := nccl.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := nccl.NewComm(e, id, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.IsSolo() || c.Size() != 1 {
		t.Fatalf("communicator: solo %v size %d", c.IsSolo(), c.Size())
	}
	const n = 1<<20 + 3
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		src := alloc(t, a, dt, n, func(i int) float32 { return pattern(0, i, 0) })
		dst := alloc(t, a, dt, n, nil)
		for name, op := range map[string]func() error{
			"all-reduce avg": func() error { return c.AllReduce(e, dst, src, nccl.Avg) },
			"broadcast":      func() error { return c.Broadcast(e, dst, src, 0) },
			"all-gather":     func() error { return c.AllGather(e, dst, src) },
			"reduce-scatter": func() error { return c.ReduceScatter(e, dst, src, nccl.Sum) },
		} {
			if err := dst.WriteFloat32(values(n, 5)); err != nil { // not the answer
				t.Fatal(err)
			}
			if err := op(); err != nil {
				t.Fatalf("%v %s: %v", dt, name, err)
			}
			expect(t, fmt.Sprint(dt, " ", name), dst, 0, func(i int) float64 { return float64(pattern(0, i, 0)) })
		}
	}
	// A graph: a copy on the main stream, then the Reducer's all-reduces on
	// the communication stream, replayed with new inputs.
	ps := []dist.Param{{Name: "a", DType: tensor.F32, Shape: []int{300, 700}}, {Name: "b", DType: tensor.F32, Shape: []int{5}},
		{Name: "c", DType: tensor.F32, Shape: []int{1 << 18}}}
	l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 512 << 10, FirstBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.Alloc(a, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	r, err := nccl.NewReducer(e, c, l, g, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	srcs := make([]*tensor.Tensor, len(ps))
	for i, p := range ps {
		srcs[i] = alloc(t, a, tensor.F32, tensor.Numel(p.Shape), nil)
	}
	step := func() error {
		for i := len(ps) - 1; i >= 0; i-- {
			flat, err := g.Params[i].Reshape(tensor.Numel(ps[i].Shape))
			if err != nil {
				return err
			}
			if err := e.Copy(flat, srcs[i]); err != nil {
				return err
			}
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		return r.Wait()
	}
	load := func(salt int) {
		for i, s := range srcs {
			v := make([]float32, s.Numel())
			for j := range v {
				v[j] = pattern(i, j, salt)
			}
			if err := s.WriteFloat32(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(what string, salt int) {
		for i := range ps {
			flat, _ := g.Params[i].Reshape(tensor.Numel(ps[i].Shape))
			expect(t, fmt.Sprintf("%s: gradient %d", what, i), flat, 0, func(j int) float64 { return float64(pattern(i, j, salt)) })
		}
	}
	load(1)
	if err := step(); err != nil { // eager first: NCCL connects, the communication stream is made
		t.Fatal(err)
	}
	check("eager", 1)
	graph, err := e.Capture(step)
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for k := 2; k < 5; k++ {
		load(k)
		if err := graph.Launch(); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprint("replay ", k), k)
	}
	if err := c.AsyncError(); err != nil {
		t.Fatal(err)
	}
}

// ranks runs mode on the ranks of nodes, this test binary re-executed
// through dist/launch (nccltest.Ranks); each node config stands for a
// machine. In mode "sockets" every channel must go through NCCL's socket
// transport.
func ranks(t *testing.T, mode string, nodes []launch.Config) {
	t.Helper()
	log := nccltest.Ranks(t, "TestRankHelper", mode, nodes)
	// NCCL logs each channel's connection (NCCL_DEBUG=INFO, subsystems
	// INIT and NET): "Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0".
	if mode == "sockets" && (!strings.Contains(log, "via NET/Socket") || strings.Contains(log, "via P2P") || strings.Contains(log, "via SHM")) {
		t.Errorf("the ranks' channels did not all go through NCCL's socket transport (want \"via NET/Socket\" and no \"via P2P\" or \"via SHM\" in NCCL's log)")
	}
}

// TestRanksHarness runs the multi-GPU tests' harness on any machine: two
// ranks of this binary, on one "machine" and as two, meet through the
// rendezvous (no GPU, no NCCL).
func TestRanksHarness(t *testing.T) {
	ranks(t, "rendezvous", []launch.Config{{NProc: 2}})
	ranks(t, "rendezvous", []launch.Config{
		{NProc: 1, NNodes: 2, NodeRank: 0, MasterAddr: "127.0.0.1"},
		{NProc: 1, NNodes: 2, NodeRank: 1, MasterAddr: "127.0.0.1"},
	})
}

// TestMultiGPUCollectives: two ranks on two GPUs of this machine.
func TestMultiGPUCollectives(t *testing.T) {
	nccltest.NeedGPUs(t, 2)
	ranks(t, "collectives", []launch.Config{{NProc: 2}})
}

// TestMultiGPUGraph: the Reducer's all-reduces of gradient buckets on the
// communication stream (in f32, and compressed to bf16: cast, bf16
// all-reduce, cast back), and a 256 MiB in-place all-reduce, captured and
// replayed.
func TestMultiGPUGraph(t *testing.T) {
	nccltest.NeedGPUs(t, 2)
	ranks(t, "graph", []launch.Config{{NProc: 2}})
}

// TestMultiGPUSockets: two "machines" on 127.0.0.1, one GPU each (two
// launches, --nnodes 2), with NCCL's peer-to-peer and shared-memory
// transports off: the ranks talk through NCCL's socket transport, as
// across machines without InfiniBand.
func TestMultiGPUSockets(t *testing.T) {
	nccltest.NeedGPUs(t, 2)
	env := []string{"NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1", "NCCL_NET=Socket", "NCCL_SOCKET_IFNAME=lo",
		"NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET"}
	ranks(t, "sockets", []launch.Config{
		{NProc: 1, NNodes: 2, NodeRank: 0, MasterAddr: "127.0.0.1", Env: append([]string{"CUDA_VISIBLE_DEVICES=0"}, env...)},
		{NProc: 1, NNodes: 2, NodeRank: 1, MasterAddr: "127.0.0.1", Env: append([]string{"CUDA_VISIBLE_DEVICES=1"}, env...)},
	})
}

// TestMultiGPUReduceScatter: the Reducer in Scatter mode (ZeRO-1) on two
// ranks, f32 and compressed to bf16, eagerly and replayed from a capture:
// each rank's part of every bucket holds the average, the rest its own
// gradients.
func TestMultiGPUReduceScatter(t *testing.T) {
	nccltest.NeedGPUs(t, 2)
	ranks(t, "scatter", []launch.Config{{NProc: 2}})
}

// TestMultiGPUConfig: communicators made with a Config (at most 2 CTAs
// per collective) give the same exact collectives and reduce-scatters.
func TestMultiGPUConfig(t *testing.T) {
	nccltest.NeedGPUs(t, 2)
	ranks(t, "config", []launch.Config{{NProc: 2}})
}

// TestMultiGPU4: four ranks on four GPUs: every collective (up to
// 256 MiB), the Reducer's all-reduces and reduce-scatters in replayed
// graphs.
func TestMultiGPU4(t *testing.T) {
	nccltest.NeedGPUs(t, 4)
	for _, mode := range []string{"collectives", "graph", "scatter"} {
		t.Run(mode, func(t *testing.T) { ranks(t, mode, []launch.Config{{NProc: 4}}) })
	}
}

// TestRankHelper is one rank of the TestMultiGPU tests when
// GPUKIT_NCCL_RANK_MODE is set, and does nothing otherwise.
func TestRankHelper(t *testing.T) {
	mode := nccltest.RankMode()
	if mode == "" {
		return
	}
	w, err := dist.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if mode == "rendezvous" { // the harness alone, without a GPU
		rv := &dist.Rendezvous{World: w, Timeout: time.Minute, Logf: t.Logf}
		got, err := rv.Share(context.Background(), "test", func() ([]byte, error) { return []byte("from rank 0"), nil })
		if err != nil || string(got) != "from rank 0" || w.Size != 2 {
			t.Fatalf("%v: %q, %v", w, got, err)
		}
		t.Logf("%v: rendezvous ok", w)
		return
	}
	visible, err := cuda.DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	ord, err := w.DeviceOrdinal(visible)
	if err != nil {
		t.Fatal(err)
	}
	e, a := setup(t, ord)
	t.Logf("%v on %v", w, e.Device())
	var cfg nccl.Config
	if mode == "config" {
		cfg = nccl.Config{MinCTAs: 1, MaxCTAs: 2}
	}
	c, err := nccl.ConnectConfig(context.Background(), e, &dist.Rendezvous{World: w, Timeout: 2 * time.Minute, Logf: t.Logf}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	switch mode {
	case "collectives":
		collectives(t, e, a, c, []int{1, 7, 1<<20 + 3}, true)
	case "sockets":
		collectives(t, e, a, c, []int{7, 1<<20 + 3, 16 << 20}, false)
	case "graph":
		graphs(t, e, a, c)
	case "scatter":
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			reducerScatterGraph(t, e, a, c, dt)
		}
	case "config":
		collectives(t, e, a, c, []int{7, 1<<20 + 3, 16 << 20}, false)
		reducerScatterGraph(t, e, a, c, tensor.F32)
	default:
		t.Fatalf("mode %q", mode)
	}
	if err := c.AsyncError(); err != nil {
		t.Fatal(err)
	}
}

// collectives checks every collective on every rank against the
// patterns, for each size in elements and, with big, 256 MiB per tensor.
func collectives(t *testing.T, e *ops.Engine, a device.Allocator, c *nccl.Comm, sizes []int, big bool) {
	rank, size := c.Rank(), c.Size()
	pow2 := size&(size-1) == 0
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		ns := sizes
		if big {
			ns = append(ns, (256<<20)/dt.Size())
		}
		for _, n := range ns {
			what := fmt.Sprintf("%v ×%d", dt, n)
			src := alloc(t, a, dt, n, func(i int) float32 { return pattern(rank, i, 0) })
			dst := alloc(t, a, dt, n, nil)
			sum := func(i int) float64 {
				s := 0.0
				for r := range size {
					s += float64(pattern(r, i, 0))
				}
				return s
			}
			if err := c.AllReduce(e, dst, src, nccl.Sum); err != nil {
				t.Fatal(err)
			}
			expect(t, what+" all-reduce sum", dst, 0, sum)
			tol := 0.0
			if !pow2 {
				tol = 0.05
			}
			if err := c.AllReduce(e, src, src, nccl.Avg); err != nil { // in place
				t.Fatal(err)
			}
			expect(t, what+" all-reduce avg in place", src, tol, func(i int) float64 { return sum(i) / float64(size) })
			if err := src.WriteFloat32(values(n, rank)); err != nil {
				t.Fatal(err)
			}
			if err := c.AllReduce(e, dst, src, nccl.Max); err != nil {
				t.Fatal(err)
			}
			expect(t, what+" all-reduce max", dst, 0, func(i int) float64 {
				m := math.Inf(-1)
				for r := range size {
					m = max(m, float64(pattern(r, i, 0)))
				}
				return m
			})
			root := size - 1
			if err := c.Broadcast(e, dst, src, root); err != nil {
				t.Fatal(err)
			}
			expect(t, what+" broadcast", dst, 0, func(i int) float64 { return float64(pattern(root, i, 0)) })
			all := alloc(t, a, dt, size*n, nil)
			if err := c.AllGather(e, all, src); err != nil {
				t.Fatal(err)
			}
			expect(t, what+" all-gather", all, 0, func(j int) float64 { return float64(pattern(j/n, j%n, 0)) })
			if err := all.WriteFloat32(values(size*n, rank)); err != nil {
				t.Fatal(err)
			}
			if err := c.ReduceScatter(e, dst, all, nccl.Sum); err != nil {
				t.Fatal(err)
			}
			expect(t, what+" reduce-scatter sum", dst, 0, func(i int) float64 {
				s := 0.0
				for r := range size {
					s += float64(pattern(r, rank*n+i, 0))
				}
				return s
			})
			for _, x := range []*tensor.Tensor{src, dst, all} {
				x.Buf.Free()
			}
			t.Logf("%s: all-reduce (sum, avg, max), broadcast, all-gather, reduce-scatter exact", what)
		}
	}
}

func values(n, rank int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = pattern(rank, i, 0)
	}
	return v
}

// graphs checks the Reducer's bucketed all-reduce (average) on the
// communication stream, in f32 and compressed to bf16 (Reducer.Compress:
// the patterns' averages over a power-of-two number of ranks are exact in
// bf16 too), and an in-place 256 MiB all-reduce, each captured once and
// replayed with new inputs.
func graphs(t *testing.T, e *ops.Engine, a device.Allocator, c *nccl.Comm) {
	rank, size := c.Rank(), c.Size()
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		reducerGraph(t, e, a, c, dt)
	}

	// 256 MiB, in place, replayed: each replay sums what the last left, so
	// replay k holds size^(k-1) × Σ_r pattern(r, i).
	n := (256 << 20) / 4
	x := alloc(t, a, tensor.F32, n, func(i int) float32 { return pattern(rank, i, 0) })
	defer x.Buf.Free()
	if err := c.AllReduce(e, x, x, nccl.Sum); err != nil { // eager first
		t.Fatal(err)
	}
	ar, err := e.Capture(func() error { return c.AllReduce(e, x, x, nccl.Sum) })
	if err != nil {
		t.Fatal(err)
	}
	defer ar.Close()
	for k := 2; k <= 4; k++ {
		if err := ar.Launch(); err != nil {
			t.Fatal(err)
		}
		scale := math.Pow(float64(size), float64(k-1))
		expect(t, fmt.Sprint("256 MiB all-reduce, replay ", k-1), x, 0, func(i int) float64 {
			s := 0.0
			for r := range size {
				s += float64(pattern(r, i, 0))
			}
			return scale * s
		})
	}
	t.Logf("256 MiB all-reduce: 3 replays exact")
}

// reducerGraph is graphs' Reducer check with the buckets communicated in
// comm.
func reducerGraph(t *testing.T, e *ops.Engine, a device.Allocator, c *nccl.Comm, comm tensor.DType) {
	rank, size := c.Rank(), c.Size()
	ps := []dist.Param{
		{Name: "wte", DType: tensor.F32, Shape: []int{512, 768}}, {Name: "ln", DType: tensor.F32, Shape: []int{768}},
		{Name: "fc", DType: tensor.F32, Shape: []int{3072, 768}}, {Name: "proj", DType: tensor.F32, Shape: []int{768, 3072}},
		{Name: "bias", DType: tensor.F32, Shape: []int{3}}, {Name: "head", DType: tensor.F32, Shape: []int{100, 768}},
	}
	l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 4 << 20, FirstBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d parameters in %d buckets", len(ps), len(l.Buckets))
	g, err := l.Alloc(a, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	r, err := nccl.NewReducer(e, c, l, g, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Compress(a, "", comm); err != nil {
		t.Fatal(err)
	}
	defer r.Free()
	srcs := make([]*tensor.Tensor, len(ps))
	flats := make([]*tensor.Tensor, len(ps))
	for i, p := range ps {
		srcs[i] = alloc(t, a, tensor.F32, tensor.Numel(p.Shape), nil)
		if flats[i], err = g.Params[i].Reshape(tensor.Numel(p.Shape)); err != nil {
			t.Fatal(err)
		}
	}
	// The "backward": each gradient written on the main stream, then
	// marked; the buckets' all-reduces overlap the writes that follow.
	step := func() error {
		for i := len(ps) - 1; i >= 0; i-- {
			if err := e.Copy(flats[i], srcs[i]); err != nil {
				return err
			}
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		return r.Wait()
	}
	load := func(salt int) {
		for i, s := range srcs {
			v := make([]float32, s.Numel())
			for j := range v {
				v[j] = pattern(rank, j+i, salt)
			}
			if err := s.WriteFloat32(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(what string, salt int) {
		for i := range ps {
			expect(t, fmt.Sprintf("%s: gradient %s", what, ps[i].Name), flats[i], 0, func(j int) float64 {
				s := 0.0
				for r := range size {
					s += float64(pattern(r, j+i, salt))
				}
				return s / float64(size)
			})
		}
	}
	load(0)
	if err := step(); err != nil {
		t.Fatal(err)
	}
	check("eager", 0)
	graph, err := e.Capture(step)
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for k := 1; k <= 4; k++ {
		load(k)
		if err := graph.Launch(); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprint("replay ", k), k)
	}
	t.Logf("reducer (%v communication): eager and 4 replays exact", comm)
}

// reducerScatterGraph is the Reducer in Scatter mode (buckets cut into
// one part per rank, reduce-scattered on the communication stream, in
// comm), eagerly and over 4 replays of a capture: this rank's part of
// every bucket (its segments, dist.Layout.Segments) holds the average
// over the ranks, exactly; every other element keeps this rank's own
// gradient.
func reducerScatterGraph(t *testing.T, e *ops.Engine, a device.Allocator, c *nccl.Comm, comm tensor.DType) {
	rank, size := c.Rank(), c.Size()
	ps := []dist.Param{
		{Name: "wte", DType: tensor.F32, Shape: []int{512, 768}}, {Name: "ln", DType: tensor.F32, Shape: []int{768}},
		{Name: "fc", DType: tensor.F32, Shape: []int{3072, 768}}, {Name: "proj", DType: tensor.F32, Shape: []int{768, 3072}},
		{Name: "bias", DType: tensor.F32, Shape: []int{3}}, {Name: "head", DType: tensor.F32, Shape: []int{100, 768}},
	}
	l, err := dist.Plan(ps, dist.BucketConfig{Bytes: 4 << 20, FirstBytes: 256 << 10, LastBytes: 1 << 20, Shards: size})
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.Alloc(a, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	r, err := nccl.NewReducer(e, c, l, g, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Scatter(true); err != nil {
		t.Fatal(err)
	}
	if err := r.Compress(a, "", comm); err != nil {
		t.Fatal(err)
	}
	defer r.Free()
	mine := make([][]bool, len(ps))
	for i, p := range ps {
		mine[i] = make([]bool, tensor.Numel(p.Shape))
	}
	for _, sg := range l.Segments(rank) {
		for k := range sg.Numel {
			mine[sg.Param][sg.Offset+k] = true
		}
	}
	srcs := make([]*tensor.Tensor, len(ps))
	flats := make([]*tensor.Tensor, len(ps))
	for i, p := range ps {
		srcs[i] = alloc(t, a, tensor.F32, tensor.Numel(p.Shape), nil)
		if flats[i], err = g.Params[i].Reshape(tensor.Numel(p.Shape)); err != nil {
			t.Fatal(err)
		}
	}
	step := func() error {
		for i := len(ps) - 1; i >= 0; i-- {
			if err := e.Copy(flats[i], srcs[i]); err != nil {
				return err
			}
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		return r.Wait()
	}
	load := func(salt int) {
		for i, s := range srcs {
			v := make([]float32, s.Numel())
			for j := range v {
				v[j] = pattern(rank, j+i, salt)
			}
			if err := s.WriteFloat32(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(what string, salt int) {
		for i := range ps {
			expect(t, fmt.Sprintf("%s: gradient %s", what, ps[i].Name), flats[i], 0, func(j int) float64 {
				if !mine[i][j] {
					return float64(pattern(rank, j+i, salt))
				}
				s := 0.0
				for r := range size {
					s += float64(pattern(r, j+i, salt))
				}
				return s / float64(size)
			})
		}
	}
	load(0)
	if err := step(); err != nil {
		t.Fatal(err)
	}
	check("eager", 0)
	graph, err := e.Capture(step)
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for k := 1; k <= 4; k++ {
		load(k)
		if err := graph.Launch(); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprint("replay ", k), k)
	}
	t.Logf("reduce-scatter reducer (%v communication, %d buckets): eager and 4 replays exact", comm, len(l.Buckets))
}
