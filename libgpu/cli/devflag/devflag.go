package devflag

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

// Flag names.
const (
	DeviceName    = "device"
	PoolName      = "pool"
	PrecisionName = "precision"
	GraphName     = "graph"
)

// Device is --device: host, cuda[:N], N (= cuda:N) or auto, the default
// (GPU 0 when one answers, else the host). With --pool the pool's device
// is used, and --device, when not auto, must be of its kind.
func Device() *cli.StringFlag {
	return &cli.StringFlag{Name: DeviceName, Value: "auto",
		Usage:  "host, cuda[:N], N (= cuda:N) or auto (GPU 0 when one answers, else the host); with --pool, the pool's device",
		Action: func(_ *cli.Context, v string) error { return checkDevice(v) }}
}

// Pool is --pool SOCK, the socket of a gpupool daemon (DialPool, Open);
// what says what the command does with it ("allocate through the gpupool
// daemon at SOCK instead of in-process").
func Pool(what string) *cli.StringFlag {
	return &cli.StringFlag{Name: PoolName, Usage: "SOCK: " + what}
}

// precNames are the names ops.ParsePrecision reads, by precision.
var precNames = map[ops.Precision]string{ops.PrecF32: "f32", ops.PrecTF32: "tf32", ops.PrecBF16: "bf16"}

// Precision is --precision f32|tf32|bf16 with default def; what names
// what it sets ("the model's GEMMs (bf16: activations too, with f32
// master weights)"). tf32: f32 data, TF32 tensor-core GEMMs; bf16: bf16
// GEMM operands (ops.Precision). The host computes in f32 whatever it
// says.
func Precision(def ops.Precision, what string) *cli.StringFlag {
	name, ok := precNames[def]
	if !ok {
		panic(fmt.Sprintf("devflag: default precision %d", def)) // a tool's own mistake, found by any test of its help
	}
	return &cli.StringFlag{Name: PrecisionName, Value: name,
		Usage: "f32|tf32|bf16: " + what + "; the host always computes in f32",
		Action: func(_ *cli.Context, v string) error {
			_, err := parsePrecision(v)
			return err
		}}
}

// Graph is --graph on|off (default on): capture what ("the training
// step", "each sampling loop") as CUDA graphs and replay them.
func Graph(what string) *cli.StringFlag {
	return &cli.StringFlag{Name: GraphName, Value: "on",
		Usage:  "on|off: capture " + what + " as CUDA graphs and replay them (a no-op on the host)",
		Action: func(_ *cli.Context, v string) error { _, err := parseGraph(v); return err }}
}

// PrecisionOf is the value of --precision.
func PrecisionOf(c *cli.Context) (ops.Precision, error) {
	return parsePrecision(c.String(PrecisionName))
}

// GraphOn is the value of --graph: true for on.
func GraphOn(c *cli.Context) (bool, error) { return parseGraph(c.String(GraphName)) }

func parsePrecision(s string) (ops.Precision, error) {
	p, err := ops.ParsePrecision(s)
	if err != nil {
		return 0, kit.Usagef("--precision %v", err)
	}
	return p, nil
}

func parseGraph(s string) (bool, error) {
	if s != "on" && s != "off" {
		return false, kit.Usagef("--graph %q: want on or off", s)
	}
	return s == "on", nil
}

func checkDevice(s string) error {
	if s == "host" || s == "auto" {
		return nil
	}
	if _, ok := CUDAOrdinal(s); !ok {
		return kit.Usagef("--device %q: want host, cuda[:N], N or auto", s)
	}
	return nil
}

// CUDAOrdinal parses "cuda", "cuda:N" and "N" (N ≥ 0).
func CUDAOrdinal(s string) (int, bool) {
	if s == "cuda" {
		return 0, true
	}
	s = strings.TrimPrefix(s, "cuda:")
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// DialPool connects to the gpupool daemon at --pool; errors name the flag.
func DialPool(c *cli.Context) (*pool.Client, error) {
	sock := c.String(PoolName)
	pc, err := pool.Dial(sock)
	if err != nil {
		return nil, fmt.Errorf("--pool %s: %w", sock, err)
	}
	return pc, nil
}

// Open returns where the command allocates: a *pool.Client of the daemon
// at --pool when it is given (its device must be of --device's kind unless
// --device is auto), else a device.Local of the device --device names in
// this process (auto: GPU 0 when one answers, else the host). closeFn
// releases it. A GPU that is not there is a failure (exit 1) that says to
// use --device host; a bad --device is a usage error.
func Open(c *cli.Context) (a device.Allocator, closeFn func(), err error) {
	dev := c.String(DeviceName)
	if dev == "" {
		dev = "auto" // a command without --device
	}
	if err := checkDevice(dev); err != nil {
		return nil, nil, err
	}
	if c.String(PoolName) != "" {
		pc, err := DialPool(c)
		if err != nil {
			return nil, nil, err
		}
		if k := pc.Device().Kind().String(); dev != "auto" && !strings.HasPrefix(dev, k) {
			pc.Close()
			return nil, nil, fmt.Errorf("--device %s: the pool at %s serves %s memory", dev, c.String(PoolName), pc.Device())
		}
		return pc, func() { pc.Close() }, nil
	}
	var d device.Device
	switch dev {
	case "host":
		return device.Local{Dev: device.NewHost()}, func() {}, nil
	case "auto":
		if d, err = device.Auto(0); err != nil {
			return nil, nil, fmt.Errorf("--device auto: %w", err)
		}
	default:
		n, _ := CUDAOrdinal(dev)
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
	if cl, ok := d.(interface{ Close() error }); ok {
		closeFn = func() { cl.Close() }
	}
	return device.Local{Dev: d}, closeFn, nil
}
