package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/devflag"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/ops"
)

// Flags shared by the subcommands.
var (
	ckptFlag    = &cli.StringFlag{Name: "ckpt", Usage: "model.safetensors of a `trainer run --model unet`"}
	poolFlag    = devflag.Pool("allocate through the gpupool daemon at SOCK instead of in-process, and with --weights read the weights from a snapshot there")
	weightsFlag = &cli.StringFlag{Name: "weights", Usage: "with --pool: a snapshot prefix (the newest <prefix>@<step>) or a full name <prefix>@<step>"}
	rawFlag     = &cli.BoolFlag{Name: "raw-weights", Usage: "sample with the checkpoint's raw weights, not their EMA"}
	deviceFlag  = devflag.Device()
	graphFlag   = devflag.Graph("each sampling loop")
	precFlag    = devflag.Precision(ops.PrecBF16, "the U-Net's GEMMs (bf16: activations too)")
	schedFlag   = &cli.StringFlag{Name: "scheduler", Value: "dpmsolver++", Usage: "ddpm|ddim|dpmsolver++"}
	stepsFlag   = kit.IntAtLeast(&cli.IntFlag{Name: "steps", Value: 20, Usage: "model evaluations (denoising steps)"}, 1)
	etaFlag     = kit.FloatWhere(&cli.Float64Flag{Name: "eta", Usage: "DDIM's η: 0 deterministic, 1 as DDPM's variance"}, "want η ≥ 0", nonNegative)
	guideFlag   = kit.FloatWhere(&cli.Float64Flag{Name: "guidance-scale", Value: 3, Usage: "classifier-free guidance s ≥ 0: ε = ε_u + s(ε_c − ε_u) (1: conditional only, no unconditional pass; 0: unconditional)"},
		"want s ≥ 0 (1: conditional only, 0: unconditional)", nonNegative)
	classFlag  = &cli.StringFlag{Name: "class", Value: "all", Usage: "a class 0..9, null (unconditional), or all (image i gets class i mod 10)"}
	seedFlag   = &cli.Uint64Flag{Name: "seed", Value: 1, Usage: "the noise's seed (Philox key)"}
	noClipFlag = &cli.BoolFlag{Name: "no-clip", Usage: "do not clip the predicted x0 to [-1, 1]"}
	waitFlag   = &cli.DurationFlag{Name: "wait", Value: 30 * time.Second, Usage: "with --pool: how long to wait for a snapshot being written"}
	randomFlag = &cli.StringFlag{Name: "random-init", Usage: "instead of --ckpt: a U-Net of random weights (seeded by --seed) with the model configuration in this JSON file (a checkpoint's: {\"unet\": {\"channels\": [...], ...}, \"schedule\", \"timesteps\"}); for speed at a model size with no trained weights: the samples are noise"}
)

func nonNegative(v float64) bool { return v >= 0 }

func modelFlags() []cli.Flag {
	return []cli.Flag{ckptFlag, poolFlag, weightsFlag, rawFlag, deviceFlag, graphFlag, precFlag, seedFlag, waitFlag}
}

func planFlags() []cli.Flag { return []cli.Flag{schedFlag, stepsFlag, etaFlag, guideFlag, noClipFlag} }

// planOptions reads the scheduler flags.
func planOptions(c *cli.Context) (diffusion.PlanOptions, error) {
	sch, err := diffusion.ParseScheduler(c.String("scheduler"))
	if err != nil {
		return diffusion.PlanOptions{}, kit.Usagef("--scheduler %q: want ddpm, ddim or dpmsolver++", c.String("scheduler"))
	}
	// --steps, --eta and --guidance-scale are checked as they are parsed.
	return diffusion.PlanOptions{Scheduler: sch, Steps: c.Int("steps"), Eta: c.Float64("eta"),
		Guidance: c.Float64("guidance-scale"), NoClip: c.Bool("no-clip")}, nil
}

// parseClass reads --class: −1 for all.
func parseClass(c *cli.Context, classes int) (int, error) {
	s := c.String("class")
	switch s {
	case "all":
		return -1, nil
	case "null":
		return classes, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= classes {
		return 0, kit.Usagef("--class %q: want 0..%d, null or all", s, classes-1)
	}
	return n, nil
}

// outAndPlan checks the required --out (absent, or present without
// --force: a usage error) and returns the sampling plan's options.
func outAndPlan(c *cli.Context) (diffusion.PlanOptions, error) {
	if err := kit.Require(c, "out"); err != nil {
		return diffusion.PlanOptions{}, err
	}
	if err := checkOutFile(c, "out"); err != nil {
		return diffusion.PlanOptions{}, err
	}
	return planOptions(c)
}

// checkMemory refuses a count (flag's value n) whose images, per bytes
// each on the host, would not fit the memory available now
// (kit.CheckMemory), before sampling starts. The device's share is one
// batch, which its allocator refuses by itself.
func checkMemory(flag string, n, per int64) error {
	return kit.CheckMemory(fmt.Sprintf("--%s %d", flag, n), n*per)
}

// checkOutFile checks an output path flag before any work: its directory
// must exist (a missing one is made by nobody), and an existing file is
// replaced only with --force (kit.CheckOut).
func checkOutFile(c *cli.Context, flag string) error {
	path := c.String(flag)
	if path == "" {
		return nil
	}
	if err := kit.CheckOut(c, flag, path); err != nil && flag != "frames-dir" {
		return err
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--%s %s: the directory %s does not exist; make it first", flag, path, dir)
	}
	return nil
}
