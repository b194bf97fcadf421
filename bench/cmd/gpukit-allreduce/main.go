// Command gpukit-allreduce measures NCCL collective bus bandwidth through
// libgpu/nccl, as nccl-tests' all_reduce_perf (reduce_scatter_perf,
// all_gather_perf) does, and prints one JSON line per (collective, dtype,
// mode) on rank 0:
//
//	{"impl":"gpukit","key":"allreduce bytes=268435456 dtype=f32 ranks=2 mode=eager",
//	 "op":"allreduce","bytes":268435456,"dtype":"f32","ranks":2,"mode":"eager","us":...,
//	 "algbw_GBps":...,"busbw_GBps":...,"repeats_us":[...],"nccl":"2.27.7","device":"NVIDIA H200"}
//
// --ops picks the collectives: allreduce (in-place sum all-reduce of
// --size bytes), reducescatter (in-place sum reduce-scatter of a --size
// buffer, each rank receiving its 1/n: ZeRO-1's gradient bucket),
// allgather (in-place all-gather into a --size buffer: ZeRO-1's parameter
// bucket). us is the time of one collective (median over --repeats of
// --iters back-to-back collectives timed with CUDA events on rank 0 after
// a barrier); algbw = bytes/time, with bytes the whole --size buffer, and
// busbw = algbw·2(n−1)/n for an all-reduce, algbw·(n−1)/n for a
// reduce-scatter or an all-gather — nccl-tests' definitions
// (PERFORMANCE.md: what a ring moves per rank, so the figure compares
// with the hardware's link bandwidth at any n; a reduce-scatter and an
// all-gather are each half of a ring all-reduce). Mode "eager" launches
// each collective from the host; "graph" replays the --iters collectives
// captured as one CUDA graph (nccl-tests -G). --min-ctas and --max-ctas
// bound NCCL's CTAs per collective (nccl.Config; NCCL_MIN_CTAS and
// NCCL_MAX_CTAS do the same from the environment).
//
// Inside a rank environment (WORLD_SIZE set: trainer launch, torchrun,
// srun) it is one rank; otherwise it starts --nproc ranks of itself
// through libgpu/dist/launch. bench/reference/allreduce.py measures
// torch.distributed.all_reduce the same way; bench/reference/allreduce.sh
// runs both and prints the table. It needs GPUs and NCCL; without them it
// exits 1 with one line saying why.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/dist/launch"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Result is one output line.
type Result struct {
	Impl    string    `json:"impl"`
	Key     string    `json:"key"`
	Op      string    `json:"op"`
	Bytes   int64     `json:"bytes"`
	DType   string    `json:"dtype"`
	Ranks   int       `json:"ranks"`
	Mode    string    `json:"mode"`
	US      float64   `json:"us"`
	AlgBW   float64   `json:"algbw_GBps"`
	BusBW   float64   `json:"busbw_GBps"`
	Repeats []float64 `json:"repeats_us"`
	NCCL    string    `json:"nccl"`
	Device  string    `json:"device"`
}

// Key is the line's key, shared with allreduce.py: the collective op
// (allreduce, reducescatter, allgather), then its size, dtype, ranks and
// mode.
func Key(op string, bytes int64, dtype string, ranks int, mode string) string {
	return fmt.Sprintf("%s bytes=%d dtype=%s ranks=%d mode=%s", op, bytes, dtype, ranks, mode)
}

// BusBW is nccl-tests' bus bandwidth of collective op: algbw·2(n−1)/n for
// an all-reduce, algbw·(n−1)/n for a reduce-scatter or an all-gather.
func BusBW(op string, algbw float64, ranks int) float64 {
	f := float64(ranks-1) / float64(ranks)
	if op == "allreduce" {
		f *= 2
	}
	return algbw * f
}

// ops are the collectives --ops names.
var ops3 = []string{"allreduce", "reducescatter", "allgather"}

func main() {
	nproc := flag.Int("nproc", 2, "ranks to start on this machine when not started as a rank")
	size := flag.String("size", "256MiB", "bytes per all-reduce (IEC or SI: 256MiB, 1G = 1GiB)")
	dtypes := flag.String("dtypes", "f32,bf16", "comma-separated: f32, bf16")
	opsFlag := flag.String("ops", "allreduce", "comma-separated: allreduce, reducescatter, allgather")
	minCTAs := flag.Int("min-ctas", 0, "NCCL's minimum CTAs per collective (0: NCCL's choice)")
	maxCTAs := flag.Int("max-ctas", 0, "NCCL's maximum CTAs per collective (0: NCCL's choice)")
	modes := flag.String("modes", "eager,graph", "comma-separated: eager, graph")
	iters := flag.Int("iters", 20, "collectives per timed repeat")
	warmup := flag.Int("warmup", 5, "untimed collectives first")
	repeats := flag.Int("repeats", 5, "timed repeats (the median is printed)")
	flag.Parse()
	cfg := nccl.Config{MinCTAs: *minCTAs, MaxCTAs: *maxCTAs}
	if err := run(*nproc, *size, *dtypes, *opsFlag, *modes, *iters, *warmup, *repeats, cfg); err != nil {
		fmt.Fprintln(os.Stderr, kit.Message("gpukit-allreduce", err))
		os.Exit(max(launch.Status(err), kit.ExitCode(err)))
	}
}

