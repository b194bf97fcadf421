package main

import (
	"encoding/json"
	"image/gif"
	"os"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"gpukit/libgpu/ckpt"
	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/clitest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/tensor"
	"gpukit/sampler/internal/app"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"sampler": func() { os.Exit(kit.Main(app.New(), os.Args)) },
	})
}

// TestScripts runs testdata/script/*.txtar against the real sampler command
// line (status, jsonlines: see libgpu/cli/clitest; mkunet, mkmlp, mkgpt:
// small model files; gifframes: an animated GIF's frames).
func TestScripts(t *testing.T) {
	cmds := clitest.Cmds()
	cmds["mkunet"] = mkUNet
	cmds["mkmlp"] = mkMLP
	cmds["mkgpt"] = mkGPT
	cmds["gifframes"] = gifFrames
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Cmds: cmds})
}

// mkunet FILE: a diffusion checkpoint of a tiny U-Net (8-8-16 on 32×32,
// untrained), as `trainer run --model unet` writes one.
func mkUNet(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: mkunet FILE")
	}
	cfg := diffusion.ModelConfig{UNet: nn.UNetConfig{Channels: []int{8, 8, 16}, InChannels: 1, Size: 32, Classes: 10, Groups: 4, Heads: 2},
		Schedule: "linear", Timesteps: 1000}
	m, err := nn.NewUNet(device.Local{Dev: device.NewHost()}, "", cfg.UNet, nn.UNetOptions{}, 1)
	ts.Check(err)
	defer m.Free()
	flat, err := m.Flat().ReadF32()
	ts.Check(err)
	entries, err := diffusion.CheckpointEntries(m, flat, nil)
	ts.Check(err)
	cj, err := json.Marshal(cfg)
	ts.Check(err)
	ts.Check(ckpt.WriteFile(ts.MkAbs(args[0]), entries, map[string]string{"model": diffusion.ModelName, "config": string(cj), "step": "1"}))
}

// mkmlp FILE: a Fashion-MNIST MLP classifier (784-16-10, fixed weights),
// as `trainer run` writes one.
func mkMLP(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: mkmlp FILE")
	}
	var entries []ckpt.Entry
	widths := []int{784, 16, 10}
	for l := 0; l+1 < len(widths); l++ {
		w := make([]float32, widths[l+1]*widths[l])
		for i := range w {
			w[i] = float32((i*7919)%13-6) / 100
		}
		n := "fc" + strconv.Itoa(l)
		entries = append(entries,
			ckpt.Entry{Name: n + ".weight", DType: tensor.F32, Shape: []int{widths[l+1], widths[l]}, Data: tensor.AsBytes(w)},
			ckpt.Entry{Name: n + ".bias", DType: tensor.F32, Shape: []int{widths[l+1]}, Data: make([]byte, 4*widths[l+1])})
	}
	ts.Check(ckpt.WriteFile(ts.MkAbs(args[0]), entries, nil))
}

// mkgpt FILE: a file with a GPT's token embedding (what --classifier must
// refuse).
func mkGPT(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: mkgpt FILE")
	}
	ts.Check(ckpt.WriteFile(ts.MkAbs(args[0]), []ckpt.Entry{
		{Name: "transformer.wte.weight", DType: tensor.F32, Shape: []int{4, 2}, Data: make([]byte, 32)}}, map[string]string{"model": "gpt"}))
}

// gifframes FILE N W H: FILE is a GIF (image/gif decodes it) of N frames
// of W×H pixels.
func gifFrames(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 4 {
		ts.Fatalf("usage: gifframes FILE N W H")
	}
	f, err := os.Open(ts.MkAbs(args[0]))
	ts.Check(err)
	defer f.Close()
	g, err := gif.DecodeAll(f)
	if err != nil {
		ts.Fatalf("gifframes: %s: %v", args[0], err)
	}
	n, w, h := atoi(ts, args[1]), atoi(ts, args[2]), atoi(ts, args[3])
	if len(g.Image) != n {
		ts.Fatalf("gifframes: %s holds %d frames, want %d", args[0], len(g.Image), n)
	}
	for i, p := range g.Image {
		if b := p.Bounds(); b.Dx() != w || b.Dy() != h {
			ts.Fatalf("gifframes: %s frame %d is %v, want %dx%d", args[0], i, b, w, h)
		}
	}
}

func atoi(ts *testscript.TestScript, s string) int {
	v, err := strconv.Atoi(s)
	if err != nil {
		ts.Fatalf("%q is not a count", s)
	}
	return v
}
