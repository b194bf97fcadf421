package app

import (
	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/devflag"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:  "info",
		Usage: "print the device --device selects, as one JSON line",
		Description: "Prints {\"device\": NAME, \"kind\": \"cuda\"|\"host\", \"peak_flops\": {\"f32\", \"tf32\", \"bf16\"}} (peaks only for\n" +
			"GPUs in ops.PeakFLOPS's table). Pipelines use it to pick settings for the device run will use.",
		Flags: []cli.Flag{devflag.Device()},
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			a, closeFn, err := devflag.Open(c)
			if err != nil {
				return err
			}
			defer closeFn()
			d := a.Device()
			out := map[string]any{"device": d.String(), "kind": kindName(d)}
			peaks := map[string]float64{}
			for name, p := range map[string]ops.Precision{"f32": ops.PrecF32, "tf32": ops.PrecTF32, "bf16": ops.PrecBF16} {
				if f, ok := ops.PeakFLOPS(d, p); ok {
					peaks[name] = f
				}
			}
			if len(peaks) > 0 {
				out["peak_flops"] = peaks
			}
			return kit.JSONLine(c.App.Writer, out)
		},
	}
}

func kindName(d device.Device) string {
	if d.Kind() == device.KindCUDA {
		return "cuda"
	}
	return "host"
}
