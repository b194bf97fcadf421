package main

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gpukit/libgpu/ckpt"
)

// tinyMoE is the Mixture-of-Experts GPT of the host tests: 2 blocks, both
// with an MoE MLP of 4 experts of width 48, top-2, biases on (so the
// experts' [E, W] and [E, d] biases exist), dropout on; a step takes
// milliseconds on the host.
var tinyMoE = []string{"--model", "moe", "--device", "host", "--layers", "2", "--heads", "2", "--d-model", "32", "--block", "16",
	"--batch", "8", "--experts", "4", "--top-k", "2", "--moe-every", "1", "--expert-width", "48", "--bias", "--dropout", "0.1",
	"--eval-batches", "2"}

// moeLine is a JSON line of a --model moe run.
type moeLine struct {
	Step    int      `json:"step"`
	Loss    *float64 `json:"loss"`
	Aux     *float64 `json:"aux_loss"`
	Z       *float64 `json:"z_loss"`
	ValLoss *float64 `json:"val_loss"`
}

func moeLines(t *testing.T, s string) (loss, val []moeLine) {
	t.Helper()
	for _, text := range strings.Split(strings.TrimSpace(s), "\n") {
		var l moeLine
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			t.Fatalf("not a JSON line: %q", text)
		}
		switch {
		case l.Loss != nil:
			if l.Aux == nil || l.Z == nil {
				t.Fatalf("a loss line without aux_loss and z_loss: %s", text)
			}
			loss = append(loss, l)
		case l.ValLoss != nil:
			val = append(val, l)
		}
	}
	return loss, val
}

