// Command gpukit-poolbench measures gpupool: it starts a daemon (the
// gpupool binary: --gpupool, else $GPUKIT_BIN/gpupool, else next to this
// binary, else on PATH) and prints one JSON line per measurement:
//
//	alloc_free     alloc+free round trip of 4 KiB in an already-mapped slab (p50, p99 µs)
//	first_map      first allocation of a fresh connection in an existing slab:
//	               the round trip plus receiving, importing and mapping the slab's fd
//	local_alloc    in-process allocation for comparison: cuMemAlloc+cuMemFree
//	               (cuda), or memfd+mmap+munmap (host)
//	zero_copy      a second process reads a buffer the first wrote (--bytes, 1 GiB):
//	               its copy bandwidth out of the shared buffer vs a copy between two
//	               of its own buffers, both read+write bytes per second, same run
//	concurrent     --clients processes (8) each doing alloc+free round trips at once:
//	               total ops/s and the worst client's p99
//
// It runs on a GPU machine (CUDA backend) and on any other (host backend).
// Usage: gpukit-poolbench [--backend auto|cuda|host] [--iters N] [--bytes N] [--clients N]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/pool"
)

// Result is one output line.
type Result struct {
	Bench   string  `json:"bench"`
	Backend string  `json:"backend"`
	Device  string  `json:"device"`
	N       int     `json:"n,omitempty"`
	P50US   float64 `json:"p50_us,omitempty"`
	P99US   float64 `json:"p99_us,omitempty"`
	Bytes   int64   `json:"bytes,omitempty"`
	GBps    float64 `json:"gb_per_s,omitempty"`     // read+write bytes per second / 1e9
	RefGBps float64 `json:"ref_gb_per_s,omitempty"` // the in-process reference, same run
	Ratio   float64 `json:"ratio,omitempty"`
	OpsPerS float64 `json:"ops_per_s,omitempty"`
	Clients int     `json:"clients,omitempty"`
	Note    string  `json:"note,omitempty"`
}

