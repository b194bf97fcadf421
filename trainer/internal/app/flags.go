package app

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

// Flags shared by several subcommands.
var (
	dataFlag = &cli.StringFlag{Name: "data", Value: data.DefaultDir, EnvVars: []string{"GPUKIT_DATA_DIR"},
		Usage: "directory with the Fashion-MNIST IDX files (gzip'd or not)"}
	deviceFlag = &cli.StringFlag{Name: "device", Value: "auto",
		Usage: "host, cuda[:N], N (= cuda:N) or auto (GPU 0 when one answers, else the host); with --pool, the pool's device"}
	graphFlag = &cli.StringFlag{Name: "graph", Value: "on",
		Usage: "on|off: capture the training step as CUDA graphs and replay them (a no-op on the host)"}
	fuseBackwardFlag = &cli.BoolFlag{Name: "fuse-backward",
		Usage: "fuse each ReLU/GELU derivative into the next layer's dx GEMM (cuBLASLt DRELU/DGELU_BGRAD epilogues); off by default: on an H200 it is faster at 784-256-256-10 but slower at 1024 and 4096 wide (BENCHMARKS.md)"}
	precisionFlag = &cli.StringFlag{Name: "precision", Value: "tf32",
		Usage: "f32|tf32|bf16 for GEMMs (the host always computes in f32)"}
	poolFlag = &cli.StringFlag{Name: "pool",
		Usage: "gpupool socket: allocate through the pool daemon instead of in-process"}
	widthsFlag = &cli.StringFlag{Name: "widths", Value: "784,256,256,10",
		Usage: "MLP layer widths, inputs first and classes last"}
	actFlag   = &cli.StringFlag{Name: "act", Value: "relu", Usage: "relu|gelu activation between layers"}
	seedFlag  = &cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the initialisation and of the data order"}
	traceFlag = kit.TraceFlag("spans (step, data, forward, backward, optimizer, graph replay, checkpoint) and GPU times")
)

// setupTrace turns tracing on when --trace (or GPUKIT_TRACE) names a
// collector socket; the returned func flushes and closes the tracer and
// reports lost events on stderr. Call it before anything is traced and
// defer the func before the allocator's close, so it runs last.
func setupTrace(c *cli.Context) func() { return kit.StartTrace(c) }

func parseWidths(s string) ([]int, error) {
	var ws []int
	for _, f := range strings.Split(s, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 {
			return nil, kit.Usagef("--widths %q: want positive integers separated by commas", s)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// commonChecks validates --graph and --precision.
func commonChecks(c *cli.Context) (ops.Precision, error) {
	if g := c.String("graph"); g != "on" && g != "off" {
		return 0, kit.Usagef("--graph %q: want on or off", g)
	}
	p, err := ops.ParsePrecision(c.String("precision"))
	if err != nil {
		return 0, kit.Usagef("--precision %v", err)
	}
	return p, nil
}

// allocator returns where to allocate: the pool at --pool, or the device
// --device names in this process. close releases it.
func allocator(c *cli.Context) (a device.Allocator, closeFn func(), err error) {
	dev := c.String("device")
	if sock := c.String("pool"); sock != "" {
		a, closeFn, err := dialPool(sock)
		if err != nil {
			return nil, nil, fmt.Errorf("--pool %s: %w (is `gpupool serve --socket %s` running?)", sock, err, sock)
		}
		if k := a.Device().Kind().String(); dev != "auto" && !strings.HasPrefix(dev, k) {
			closeFn()
			return nil, nil, fmt.Errorf("--device %s: the pool at %s serves %s memory", dev, sock, a.Device())
		}
		return a, closeFn, nil
	}
	var d device.Device
	switch {
	case dev == "host":
		return device.Local{Dev: device.NewHost()}, func() {}, nil
	case dev == "auto":
		var err error
		if d, err = device.Auto(0); err != nil {
			return nil, nil, fmt.Errorf("--device auto: %w", err)
		}
	default:
		n, ok := cudaOrdinal(dev)
		if !ok {
			return nil, nil, kit.Usagef("--device %q: want host, cuda[:N], N or auto", dev)
		}
		cd, err := device.NewCUDA(n)
		if err != nil {
			if device.NoGPU(err) {
				return nil, nil, fmt.Errorf("--device %s: no such GPU here (%v); use --device host", dev, err)
			}
			return nil, nil, fmt.Errorf("--device %s: %w", dev, err)
		}
		d = cd
	}
	closeFn = func() {}
	if c, ok := d.(interface{ Close() error }); ok {
		closeFn = func() { c.Close() }
	}
	return device.Local{Dev: d}, closeFn, nil
}

// cudaOrdinal parses "cuda", "cuda:N" and "N".
func cudaOrdinal(s string) (int, bool) {
	if s == "cuda" {
		return 0, true
	}
	s = strings.TrimPrefix(s, "cuda:")
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// isTerminal reports whether f is a terminal (TCGETS succeeds).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func allocHost() device.Allocator { return device.Local{Dev: device.NewHost()} }