// TestMoETrainsOnTheHost: `trainer run --model moe` trains on the CPU
// (the CI short mode: 80 steps of a tiny MoE GPT): the cross-entropy
// falls, every loss line carries the two auxiliary losses, whose first
// values are those of a router at its N(0, 0.02) initialisation (each MoE
// layer's load-balancing loss near its balanced value k, its z-loss near
// (ln E)², summed over the 2 MoE layers); eval of the run directory reads
// best.safetensors and reproduces the run's lowest validation loss;
// generate continues a prompt from it.
func TestMoETrainsOnTheHost(t *testing.T) {
	out := t.TempDir()
	r := trainer(t, append([]string{"run", "--out", out, "--steps", "80", "--log-every", "1", "--eval-every", "40", "--lr", "3e-3"}, tinyMoE...)...)
	mustOK(t, r)
	if !strings.Contains(r.stderr, "MoE GPT of") || !strings.Contains(r.stderr, "4 experts of width 48, top-2, in 2 of 2 blocks") {
		t.Fatalf("first line: %s", r.stderr)
	}
	ls, vs := moeLines(t, r.stdout)
	if len(ls) != 80 || len(vs) != 2 {
		t.Fatalf("%d loss lines, %d validation lines", len(ls), len(vs))
	}
	const layers, k, experts = 2, 2, 4
	aux0, z0 := float64(layers*k), layers*math.Pow(math.Log(experts), 2)
	if a := *ls[0].Aux; math.Abs(a-aux0) > 0.05*aux0 {
		t.Errorf("step 1: aux_loss %v, want within 5%% of %v (balanced routing over %d layers)", a, aux0, layers)
	}
	if z := *ls[0].Z; math.Abs(z-z0) > 0.05*z0 {
		t.Errorf("step 1: z_loss %v, want within 5%% of %v (%d layers of (ln %d)²)", z, z0, layers, experts)
	}
	first, last := 0.0, 0.0
	for i := 0; i < 10; i++ {
		first += *ls[i].Loss / 10
		last += *ls[len(ls)-10+i].Loss / 10
	}
	for _, l := range ls {
		if !(*l.Aux > 0 && *l.Z > 0) || math.IsInf(*l.Aux, 0) || math.IsInf(*l.Z, 0) {
			t.Fatalf("step %d: aux_loss %v, z_loss %v", l.Step, *l.Aux, *l.Z)
		}
	}
	if !(last < first-0.5) {
		t.Fatalf("the cross-entropy fell from %.4f (first 10 steps) to %.4f (last 10)", first, last)
	}
	best := math.Min(*vs[0].ValLoss, *vs[1].ValLoss)
	e := trainer(t, "eval", "--ckpt", out)
	mustOK(t, e)
	var ev struct {
		ValLoss float64 `json:"val_loss"`
		Ckpt    string  `json:"ckpt"`
	}
	if err := json.Unmarshal([]byte(e.stdout), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Ckpt != filepath.Join(out, "best.safetensors") || math.Abs(ev.ValLoss-best) > 2e-4 {
		t.Fatalf("eval --ckpt %s: %s, want val_loss %v of best.safetensors", out, e.stdout, best)
	}
	g := trainer(t, "generate", "--ckpt", out, "--tokens", "24", "--prompt", "Light ", "--seed", "2")
	mustOK(t, g)
	if text := strings.TrimSuffix(g.stdout, "\n"); !strings.HasPrefix(text, "Light ") || len([]rune(text)) != 30 {
		t.Fatalf("generate: %q, want the prompt and 24 characters", g.stdout)
	}
	if !strings.Contains(g.stderr, "generate reads "+ev.Ckpt) {
		t.Fatalf("generate: %s", g.stderr)
	}
}

// TestMoECheckpointNames: model.safetensors of --model moe holds nanoGPT's
// names and, for each MoE block N, transformer.h.N.mlp.router.weight
// [E, d], mlp.experts.c_fc.weight [E, W, d] and .bias [E, W],
// mlp.experts.c_proj.weight [E, d, W] and .bias [E, d] (what moe.py's
// module loads strictly), a dense MLP in the other blocks; the state file
// adds AdamW's moments of every one; the configuration stores the MoE
// part as moe.py reads it, the expert width resolved (0: 4·d).
func TestMoECheckpointNames(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "init.safetensors")
	mustOK(t, trainer(t, "init", "--model", "moe", "--out", ck, "--layers", "4", "--heads", "2", "--d-model", "16", "--block", "8",
		"--experts", "3", "--top-k", "1", "--bias", "--aux-loss", "0.02", "--z-loss", "0"))
	f, err := ckpt.ReadFile(ck)
	if err != nil {
		t.Fatal(err)
	}
	const E, d, W = 3, 16, 64 // W: 4·d
	want := map[string][]int{}
	for l := 0; l < 4; l++ {
		h := "transformer.h." + strconv.Itoa(l) + ".mlp."
		if l%2 == 1 { // --moe-every 2: blocks 1 and 3
			want[h+"router.weight"] = []int{E, d}
			want[h+"experts.c_fc.weight"] = []int{E, W, d}
			want[h+"experts.c_fc.bias"] = []int{E, W}
			want[h+"experts.c_proj.weight"] = []int{E, d, W}
			want[h+"experts.c_proj.bias"] = []int{E, d}
		} else {
			want[h+"c_fc.weight"] = []int{4 * d, d}
			want[h+"c_fc.bias"] = []int{4 * d}
			want[h+"c_proj.weight"] = []int{d, 4 * d}
			want[h+"c_proj.bias"] = []int{d}
		}
	}
	got := map[string][]int{}
	for _, n := range f.Names() {
		if !strings.HasPrefix(n, "transformer.") && n != "lm_head.weight" {
			t.Errorf("%s is not a name of the module's state dict", n)
		}
		if strings.Contains(n, ".mlp.") {
			got[n] = f.Tensors[n].Shape
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("MLP tensors:\n%v\nwant\n%v", got, want)
	}
	var cfg struct {
		GPT struct {
			MoE map[string]float64 `json:"moe"`
		} `json:"gpt"`
	}
	if err := json.Unmarshal([]byte(f.Metadata["config"]), &cfg); err != nil {
		t.Fatal(err)
	}
	wantMoE := map[string]float64{"experts": E, "top_k": 1, "moe_every": 2, "expert_width": W, "aux_loss": 0.02, "z_loss": 0}
	if !reflect.DeepEqual(cfg.GPT.MoE, wantMoE) {
		t.Fatalf(`config "gpt"."moe" = %v, want %v`, cfg.GPT.MoE, wantMoE)
	}

	out := filepath.Join(dir, "run")
	mustOK(t, trainer(t, append([]string{"run", "--out", out, "--steps", "2"}, tinyMoE...)...))
	st, err := ckpt.ReadFile(filepath.Join(out, "state.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"router.weight", "experts.c_fc.weight", "experts.c_fc.bias", "experts.c_proj.weight", "experts.c_proj.bias"} {
		for _, m := range []string{".exp_avg", ".exp_avg_sq"} {
			if _, ok := st.Tensors["optim/transformer.h.1.mlp."+n+m]; !ok {
				t.Errorf("state.safetensors lacks optim/transformer.h.1.mlp.%s%s", n, m)
			}
		}
	}
}

// TestMoEResumeEqualsUninterrupted: 6 steps, then --resume to 12, gives
// the lines (aux_loss and z_loss included) and the model, best and state
// files of 12 uninterrupted steps, bitwise, with dropout on (its masks
// keyed to the step).
func TestMoEResumeEqualsUninterrupted(t *testing.T) {
	seed := strconv.FormatUint(rand.Uint64N(1000), 10)
	t.Logf("seed %s", seed)
	run := func(out string, steps int) string {
		r := trainer(t, append([]string{"run", "--out", out, "--steps", strconv.Itoa(steps), "--warmup", "2", "--decay-steps", "12",
			"--log-every", "1", "--eval-every", "3", "--seed", seed}, tinyMoE...)...)
		mustOK(t, r)
		return r.stdout
	}
	whole, split := t.TempDir(), t.TempDir()
	want := stripAll(t, run(whole, 12))
	first := stripAll(t, run(split, 6))
	r := trainer(t, "run", "--resume", split, "--steps", "12")
	mustOK(t, r)
	got := append(first, stripAll(t, r.stdout)...)
	if !slices.Equal(got, want) {
		t.Fatalf("resumed:\n%s\nuninterrupted:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, file := range []string{"model.safetensors", "best.safetensors", "state.safetensors"} {
		a, err1 := ckpt.ReadFile(filepath.Join(whole, file))
		b, err2 := ckpt.ReadFile(filepath.Join(split, file))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !reflect.DeepEqual(a.Names(), b.Names()) {
			t.Fatalf("%s: tensors differ", file)
		}
		for _, n := range a.Names() {
			_, x, _ := a.Bytes(n)
			_, y, _ := b.Bytes(n)
			if !bytes.Equal(x, y) {
				t.Fatalf("%s: %s differs after resume", file, n)
			}
		}
	}
}