func main() {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "child-") {
		if err := child(os.Args[1], os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "gpukit-poolbench:", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	bin := flag.String("gpupool", "", "gpupool binary (default: $GPUKIT_BIN/gpupool, next to this binary, or PATH)")
	backend := flag.String("backend", "auto", "auto, cuda or host")
	iters := flag.Int("iters", 20000, "round trips per latency measurement")
	bytes := flag.Int64("bytes", 1<<30, "zero-copy buffer size in bytes")
	clients := flag.Int("clients", 8, "concurrent client processes")
	flag.Parse()
	if err := run(*bin, *backend, *iters, *bytes, *clients); err != nil {
		fmt.Fprintln(os.Stderr, "gpukit-poolbench:", err)
		os.Exit(1)
	}
}

func findGpupool(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	if d := os.Getenv("GPUKIT_BIN"); d != "" {
		if p := filepath.Join(d, "gpupool"); isExec(p) {
			return p, nil
		}
	}
	if exe, err := os.Executable(); err == nil {
		for _, p := range []string{filepath.Join(filepath.Dir(exe), "gpupool"), filepath.Join(filepath.Dir(exe), "..", "bin", "gpupool")} {
			if isExec(p) {
				return p, nil
			}
		}
	}
	return exec.LookPath("gpupool")
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&0o111 != 0
}

func emit(r Result) {
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func percentiles(d []time.Duration) (p50, p99 float64) {
	slices.Sort(d)
	at := func(q float64) float64 {
		i := min(int(q*float64(len(d))), len(d)-1)
		return float64(d[i].Nanoseconds()) / 1e3
	}
	return at(0.50), at(0.99)
}

func run(bin, backend string, iters int, size int64, nClients int) error {
	gp, err := findGpupool(bin)
	if err != nil {
		return fmt.Errorf("no gpupool binary (build it, or pass --gpupool): %w", err)
	}
	dir, err := os.MkdirTemp("", "poolbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "pool.sock")
	d := exec.Command(gp, "serve", "--socket", sock, "--backend", backend)
	d.Stderr = os.Stderr
	out, _ := d.StdoutPipe()
	if err := d.Start(); err != nil {
		return err
	}
	defer func() { d.Process.Signal(unix.SIGTERM); d.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		return fmt.Errorf("gpupool serve did not start")
	}
	c, err := pool.Dial(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	be := c.Hello().Backend
	devName := c.Device().String()
	base := Result{Backend: be, Device: devName}

	// 1. alloc+free in a mapped slab (a held allocation keeps it mapped).
	hold, err := c.Alloc("", 256)
	if err != nil {
		return err
	}
	lat, err := roundTrips(c, iters)
	if err != nil {
		return err
	}
	r := base
	r.Bench, r.N = "alloc_free", iters
	r.P50US, r.P99US = percentiles(lat)
	emit(r)
	rtP50 := r.P50US

	// 2. first allocation of fresh connections in the existing slab.
	var first []time.Duration
	for range 50 {
		fc, err := pool.DialOptions(sock, pool.Options{Device: asCUDA(c.Device())})
		if err != nil {
			return err
		}
		t0 := time.Now()
		b, err := fc.Alloc("", 4096)
		first = append(first, time.Since(t0))
		if err != nil {
			return err
		}
		b.Free()
		fc.Close()
	}
	r = base
	r.Bench, r.N = "first_map", len(first)
	r.P50US, r.P99US = percentiles(first)
	r.Note = fmt.Sprintf("includes the %.1f µs round trip; import+map alone ≈ %.1f µs (p50)", rtP50, r.P50US-rtP50)
	emit(r)

	// 3. in-process allocation.
	r = base
	r.Bench, r.N = "local_alloc", iters
	if cd := asCUDA(c.Device()); cd != nil {
		lat, err = localCUDA(cd, iters)
		r.Note = "cuMemAlloc+cuMemFree of 4 KiB"
	} else {
		lat, err = localHost(iters)
		r.Note = "memfd_create+ftruncate+mmap+munmap+close of 4 KiB (device.Host)"
	}
	if err != nil {
		return err
	}
	r.P50US, r.P99US = percentiles(lat)
	emit(r)
	hold.Free()

	// 4. zero copy into a second process.
	if err := zeroCopy(c, sock, size, base); err != nil {
		return err
	}

	// 5. concurrent clients.
	return concurrent(sock, nClients, iters/4, base)
}

func asCUDA(d device.Device) *device.CUDA {
	cd, _ := d.(*device.CUDA)
	return cd
}

func roundTrips(c *pool.Client, n int) ([]time.Duration, error) {
	for range 200 { // warm up
		b, err := c.Alloc("", 4096)
		if err != nil {
			return nil, err
		}
		b.Free()
	}
	lat := make([]time.Duration, n)
	for i := range lat {
		t0 := time.Now()
		b, err := c.Alloc("", 4096)
		if err != nil {
			return nil, err
		}
		if err := b.Free(); err != nil {
			return nil, err
		}
		lat[i] = time.Since(t0)
	}
	return lat, nil
}

func localCUDA(d *device.CUDA, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, n)
	err := d.Do(func() error {
		for i := -200; i < n; i++ {
			t0 := time.Now()
			p, err := cuda.MemAlloc(4096)
			if err != nil {
				return err
			}
			if err := cuda.MemFree(p); err != nil {
				return err
			}
			if i >= 0 {
				lat[i] = time.Since(t0)
			}
		}
		return nil
	})
	return lat, err
}

func localHost(n int) ([]time.Duration, error) {
	h := device.NewHost()
	lat := make([]time.Duration, n)
	for i := range lat {
		t0 := time.Now()
		b, err := h.Alloc(4096)
		if err != nil {
			return nil, err
		}
		b.Free()
		lat[i] = time.Since(t0)
	}
	return lat, nil
}

func zeroCopy(c *pool.Client, sock string, size int64, base Result) error {
	b, err := c.Create("poolbench/zero-copy", size, pool.CreateOptions{Ephemeral: true})
	if err != nil {
		return err
	}
	defer b.Free()
	if cd := asCUDA(c.Device()); cd != nil {
		err = cd.Do(func() error {
			if err := cuda.MemsetD32(cuda.DevicePtr(b.Ptr()), 0x3f800000, size/4); err != nil {
				return err
			}
			return cuda.CtxSynchronize()
		})
	} else {
		mem := b.Bytes()
		for i := range mem {
			mem[i] = byte(i)
		}
	}
	if err != nil {
		return err
	}
	if err := b.Seal(); err != nil {
		return err
	}
	self, _ := os.Executable()
	cmd := exec.Command(self, "child-read", sock, b.Name())
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("reader process: %w", err)
	}
	var r Result
	if err := json.Unmarshal(out, &r); err != nil {
		return fmt.Errorf("reader printed %q: %w", out, err)
	}
	r.Bench, r.Backend, r.Device, r.Bytes = "zero_copy", base.Backend, base.Device, size
	r.Ratio = r.GBps / r.RefGBps
	emit(r)
	return nil
}

func concurrent(sock string, n, iters int, base Result) error {
	self, _ := os.Executable()
	type proc struct {
		cmd *exec.Cmd
		in  *os.File
		out *bufio.Reader
	}
	var procs []proc
	for range n {
		cmd := exec.Command(self, "child-churn", sock, strconv.Itoa(iters))
		cmd.Stderr = os.Stderr
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		cmd.Stdin = pr
		o, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return err
		}
		pr.Close()
		p := proc{cmd, pw, bufio.NewReader(o)}
		if line, err := p.out.ReadString('\n'); err != nil || line != "ready\n" {
			return fmt.Errorf("client process: %q %v", line, err)
		}
		procs = append(procs, p)
	}
	t0 := time.Now()
	for _, p := range procs {
		p.in.WriteString("go\n")
	}
	worst := 0.0
	var p50s []float64
	for _, p := range procs {
		line, err := p.out.ReadString('\n')
		if err != nil {
			return fmt.Errorf("client process: %w", err)
		}
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return err
		}
		worst = max(worst, r.P99US)
		p50s = append(p50s, r.P50US)
		p.in.Close()
		p.cmd.Wait()
	}
	wall := time.Since(t0)
	slices.Sort(p50s)
	r := base
	r.Bench, r.Clients, r.N = "concurrent", n, n*iters
	r.OpsPerS = float64(n*iters) / wall.Seconds()
	r.P50US, r.P99US = p50s[len(p50s)/2], worst
	r.Note = "ops are alloc+free round trips of 4 KiB; p50 is the median client's, p99 the worst client's"
	emit(r)
	return nil
}