func run(nproc int, sizeArg, dtypes, opList, modes string, iters, warmup, repeats int, cfg nccl.Config) error {
	size, err := kit.ParseSize(sizeArg)
	if err != nil {
		return err
	}
	colls := strings.Split(opList, ",")
	for _, o := range colls {
		if !slices.Contains(ops3, o) {
			return kit.Usagef("--ops %q: want allreduce, reducescatter or allgather", opList)
		}
	}
	if _, ok := os.LookupEnv("WORLD_SIZE"); !ok {
		if _, ok := os.LookupEnv("SLURM_STEP_ID"); !ok {
			return self(nproc)
		}
	}
	w, err := dist.FromEnv()
	if err != nil {
		return err
	}
	visible, err := cuda.DeviceCount()
	if err != nil {
		return err
	}
	ord, err := w.DeviceOrdinal(visible)
	if err != nil {
		return err
	}
	d, err := device.NewCUDA(ord)
	if err != nil {
		return err
	}
	defer d.Close()
	e, err := ops.NewEngine(d, ops.Options{})
	if err != nil {
		return err
	}
	c, err := nccl.ConnectConfig(context.Background(), e, &dist.Rendezvous{World: w}, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	ver, _ := nccl.LibraryVersion()
	a := device.Local{Dev: d}
	barrier, err := tensor.Alloc(a, "", tensor.F32, 1)
	if err != nil {
		return err
	}
	for _, ds := range strings.Split(dtypes, ",") {
		dt, err := tensor.ParseDType(ds)
		if err != nil || (dt != tensor.F32 && dt != tensor.BF16) {
			return fmt.Errorf("--dtypes %q: want f32 and bf16", dtypes)
		}
		// A multiple of the ranks, so a reduce-scatter's and an all-gather's
		// parts are equal.
		x, err := tensor.Alloc(a, "", dt, int(size)/dt.Size()/w.Size*w.Size)
		if err != nil {
			return err
		}
		// Zeros: sums stay finite however often they are repeated.
		if err := x.Write(make([]byte, x.Bytes())); err != nil {
			return err
		}
		part, err := x.Rows(w.Rank*x.Numel()/w.Size, (w.Rank+1)*x.Numel()/w.Size)
		if err != nil {
			return err
		}
		for _, op := range colls {
			one := map[string]func() error{
				"allreduce":     func() error { return c.AllReduce(e, x, x, nccl.Sum) },
				"reducescatter": func() error { return c.ReduceScatter(e, part, x, nccl.Sum) },
				"allgather":     func() error { return c.AllGather(e, x, part) },
			}[op]
			for _, mode := range strings.Split(modes, ",") {
				us, err := measure(e, c, one, barrier, mode, iters, warmup, repeats)
				if err != nil {
					return fmt.Errorf("%s %v %s: %w", op, dt, mode, err)
				}
				if w.Rank != 0 {
					continue
				}
				t := median(us)
				alg := float64(x.Bytes()) / (t * 1e-6) / 1e9
				out, _ := json.Marshal(Result{Impl: "gpukit", Key: Key(op, x.Bytes(), dt.String(), w.Size, mode), Op: op, Bytes: x.Bytes(),
					DType: dt.String(), Ranks: w.Size, Mode: mode, US: t, AlgBW: alg, BusBW: BusBW(op, alg, w.Size),
					Repeats: us, NCCL: ver.String(), Device: d.Name()})
				fmt.Println(string(out))
			}
		}
		x.Buf.Free()
	}
	return nil
}

// measure returns the time of one collective (one) in µs, per repeat.
func measure(e *ops.Engine, c *nccl.Comm, one func() error, barrier *tensor.Tensor, mode string, iters, warmup, repeats int) ([]float64, error) {
	many := func(n int) error {
		for range n {
			if err := one(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := many(warmup); err != nil {
		return nil, err
	}
	var body func() error
	switch mode {
	case "eager":
		body = func() error { return many(iters) }
	case "graph":
		g, err := e.Capture(func() error { return many(iters) })
		if err != nil {
			return nil, err
		}
		defer g.Close()
		if err := g.Launch(); err != nil { // one untimed replay
			return nil, err
		}
		body = g.Launch
	default:
		return nil, fmt.Errorf("mode %q: want eager or graph", mode)
	}
	start, err := e.NewEvent(true)
	if err != nil {
		return nil, err
	}
	defer start.Close()
	end, err := e.NewEvent(true)
	if err != nil {
		return nil, err
	}
	defer end.Close()
	var us []float64
	for range repeats {
		// A barrier: every rank's queue is empty and the ranks start together.
		if err := c.AllReduce(e, barrier, barrier, nccl.Sum); err != nil {
			return nil, err
		}
		if err := e.Sync(); err != nil {
			return nil, err
		}
		if err := start.Record(); err != nil {
			return nil, err
		}
		if err := body(); err != nil {
			return nil, err
		}
		if err := end.Record(); err != nil {
			return nil, err
		}
		if err := end.Wait(); err != nil {
			return nil, err
		}
		ms, err := end.Elapsed(start)
		if err != nil {
			return nil, err
		}
		us = append(us, float64(ms)*1e3/float64(iters))
	}
	return us, c.AsyncError()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// self starts nproc ranks of this program with the same arguments.
func self(nproc int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	return launch.Run(context.Background(), launch.Config{
		Command: append([]string{exe}, os.Args[1:]...), NProc: nproc, Signals: sigs, Grace: 10 * time.Second,
	})
}
