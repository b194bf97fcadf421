package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/sampler/internal/sample"
)

// scoreGPU and scoreCPU are score's default sample counts: 10,000 on a
// GPU (the standard figure for FID-style scores), 100 on the CPU, where
// one image of the default U-Net takes seconds.
const (
	scoreGPU = 10000
	scoreCPU = 100
)

// scoreCommand is `sampler score`: class accuracy and FD-MLP of samples.
func scoreCommand() *cli.Command {
	return &cli.Command{
		Name:  "score",
		Usage: "score samples with a Fashion-MNIST classifier: class-conditional accuracy and FD-MLP",
		Description: "Samples --n images (class i mod 10) as `sample` does, labels them with --classifier (an MLP\n" +
			"trained by `trainer run` on the real data; its input is the centre 28×28 crop as 8-bit pixels),\n" +
			"and reports the fraction whose label is the class asked for, and FD-MLP: the Fréchet distance\n" +
			"between Gaussians fitted to the classifier's penultimate-layer features of the samples and of the\n" +
			"10,000 Fashion-MNIST test images (FID's formula on the MLP's features). --n defaults to 10,000 on\n" +
			"a GPU, the standard figure, and to 100 on the CPU, where each image of the default U-Net takes\n" +
			"seconds (give --n 10000 for the standard figure there too; the bar shows the time left). The\n" +
			"classifier and the data are checked before sampling starts. One JSON line:\n" +
			"{accuracy, fd_mlp, n, scheduler, steps, guidance_scale, images_per_s, source}.",
		Flags: append(append(modelFlags(), planFlags()...),
			&cli.StringFlag{Name: "classifier", Usage: "(required) model.safetensors of a `trainer run` MLP"},
			kit.IntAtLeast(&cli.IntFlag{Name: "n", Usage: "images (at least 2)", DefaultText: fmt.Sprintf("%d on a GPU, %d on the CPU", scoreGPU, scoreCPU)}, 2),
			kit.IntAtLeast(&cli.IntFlag{Name: "batch", Value: 256, Usage: "images per sampling run"}, 1),
			dataFlag,
		),
		Action: func(c *cli.Context) error {
			if err := kit.Require(c, "classifier"); err != nil {
				return err
			}
			po, err := planOptions(c)
			if err != nil {
				return err
			}
			v, err := setup(c)
			if err != nil {
				return err
			}
			defer v.Close()
			cl, test, err := loadScorer(c, v)
			if err != nil {
				return err
			}
			defer cl.Free()
			n := c.Int("n")
			if !c.IsSet("n") {
				n = scoreCPU
				if v.e.IsGraphCapable() {
					n = scoreGPU
				}
			}
			size := v.m.Config.UNet.Size
			// The samples, the classifier's inputs and features of them.
			per := 4 * int64(size*size*v.m.Config.UNet.InChannels+28*28+cl.FeatureDim())
			if err := checkMemory("n", int64(n), per); err != nil {
				return err
			}
			batch := c.Int("batch")
			bar := newBar(c, "score", runs(n, batch)*po.Steps)
			defer bar.Done()
			var ms float64
			out, labels, err := sample.Generate(v.m, sample.GenOptions{Engine: v.e, Alloc: v.a, Plan: po, N: n, Batch: batch,
				Class: -1, Seed: c.Uint64("seed"), Graph: v.graph, Autocast: v.cast, OnStep: func() { bar.Add(1) },
				OnBatch: func(b sample.BatchStat) error { ms += b.MS(); return nil }})
			if err != nil {
				return usageErr(err)
			}
			bar.Done()
			r, err := sample.Score(cl, out, labels, n, size, test)
			if err != nil {
				return usageErr(err)
			}
			if err := kit.JSONLine(c.App.Writer, map[string]any{"accuracy": round(r.Accuracy, 4), "fd_mlp": round(r.FD, 4), "n": n,
				"test_accuracy": round(r.TestAccuracy, 4), "scheduler": po.Scheduler.String(), "steps": po.Steps,
				"guidance_scale": po.Guidance, "images_per_s": round(float64(n)/ms*1000, 2), "source": v.m.Source}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "sampler: %d samples (%d %s steps, guidance %g): class accuracy %.2f%%, FD-MLP %.3f (classifier: %.2f%% on the test set)\n",
				n, po.Steps, po.Scheduler, po.Guidance, 100*r.Accuracy, r.FD, 100*r.TestAccuracy)
			return nil
		},
	}
}

// dataFlag is the Fashion-MNIST directory of the scorers (score, video --classifier).
var dataFlag = &cli.StringFlag{Name: "data", Value: data.DefaultDir, EnvVars: []string{"GPUKIT_DATA_DIR"}, Usage: "directory with the Fashion-MNIST IDX files"}

// loadScorer loads --classifier and the test set of --data (FD-MLP's
// reference), before any sampling.
func loadScorer(c *cli.Context, v *env) (*sample.Classifier, *data.Set, error) {
	cl, err := sample.LoadClassifier(v.e, v.a, c.String("classifier"))
	if err != nil {
		return nil, nil, fmt.Errorf("--classifier: %w", err)
	}
	test, err := data.Load(c.String("data"), data.Test)
	if err != nil {
		cl.Free()
		return nil, nil, fmt.Errorf("%w (install the Debian package dataset-fashion-mnist or pass --data)", err)
	}
	return cl, test, nil
}
