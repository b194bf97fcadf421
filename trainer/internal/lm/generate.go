package lm

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// GenOptions configure Generate.
type GenOptions struct {
	Prompt      string
	Tokens      int     // tokens to generate
	Temperature float64 // > 0; logits are divided by it
	TopK        int     // sample among the K most likely tokens (0: all)
	Seed        uint64
	Graph       bool // replay the decode step as a CUDA graph (GPU only)
}

// validate names the first bad option.
func (o GenOptions) validate() error {
	switch {
	case !(o.Temperature > 0) || math.IsInf(o.Temperature, 1):
		return driver.Configf("--temperature %v (want a finite number > 0)", o.Temperature)
	case o.Tokens < 0:
		return driver.Configf("--tokens %d (want ≥ 0)", o.Tokens)
	case o.TopK < 0:
		return driver.Configf("--top-k %d (want ≥ 0; 0: all)", o.TopK)
	}
	return nil
}

// GenResult reports a generation's speed.
type GenResult struct {
	Tokens     int
	TokensPerS float64
}

// Generate samples o.Tokens tokens from the model in f after o.Prompt,
// writing the prompt and then the text to w as each token is sampled (nanoGPT's sample.py:
// logits of the last position / temperature, top-k filtered, softmax,
// one multinomial draw from a PCG seeded by o.Seed). The model runs one
// token at a time with a key/value cache (nn.GPTDecoder); on a GPU the step
// is captured once as a CUDA graph and replayed per token. When the
// context is full (Block tokens), the cache is refilled from the last
// Block/2 tokens, so every token is conditioned on at least that many.
func Generate(a device.Allocator, prec ops.Precision, f *ckpt.File, cfg Config, tok *data.CharTokenizer, o GenOptions, w io.Writer) (GenResult, error) {
	var res GenResult
	if err := o.validate(); err != nil {
		return res, err
	}
	prompt := o.Prompt
	if prompt == "" {
		prompt = "\n" // sample.py's default start
	}
	ids, err := tok.Encode(prompt)
	if err != nil {
		return res, fmt.Errorf("--prompt: %w", err)
	}
	eng, err := ops.NewEngine(a.Device(), ops.Options{Precision: prec})
	if err != nil {
		return res, err
	}
	defer driver.CloseEngine(eng)
	m, err := nn.NewGPT(a, "", cfg.Model, false, 0)
	if err != nil {
		return res, err
	}
	defer m.Free()
	for _, p := range m.Params() {
		if err := f.Load(p.Name, p.Value); err != nil {
			return res, fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	d, err := m.NewDecoder(eng, a)
	if err != nil {
		return res, err
	}
	defer d.Free()
	g, err := newDecodeStep(eng, d, o.Graph)
	if err != nil {
		return res, err
	}
	defer g.close()
	V, block := cfg.Model.Vocab, cfg.Model.Block
	rng := rand.New(rand.NewPCG(o.Seed, 0x73616d70)) // "samp"
	ctxTok := append([]int32(nil), ids...)
	if len(ctxTok) > block {
		ctxTok = ctxTok[len(ctxTok)-block:]
	}
	// Prefill: every prompt token at its position; the last step's logits
	// predict the first new token.
	var logits []float32
	for p, t := range ctxTok {
		if logits, err = g.step(t, p); err != nil {
			return res, err
		}
	}
	if _, err := io.WriteString(w, o.Prompt); err != nil { // sample.py prints the prompt too
		return res, err
	}
	start := time.Now()
	probs := make([]float64, V)
	for n := 0; n < o.Tokens; n++ {
		next := sample(logits, probs, o.Temperature, o.TopK, rng)
		s, err := tok.Decode([]int32{next})
		if err != nil {
			return res, err
		}
		if _, err := io.WriteString(w, s); err != nil {
			return res, err
		}
		ctxTok = append(ctxTok, next)
		if n == o.Tokens-1 {
			break
		}
		if len(ctxTok) > block {
			// Refill the cache from the last block/2 tokens.
			ctxTok = ctxTok[len(ctxTok)-block/2:]
			for p, t := range ctxTok[:len(ctxTok)-1] {
				if _, err := g.step(t, p); err != nil {
					return res, err
				}
			}
		}
		if logits, err = g.step(next, len(ctxTok)-1); err != nil {
			return res, err
		}
	}
	res.Tokens = o.Tokens
	if dt := time.Since(start).Seconds(); dt > 0 {
		res.TokensPerS = float64(o.Tokens) / dt
	}
	return res, nil
}

// sample draws a token from logits as nanoGPT's sample.py does: divide by
// temperature, keep the top k (ties at the k-th value kept), softmax,
// draw. probs is scratch of the vocabulary's size.
func sample(logits []float32, probs []float64, temp float64, topK int, r *rand.Rand) int32 {
	V := len(logits)
	cut := math.Inf(-1)
	if topK > 0 && topK < V {
		sorted := make([]float64, V)
		for i, l := range logits {
			sorted[i] = float64(l)
		}
		sort.Float64s(sorted)
		cut = sorted[V-topK]
	}
	mx := math.Inf(-1)
	for _, l := range logits {
		if float64(l) >= cut {
			mx = math.Max(mx, float64(l)/temp)
		}
	}
	var sum float64
	for i, l := range logits {
		probs[i] = 0
		if float64(l) >= cut {
			probs[i] = math.Exp(float64(l)/temp - mx)
			sum += probs[i]
		}
	}
	u := r.Float64() * sum
	for i, p := range probs {
		u -= p
		if u < 0 && p > 0 {
			return int32(i)
		}
	}
	for i := V - 1; i >= 0; i-- { // rounding left u ≥ 0: the last kept token
		if probs[i] > 0 {
			return int32(i)
		}
	}
	return 0
}

// decodeStep runs the decoder's step through staging memory: the token and
// position go in, the logits come out, all queued on the engine and, on a
// GPU with graph, replayed as one captured CUDA graph.
type decodeStep struct {
	e     *ops.Engine
	d     *nn.GPTDecoder
	st    *exec.Staging
	done  *exec.Event
	graph *exec.CapturedGraph
	useG  bool
	n     int
}

func newDecodeStep(e *ops.Engine, d *nn.GPTDecoder, graph bool) (*decodeStep, error) {
	s := &decodeStep{e: e, d: d, useG: graph && e.IsGraphCapable()}
	var err error
	if s.st, err = e.NewStaging(16 + d.Logits.Bytes()); err != nil {
		return nil, err
	}
	if s.done, err = e.NewEvent(false); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *decodeStep) queue() error {
	return s.e.Do(func() error {
		if err := s.e.CopyIn(s.d.Token, s.st, 0); err != nil {
			return err
		}
		if err := s.e.CopyIn(s.d.Pos, s.st, 4); err != nil {
			return err
		}
		if err := s.d.Step(); err != nil {
			return err
		}
		return s.e.CopyOut(s.st, 16, s.d.Logits)
	})
}

// step runs the model on token t at position p and returns the logits
// (valid until the next step).
func (s *decodeStep) step(t int32, p int) ([]float32, error) {
	b := s.st.Bytes()
	v := tensor.BytesAs[int32](b[:8])
	v[0], v[1] = t, int32(p)
	var err error
	switch {
	case !s.useG || s.n == 0:
		err = s.queue()
	default:
		if s.graph == nil {
			if s.graph, err = s.e.Capture(s.queue); err != nil {
				return nil, err
			}
		}
		err = s.graph.Launch()
	}
	if err != nil {
		return nil, err
	}
	s.n++
	if err := s.done.Record(); err != nil {
		return nil, err
	}
	if err := s.done.Wait(); err != nil {
		return nil, err
	}
	return tensor.BytesAs[float32](b[16:]), nil
}

func (s *decodeStep) close() {
	s.e.Sync()
	if s.graph != nil {
		s.graph.Close()
	}
	if s.done != nil {
		s.done.Close()
	}
	if s.st != nil {
		s.st.Close()
	}
}