func child(mode string, args []string) error {
	if len(args) < 2 {
		return errors.New("child needs SOCKET ARG")
	}
	c, err := pool.Dial(args[0])
	if err != nil {
		return err
	}
	defer c.Close()
	switch mode {
	case "child-churn":
		n, _ := strconv.Atoi(args[1])
		hold, err := c.Alloc("", 256)
		if err != nil {
			return err
		}
		defer hold.Free()
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return err
		}
		lat, err := roundTrips(c, n)
		if err != nil {
			return err
		}
		var r Result
		r.P50US, r.P99US = percentiles(lat)
		emit(r)
		return nil
	case "child-read":
		b, err := c.OpenWait(args[1], time.Minute)
		if err != nil {
			return err
		}
		defer b.Free()
		var r Result
		if cd := asCUDA(c.Device()); cd != nil {
			r.GBps, r.RefGBps, err = cudaRead(cd, b.Ptr(), b.Size())
			r.Note = "cuMemcpyDtoD out of the shared buffer vs between two cuMemAlloc buffers, CUDA events, 2×bytes per copy"
		} else {
			r.GBps, r.RefGBps = hostRead(b.Bytes())
			r.Note = "copy out of the shared mapping vs between two private buffers, 2×bytes per copy"
		}
		if err != nil {
			return err
		}
		emit(r)
		return nil
	}
	return fmt.Errorf("unknown child mode %q", mode)
}

// cudaRead times copies out of the shared buffer at src and, as the
// reference, between two of this process's own buffers, each the best of
// several runs of 5 copies between CUDA events.
func cudaRead(d *device.CUDA, src uintptr, n int64) (shared, ref float64, err error) {
	err = d.Do(func() error {
		own, err := cuda.MemAlloc(n)
		if err != nil {
			return err
		}
		defer cuda.MemFree(own)
		dst, err := cuda.MemAlloc(n)
		if err != nil {
			return err
		}
		defer cuda.MemFree(dst)
		s, err := cuda.StreamCreate(true)
		if err != nil {
			return err
		}
		defer s.Destroy()
		e0, _ := cuda.EventCreate(cuda.EventDefault)
		e1, _ := cuda.EventCreate(cuda.EventDefault)
		defer e0.Destroy()
		defer e1.Destroy()
		bw := func(from cuda.DevicePtr) (float64, error) {
			best := 0.0
			for rep := 0; rep < 6; rep++ {
				if err := e0.Record(s); err != nil {
					return 0, err
				}
				for range 5 {
					if err := cuda.MemcpyDtoDAsync(dst, from, n, s); err != nil {
						return 0, err
					}
				}
				e1.Record(s)
				if err := e1.Synchronize(); err != nil {
					return 0, err
				}
				ms, err := cuda.EventElapsed(e0, e1)
				if err != nil {
					return 0, err
				}
				if rep > 0 { // the first is warm-up
					best = max(best, 5*2*float64(n)/(float64(ms)/1e3)/1e9)
				}
			}
			return best, nil
		}
		if shared, err = bw(cuda.DevicePtr(src)); err != nil {
			return err
		}
		ref, err = bw(own)
		return err
	})
	return shared, ref, err
}

func hostRead(src []byte) (shared, ref float64) {
	own := make([]byte, len(src))
	dst := make([]byte, len(src))
	for i := range own {
		own[i] = byte(i)
	}
	bw := func(from []byte) float64 {
		best := 0.0
		for rep := 0; rep < 4; rep++ {
			t0 := time.Now()
			copy(dst, from)
			d := time.Since(t0)
			if rep > 0 {
				best = max(best, 2*float64(len(from))/d.Seconds()/1e9)
			}
		}
		return best
	}
	shared = bw(src)
	ref = bw(own)
	runtime.KeepAlive(unsafe.Pointer(&own[0]))
	return shared, ref
}
