package app

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/trainer/internal/driver"
)

// dataFlag is --data as the model d describes it.
func dataFlag(d driver.DataFlag) *cli.StringFlag {
	return &cli.StringFlag{Name: "data", Value: d.Value, DefaultText: d.DefaultText, EnvVars: d.EnvVars, Usage: d.Usage}
}

// usage makes err a usage error (exit 2) when it is a bad flag value
// (driver.ErrConfig: a configuration the flags made).
func usage(err error) error {
	if err != nil && errors.Is(err, driver.ErrConfig) && !errors.Is(err, kit.ErrUsage) {
		return fmt.Errorf("%w: %w", kit.ErrUsage, err)
	}
	return err
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
