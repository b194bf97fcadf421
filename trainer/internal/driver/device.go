package driver

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/pool"
)

// Flags of the device every command that runs a model takes (run, eval,
// generate, and a model's own commands through DeviceFlags).
var (
	deviceFlag = &cli.StringFlag{Name: "device", Value: "auto",
		Usage: "host, cuda[:N], N (= cuda:N) or auto (GPU 0 when one answers, else the host); with --pool, the pool's device"}
	precisionFlag = &cli.StringFlag{Name: "precision", Value: "tf32",
		Usage: "f32|tf32|bf16 for GEMMs (bf16: activations too, with f32 master weights; the host always computes in f32)"}
	poolFlag = &cli.StringFlag{Name: "pool",
		Usage: "SOCK: allocate through the gpupool daemon at SOCK instead of in-process"}
	traceFlag = kit.TraceFlag("spans (step, data, forward, backward, optimizer, graph replay, evaluation, checkpoint) and GPU times")
)

// GraphFlag is --graph of a command whose replayed work is what ("the
// training step", "the decode step").
func GraphFlag(what string) *cli.StringFlag {
	return &cli.StringFlag{Name: "graph", Value: "on", Usage: "on|off: capture " + what + " as CUDA graphs and replay them (a no-op on the host)"}
}

// DeviceFlags are --pool, --device, --graph (of what), --precision and
// --trace: what a command that runs a model takes (NewInput reads them).
func DeviceFlags(graphWhat string) []cli.Flag {
	return []cli.Flag{poolFlag, deviceFlag, GraphFlag(graphWhat), precisionFlag, traceFlag}
}

// NewInput checks the flags of DeviceFlags (usage errors, before any
// work) and returns the command's Input for the checkpoint file ckpt
// (may be empty); its Alloc opens --pool or --device when called.
func NewInput(c *cli.Context, ckpt string) (*Input, error) {
	prec, err := CheckDeviceFlags(c)
	if err != nil {
		return nil, err
	}
	return &Input{Ckpt: ckpt, Precision: prec, Graph: c.String("graph") == "on",
		Alloc: func() (device.Allocator, func(), error) { return Allocator(c) }}, nil
}

// CheckDeviceFlags validates --graph, --precision and the form of
// --device, and returns the precision.
func CheckDeviceFlags(c *cli.Context) (ops.Precision, error) {
	if g := c.String("graph"); g != "on" && g != "off" {
		return 0, kit.Usagef("--graph %q: want on or off", g)
	}
	p, err := ops.ParsePrecision(c.String("precision"))
	if err != nil {
		return 0, kit.Usagef("--precision %v", err)
	}
	if dev := c.String("device"); dev != "host" && dev != "auto" {
		if _, ok := CUDAOrdinal(dev); !ok {
			return 0, kit.Usagef("--device %q: want host, cuda[:N], N or auto", dev)
		}
	}
	return p, nil
}

// Allocator returns where to allocate: the pool at --pool, or the device
// --device names in this process. closeFn releases it.
func Allocator(c *cli.Context) (a device.Allocator, closeFn func(), err error) {
	dev := c.String("device")
	if sock := c.String("pool"); sock != "" {
		pc, err := pool.Dial(sock)
		if err != nil {
			return nil, nil, fmt.Errorf("--pool %s: %w (is `gpupool serve --socket %s` running?)", sock, err, sock)
		}
		if k := pc.Device().Kind().String(); dev != "auto" && !strings.HasPrefix(dev, k) {
			pc.Close()
			return nil, nil, fmt.Errorf("--device %s: the pool at %s serves %s memory", dev, sock, pc.Device())
		}
		return pc, func() { pc.Close() }, nil
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
		n, ok := CUDAOrdinal(dev)
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

// CUDAOrdinal parses "cuda", "cuda:N" and "N".
func CUDAOrdinal(s string) (int, bool) {
	if s == "cuda" {
		return 0, true
	}
	s = strings.TrimPrefix(s, "cuda:")
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// Reserved are the names of the driver's flags (run, eval, generate,
// init): a model's flags may not take them.
var Reserved = []string{"model", "out", "force", "data", "resume", "log-every", "pool", "run", "device", "graph", "precision",
	"trace", "bucket-mb", "grad-comm", "shard-optimizer", "last-bucket-mb", "comm-priority", "nccl-min-ctas", "nccl-max-ctas",
	"ckpt", "help", "h"}

// DeviceFlag is --device alone (trainer info).
func DeviceFlag() cli.Flag { return deviceFlag }
