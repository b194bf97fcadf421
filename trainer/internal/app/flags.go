package app

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/trainer/internal/driver"
)

// Flags of the driver, shared by the commands that take them.
var (
	deviceFlag = &cli.StringFlag{Name: "device", Value: "auto",
		Usage: "host, cuda[:N], N (= cuda:N) or auto (GPU 0 when one answers, else the host); with --pool, the pool's device"}
	precisionFlag = &cli.StringFlag{Name: "precision", Value: "tf32",
		Usage: "f32|tf32|bf16 for GEMMs (bf16: activations too, with f32 master weights; the host always computes in f32)"}
	poolFlag = &cli.StringFlag{Name: "pool",
		Usage: "SOCK: allocate through the gpupool daemon at SOCK instead of in-process"}
	traceFlag = kit.TraceFlag("spans (step, data, forward, backward, optimizer, graph replay, evaluation, checkpoint) and GPU times")
)

// graphFlag is --graph of a command whose replayed steps are what.
func graphFlag(what string) *cli.StringFlag {
	return &cli.StringFlag{Name: "graph", Value: "on", Usage: "on|off: capture " + what + " as CUDA graphs and replay them (a no-op on the host)"}
}

// dataFlag is --data as the model d describes it.
func dataFlag(d driver.DataFlag) *cli.StringFlag {
	return &cli.StringFlag{Name: "data", Value: d.Value, DefaultText: d.DefaultText, EnvVars: d.EnvVars, Usage: d.Usage}
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

// usage makes err a usage error (exit 2) when it is a bad flag value
// (driver.ErrConfig: a configuration the flags made).
func usage(err error) error {
	if err != nil && errors.Is(err, driver.ErrConfig) && !errors.Is(err, kit.ErrUsage) {
		return fmt.Errorf("%w: %w", kit.ErrUsage, err)
	}
	return err
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

// checkDevice checks the form of --device (before expensive work; the
// device itself is opened later).
func checkDevice(c *cli.Context) error {
	switch dev := c.String("device"); {
	case dev == "host" || dev == "auto":
		return nil
	default:
		if _, ok := cudaOrdinal(dev); !ok {
			return kit.Usagef("--device %q: want host, cuda[:N], N or auto", dev)
		}
	}
	return nil
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

func allocHost() device.Allocator { return device.Local{Dev: device.NewHost()} }

// rankAllocator is where rank w of a data-parallel job allocates: its own
// GPU, LOCAL_RANK among the visible ones (dist.World.DeviceOrdinal), in
// this process. Several ranks need a GPU each and NCCL: without them it
// refuses with one line, before anything is allocated.
func rankAllocator(c *cli.Context, w dist.World) (device.Allocator, func(), error) {
	if c.String("pool") != "" || c.String("optimizer-socket") != "" {
		return nil, nil, kit.Usagef("--pool and --optimizer-socket are not built for several ranks; each rank allocates on its GPU")
	}
	switch dev := c.String("device"); dev {
	case "auto", "cuda":
	case "host":
		return nil, nil, errors.New("run: several ranks need a GPU each (--device host)")
	default:
		return nil, nil, kit.Usagef("--device %s: each rank takes GPU LOCAL_RANK (%d); leave --device auto", dev, w.LocalRank)
	}
	visible, err := device.CUDACount()
	if err != nil || visible == 0 {
		why := "no GPU here"
		if err != nil {
			why += " (" + err.Error() + ")"
		}
		return nil, nil, fmt.Errorf("run: several ranks need a GPU each: %s", why)
	}
	if _, err := nccl.LibraryVersion(); err != nil {
		return nil, nil, fmt.Errorf("run: several ranks need NCCL: %w", err)
	}
	ord, err := w.DeviceOrdinal(visible)
	if err != nil {
		return nil, nil, fmt.Errorf("run: %w", err)
	}
	d, err := device.NewCUDA(ord)
	if err != nil {
		return nil, nil, fmt.Errorf("run: cuda:%d: %w", ord, err)
	}
	return device.Local{Dev: d}, func() { d.Close() }, nil
}
