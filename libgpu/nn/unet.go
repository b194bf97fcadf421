package nn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// UNetConfig is a class-conditional diffusion U-Net for small images, the
// DDPM architecture (Ho et al. 2020, after PixelCNN++'s U-Net) in the
// compact form of bench/reference/unet.py, which has the same modules and
// state-dict names:
//
//	t → sinusoidal(C0) → Linear(C0, 4C0) → SiLU → Linear(4C0, 4C0), plus a
//	    class embedding [Classes+1, 4C0] (label Classes is the null class
//	    of classifier-free guidance): the embedding e, SiLU(e) fed to every
//	    residual block
//	x → conv_in 3×3 → down levels l = 0..L−1 at Size/2^l, each one residual
//	    block Cl−1 → Cl (the last level adds self-attention), average-pooled
//	    2× between levels → mid: residual block, attention, residual block
//	    → up levels l = L−2..0: nearest 2× upsampling, concatenation with
//	    the down level's output (the skip), a residual block Cl+1 + Cl → Cl
//	    → GroupNorm, SiLU, conv_out 3×3 → ε̂
//
// A residual block is GroupNorm → SiLU → conv 3×3 → + Linear(SiLU(e)) per
// channel → GroupNorm → SiLU → dropout → conv 3×3, plus the input (through
// a 1×1 conv when the widths differ). Attention is GroupNorm → Linear to
// q, k, v over the H·W positions → multi-head softmax attention (the flash
// kernels) → Linear, plus the input. Channels 64-128-256 at 32×32 (3
// levels, attention at 8×8) have about 5.3 M parameters.
type UNetConfig struct {
	Channels   []int   `json:"channels"`    // widths of the resolution levels, e.g. [64, 128, 256]
	InChannels int     `json:"in_channels"` // image channels (1 for Fashion-MNIST)
	Size       int     `json:"size"`        // image side; a multiple of 2^(levels−1)
	Classes    int     `json:"classes"`     // class labels; label Classes is the null (unconditional) class
	Groups     int     `json:"groups"`      // GroupNorm groups; divides every width
	Heads      int     `json:"heads"`       // attention heads at the lowest resolution
	Dropout    float32 `json:"dropout"`     // in residual blocks, training only
}

// DefaultUNet is the U-Net of the benchmarks: channels 64-128-256
// on 32×32 single-channel images (Fashion-MNIST padded), 10 classes, 32
// groups, 4 heads of 64 at 8×8.
func DefaultUNet() UNetConfig {
	return UNetConfig{Channels: []int{64, 128, 256}, InChannels: 1, Size: 32, Classes: 10, Groups: 32, Heads: 4}
}

// ErrUNetConfig reports an unusable UNetConfig.
var ErrUNetConfig = errors.New("nn: invalid U-Net configuration")

// Validate checks the configuration.
func (c UNetConfig) Validate() error {
	L := len(c.Channels)
	switch {
	case L < 1:
		return fmt.Errorf("%w: no channel widths", ErrUNetConfig)
	case c.InChannels < 1 || c.Classes < 1 || c.Groups < 1 || c.Heads < 1:
		return fmt.Errorf("%w: in_channels %d, classes %d, groups %d, heads %d (want ≥ 1)", ErrUNetConfig, c.InChannels, c.Classes, c.Groups, c.Heads)
	case c.Size < 1 || c.Size%(1<<(L-1)) != 0:
		return fmt.Errorf("%w: size %d is not a multiple of 2^%d", ErrUNetConfig, c.Size, L-1)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("%w: dropout %v", ErrUNetConfig, c.Dropout)
	}
	for _, w := range c.Channels {
		if w < 1 || w%c.Groups != 0 || w > 8192 {
			return fmt.Errorf("%w: width %d is not a multiple of %d groups (or above 8192)", ErrUNetConfig, w, c.Groups)
		}
	}
	if last := c.Channels[L-1]; last%c.Heads != 0 || last/c.Heads > 128 {
		return fmt.Errorf("%w: %d channels in %d heads (head dimension ≤ 128)", ErrUNetConfig, last, c.Heads)
	}
	return nil
}

// EmbDim is the width of the timestep and class embedding, 4·C0.
func (c UNetConfig) EmbDim() int { return 4 * c.Channels[0] }

// UNetTensor describes one parameter: its state-dict name, its shape as
// PyTorch stores it, and where it lives in the flat buffer (offset in
// elements; 3×3 and 1×1 conv weights are stored there as [Cout, KH, KW,
// Cin], the conv2d family's layout, and as [Cout, Cin, KH, KW] in
// checkpoints).
type UNetTensor struct {
	Name   string
	Shape  []int // PyTorch's shape
	Offset int   // elements into the flat buffer
	Conv   bool  // a conv weight: flat layout KRSC, PyTorch OIHW
	init   func(r *rand.Rand, v []float32)
}

// Numel is the number of elements.
func (t UNetTensor) Numel() int { return tensor.Numel(t.Shape) }

// FlatShape is the tensor's shape in the flat buffer ([Cout, KH, KW, Cin]
// for a conv weight).
func (t UNetTensor) FlatShape() []int {
	if t.Conv {
		return []int{t.Shape[0], t.Shape[2], t.Shape[3], t.Shape[1]}
	}
	return t.Shape
}

// unetAlign aligns every parameter in the flat buffer to 64 elements (256
// bytes: every vector path and cuBLASLt pointer alignment holds).
const unetAlign = 64

// Layout lists the parameters in state-dict order with their offsets in
// the flat buffer, and the buffer's length in elements.
func (c UNetConfig) Layout() ([]UNetTensor, int) {
	var ts []UNetTensor
	off := 0
	uniform := func(fanIn int) func(r *rand.Rand, v []float32) {
		// PyTorch's nn.Linear / nn.Conv2d default (kaiming_uniform_ with
		// a = √5 for weights, the same bound for biases): U(±1/√fan_in).
		b := 1 / math.Sqrt(float64(fanIn))
		return func(r *rand.Rand, v []float32) {
			for i := range v {
				v[i] = float32(b * (2*r.Float64() - 1))
			}
		}
	}
	fill := func(x float32) func(r *rand.Rand, v []float32) {
		return func(_ *rand.Rand, v []float32) {
			for i := range v {
				v[i] = x
			}
		}
	}
	normal := func(r *rand.Rand, v []float32) { // nn.Embedding's N(0, 1)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
	}
	add := func(name string, conv bool, init func(*rand.Rand, []float32), shape ...int) {
		ts = append(ts, UNetTensor{Name: name, Shape: shape, Offset: off, Conv: conv, init: init})
		off += (tensor.Numel(shape) + unetAlign - 1) / unetAlign * unetAlign
	}
	linear := func(name string, in, out int, zero bool) {
		w, b := uniform(in), uniform(in)
		if zero {
			w, b = fill(0), fill(0)
		}
		add(name+".weight", false, w, out, in)
		add(name+".bias", false, b, out)
	}
	conv := func(name string, in, out, k int, zero bool) {
		w, b := uniform(in*k*k), uniform(in*k*k)
		if zero { // guided diffusion's zero_module: blocks start as the identity
			w, b = fill(0), fill(0)
		}
		add(name+".weight", true, w, out, in, k, k)
		add(name+".bias", false, b, out)
	}
	norm := func(name string, ch int) {
		add(name+".weight", false, fill(1), ch)
		add(name+".bias", false, fill(0), ch)
	}
	E := c.EmbDim()
	res := func(p string, in, out int) {
		norm(p+".norm1", in)
		conv(p+".conv1", in, out, 3, false)
		linear(p+".emb", E, out, false)
		norm(p+".norm2", out)
		conv(p+".conv2", out, out, 3, true)
		if in != out {
			conv(p+".skip", in, out, 1, false)
		}
	}
	attn := func(p string, ch int) {
		norm(p+".norm", ch)
		linear(p+".qkv", ch, 3*ch, false)
		linear(p+".proj", ch, ch, true)
	}
	C0, L := c.Channels[0], len(c.Channels)
	linear("time_embed.0", C0, E, false)
	linear("time_embed.2", E, E, false)
	add("class_embed.weight", false, normal, c.Classes+1, E)
	conv("conv_in", c.InChannels, C0, 3, false)
	prev := C0
	for l := 0; l < L; l++ {
		p := "down." + strconv.Itoa(l)
		res(p+".res", prev, c.Channels[l])
		if l == L-1 {
			attn(p+".attn", c.Channels[l])
		}
		prev = c.Channels[l]
	}
	res("mid.res1", prev, prev)
	attn("mid.attn", prev)
	res("mid.res2", prev, prev)
	for k, l := 0, L-2; l >= 0; k, l = k+1, l-1 {
		res("up."+strconv.Itoa(k)+".res", prev+c.Channels[l], c.Channels[l])
		prev = c.Channels[l]
	}
	norm("out_norm", C0)
	conv("out_conv", C0, c.InChannels, 3, true)
	return ts, off
}

// UNet holds a U-Net's parameters (f32) in one flat buffer, with views by
// name, and optionally a flat gradient buffer and a flat buffer for an
// exponential moving average of the weights (what samplers use), both laid
// out as the parameters (Layout).
type UNet struct {
	cfg    UNetConfig
	layout []UNetTensor
	n      int
	flat   *tensor.Tensor // [n] f32
	grad   *tensor.Tensor
	ema    *tensor.Tensor
	params []Param
	emaPar []Param
	byName map[string]int
	owned  owned
}

// UNetOptions choose the buffers NewUNet allocates besides the parameters.
type UNetOptions struct {
	Grads bool // a flat gradient buffer (training)
	EMA   bool // a flat EMA buffer, initialised to the parameters
}

// NewUNet allocates the parameters through a as one buffer named
// <prefix>/params/flat (and <prefix>/grads/flat, <prefix>/ema/flat), and
// initialises them as unet.py's reset does from seed (math/rand/v2's PCG,
// in state-dict order): PyTorch's defaults for Linear and Conv2d
// (U(±1/√fan_in)) and Embedding (N(0, 1)), GroupNorm weight 1 and bias 0,
// and zeros for the last conv of every residual block, the attention
// output projections and conv_out (guided diffusion's zero_module).
// Nothing stays allocated on error.
func NewUNet(a device.Allocator, prefix string, cfg UNetConfig, o UNetOptions, seed uint64) (m *UNet, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layout, n := cfg.Layout()
	m = &UNet{cfg: cfg, layout: layout, n: n, byName: map[string]int{}, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			m.Free()
			m = nil
		}
	}()
	alloc := func(kind string) (*tensor.Tensor, error) {
		return m.owned.alloc(kind, "flat", tensor.F32, n)
	}
	if m.flat, err = alloc("params"); err != nil {
		return m, err
	}
	vals := make([]float32, n)
	rng := rand.New(rand.NewPCG(seed, 0x756e6574)) // "unet"
	for _, t := range layout {
		v := make([]float32, t.Numel())
		t.init(rng, v)
		if t.Conv {
			v = OIHWToKRSC(v, t.Shape)
		}
		copy(vals[t.Offset:], v)
	}
	if err := m.flat.WriteF32(vals); err != nil {
		return m, fmt.Errorf("nn: initialising the U-Net: %w", err)
	}
	if o.Grads {
		if m.grad, err = alloc("grads"); err != nil {
			return m, err
		}
	}
	if o.EMA {
		if m.ema, err = alloc("ema"); err != nil {
			return m, err
		}
		if err := m.ema.WriteF32(vals); err != nil {
			return m, err
		}
	}
	return m, m.views()
}

// UNetOn wraps flat, an f32 buffer of cfg's layout that the caller owns
// (a checkpoint loaded into device memory, or a weight snapshot in the
// pool), as a U-Net without gradients: its parameters are views of flat,
// with no copy.
func UNetOn(cfg UNetConfig, flat *tensor.Tensor) (*UNet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layout, n := cfg.Layout()
	if flat.DType != tensor.F32 || flat.Numel() != n || !flat.Contiguous() {
		return nil, fmt.Errorf("%w: weights %v %v, want f32 [%d]", ErrUNetConfig, flat.DType, flat.Shape, n)
	}
	m := &UNet{cfg: cfg, layout: layout, n: n, flat: flat, byName: map[string]int{}}
	return m, m.views()
}

func (m *UNet) views() error {
	view := func(flat *tensor.Tensor, t UNetTensor) (*tensor.Tensor, error) {
		if flat == nil {
			return nil, nil
		}
		v, err := flat.Narrow(0, t.Offset, t.Numel())
		if err != nil {
			return nil, err
		}
		return v.View(t.FlatShape()...)
	}
	for i, t := range m.layout {
		p := Param{Name: t.Name}
		var err error
		if p.Value, err = view(m.flat, t); err != nil {
			return err
		}
		if p.Grad, err = view(m.grad, t); err != nil {
			return err
		}
		m.params = append(m.params, p)
		if m.ema != nil {
			e, err := view(m.ema, t)
			if err != nil {
				return err
			}
			m.emaPar = append(m.emaPar, Param{Name: t.Name, Value: e})
		}
		m.byName[t.Name] = i
	}
	return nil
}

// Config is the model's configuration.
func (m *UNet) Config() UNetConfig { return m.cfg }

// Layout lists the parameters (state-dict order, PyTorch shapes, offsets).
func (m *UNet) Layout() []UNetTensor { return m.layout }

// Params are the parameters as views of the flat buffer (conv weights
// [Cout, KH, KW, Cin]), with their gradients when made with Grads.
func (m *UNet) Params() []Param { return m.params }

// Flat is the flat parameter buffer ([n] f32); FlatGrad and FlatEMA the
// gradient and EMA buffers (nil when not made).
func (m *UNet) Flat() *tensor.Tensor     { return m.flat }
func (m *UNet) FlatGrad() *tensor.Tensor { return m.grad }
func (m *UNet) FlatEMA() *tensor.Tensor  { return m.ema }

// NumParams counts the parameters (without the alignment padding).
func (m *UNet) NumParams() int {
	n := 0
	for _, t := range m.layout {
		n += t.Numel()
	}
	return n
}

// Free releases the buffers NewUNet allocated (not a buffer given to UNetOn).
func (m *UNet) Free() error { return m.owned.free() }

// OIHWToKRSC reorders a conv weight from PyTorch's [Cout, Cin, KH, KW]
// (shape) to [Cout, KH, KW, Cin]. A grouped convolution's weight is the
// same permutation of [Cout, Cin/G, KH, KW] (shape[1] = Cin/G) to
// ops.Conv2D's [Cout, KH, KW, Cin/G].
func OIHWToKRSC(v []float32, shape []int) []float32 {
	o, ci, kh, kw := shape[0], shape[1], shape[2], shape[3]
	out := make([]float32, len(v))
	for a := 0; a < o; a++ {
		for c := 0; c < ci; c++ {
			for h := 0; h < kh; h++ {
				for w := 0; w < kw; w++ {
					out[((a*kh+h)*kw+w)*ci+c] = v[((a*ci+c)*kh+h)*kw+w]
				}
			}
		}
	}
	return out
}

// KRSCToOIHW is OIHWToKRSC's inverse (shape is PyTorch's [Cout, Cin, KH, KW]).
func KRSCToOIHW(v []float32, shape []int) []float32 {
	o, ci, kh, kw := shape[0], shape[1], shape[2], shape[3]
	out := make([]float32, len(v))
	for a := 0; a < o; a++ {
		for c := 0; c < ci; c++ {
			for h := 0; h < kh; h++ {
				for w := 0; w < kw; w++ {
					out[((a*ci+c)*kh+h)*kw+w] = v[((a*kh+h)*kw+w)*ci+c]
				}
			}
		}
	}
	return out
}

// StateDict splits flat values of the model's layout (a host copy of Flat
// or FlatEMA) into tensors in PyTorch's layout, in state-dict order.
func (m *UNet) StateDict(flat []float32) ([]HostTensor, error) {
	if len(flat) != m.n {
		return nil, fmt.Errorf("%w: %d values for a layout of %d", ErrUNetConfig, len(flat), m.n)
	}
	out := make([]HostTensor, 0, len(m.layout))
	for _, t := range m.layout {
		v := append([]float32(nil), flat[t.Offset:t.Offset+t.Numel()]...)
		if t.Conv {
			v = KRSCToOIHW(v, t.Shape)
		}
		out = append(out, HostTensor{Name: t.Name, Shape: t.Shape, Data: v})
	}
	return out, nil
}

// FlatFrom assembles flat values of the model's layout from tensors in
// PyTorch's layout that get returns by name (a checkpoint's), checking
// their shapes.
func (m *UNet) FlatFrom(get func(name string) ([]float32, []int, error)) ([]float32, error) {
	flat := make([]float32, m.n)
	for _, t := range m.layout {
		v, shape, err := get(t.Name)
		if err != nil {
			return nil, err
		}
		if !tensor.SameShape(shape, t.Shape) {
			return nil, fmt.Errorf("%w: %s has shape %v, want %v", ErrUNetConfig, t.Name, shape, t.Shape)
		}
		if t.Conv {
			v = OIHWToKRSC(v, t.Shape)
		}
		copy(flat[t.Offset:], v)
	}
	return flat, nil
}

// HostTensor is a named f32 tensor in host memory.
type HostTensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// FLOPsPerSample is the forward pass's multiply-add count ×2 for one image:
// the convolutions, linear layers and attention products (norms and
// element-wise ops excluded), an analytic count for MFU-style reports.
func (c UNetConfig) FLOPsPerSample() float64 {
	layout, _ := c.Layout()
	var f float64
	// Resolution of each module: the down level's, mid at the last, up
	// levels theirs; out_conv and conv_in at full size.
	res := func(name string) int {
		L := len(c.Channels)
		switch {
		case name == "conv_in" || name == "out_conv":
			return c.Size
		case len(name) > 5 && name[:5] == "down.":
			l, _ := strconv.Atoi(name[5:6])
			return c.Size >> l
		case len(name) > 4 && name[:4] == "mid.":
			return c.Size >> (L - 1)
		case len(name) > 3 && name[:3] == "up.":
			k, _ := strconv.Atoi(name[3:4])
			return c.Size >> (L - 2 - k)
		}
		return 1
	}
	for _, t := range layout {
		if len(t.Shape) < 2 || t.Name == "class_embed.weight" {
			continue
		}
		base := t.Name[:len(t.Name)-len(".weight")]
		r := res(base)
		switch {
		case t.Conv:
			f += 2 * float64(t.Numel()) * float64(r*r)
		case len(base) > 4 && (base[len(base)-4:] == ".qkv" || base[len(base)-5:] == ".proj"):
			f += 2 * float64(t.Numel()) * float64(r*r)
		default: // time MLP, per-block embedding projections
			f += 2 * float64(t.Numel())
		}
	}
	// Attention products: QKᵀ and PV, 2·T²·C each, at the lowest level
	// (two attention blocks: down's last level and mid).
	last := c.Channels[len(c.Channels)-1]
	T := float64((c.Size >> (len(c.Channels) - 1)) * (c.Size >> (len(c.Channels) - 1)))
	f += 2 * 2 * 2 * T * T * float64(last)
	return f
}

// ---- the forward pass on a graph ----

// unetEps is GroupNorm's eps (nn.GroupNorm's default).
const unetEps = 1e-5

// Forward records the U-Net on g: x [B, Size, Size, InChannels] (any
// float dtype; cast to the graph's), t i32 [B] timesteps, y i32 [B] class
// labels in [0, Classes] (Classes: the null class); it returns ε̂ of x's
// shape in the graph's activation dtype. Parameters are registered on g
// from w (m.Params(), or the EMA's views: WeightsEMA) with their gradients
// when they have them.
func (m *UNet) Forward(g *ops.Graph, w []Param, x, t, y *ops.Var) *ops.Var {
	c := m.cfg
	pv := make(map[string]*ops.Var, len(w))
	for _, q := range w {
		pv[q.Name] = g.Param(q.Name, q.Value, q.Grad)
	}
	p := func(name string) *ops.Var {
		v, ok := pv[name]
		if !ok {
			g.Fail("unet", fmt.Errorf("%w: no parameter %s", ErrUNetConfig, name))
		}
		return v
	}
	G := c.Groups
	linear := func(g *ops.Graph, name string, h *ops.Var) *ops.Var {
		return g.Linear(h, p(name+".weight"), p(name+".bias"), ops.ActNone)
	}
	conv := func(g *ops.Graph, name string, h *ops.Var, k int) *ops.Var {
		return g.Conv2D(h, p(name+".weight"), p(name+".bias"), ops.Conv2DParams{Stride: 1, Pad: k / 2})
	}
	norm := func(g *ops.Graph, name string, h *ops.Var, silu bool) *ops.Var {
		return g.GroupNorm(h, p(name+".weight"), p(name+".bias"), G, unetEps, silu)
	}
	// normConv is conv(SiLU(norm(h)) (+ dropout)) + nbias + res as one
	// ops.Graph.ConvBlock: fused in an evaluation graph (a sampler's), the
	// separate ops in a training graph.
	normConv := func(g *ops.Graph, normName, convName string, h *ops.Var, k int, dropout float32, nbias, res *ops.Var) *ops.Var {
		gn := &ops.ConvGN{W: p(normName + ".weight"), B: p(normName + ".bias"), Groups: G, Eps: unetEps, SiLU: true, Dropout: dropout}
		return g.ConvBlock(h, gn, p(convName+".weight"), p(convName+".bias"), nbias, res, ops.Conv2DParams{Stride: 1, Pad: k / 2})
	}
	// Embedding of t and y; SiLU(e) feeds every residual block.
	C0 := c.Channels[0]
	e := g.Scope("time_embed")
	emb := linear(e, "time_embed.0", g.TimestepEmbedding(t, C0, 10000))
	emb = linear(e, "time_embed.2", e.SiLU(emb))
	emb = g.Add(emb, g.Embedding(p("class_embed.weight"), y))
	embAct := g.SiLU(emb)
	res := func(name string, h *ops.Var, out int) *ops.Var {
		s := g.Scope(name)
		r := normConv(s, name+".norm1", name+".conv1", h, 3, 0, linear(s, name+".emb", embAct), nil)
		if h != nil && h.Value.Dim(-1) != out {
			h = conv(s, name+".skip", h, 1)
		}
		return normConv(s, name+".norm2", name+".conv2", r, 3, c.Dropout, nil, h)
	}
	attn := func(name string, h *ops.Var) *ops.Var {
		s := g.Scope(name)
		if h == nil {
			return nil
		}
		B, H, W, C := h.Value.Dim(0), h.Value.Dim(1), h.Value.Dim(2), h.Value.Dim(3)
		a := s.View(norm(s, name+".norm", h, false), B, H*W, C)
		a = s.SelfAttention(linear(s, name+".qkv", a), c.Heads, false, 0)
		a = s.View(linear(s, name+".proj", a), B, H, W, C)
		return s.Add(h, a)
	}
	L := len(c.Channels)
	h := g.Scope("conv_in").Conv2D(x, p("conv_in.weight"), p("conv_in.bias"), ops.Conv2DParams{Stride: 1, Pad: 1})
	skips := make([]*ops.Var, L)
	for l := 0; l < L; l++ {
		name := "down." + strconv.Itoa(l)
		h = res(name+".res", h, c.Channels[l])
		if l == L-1 {
			h = attn(name+".attn", h)
		} else {
			skips[l] = h
			h = g.Scope(name).AvgPool2D(h, 2)
		}
	}
	h = res("mid.res1", h, c.Channels[L-1])
	h = attn("mid.attn", h)
	h = res("mid.res2", h, c.Channels[L-1])
	for k, l := 0, L-2; l >= 0; k, l = k+1, l-1 {
		name := "up." + strconv.Itoa(k)
		s := g.Scope(name)
		h = s.Concat(s.Upsample2D(h, 2), skips[l])
		h = res(name+".res", h, c.Channels[l])
	}
	return normConv(g.Scope("out"), "out_norm", "out_conv", h, 3, 0, nil, nil)
}

// IsCast reports whether a parameter is an operand of a GEMM or
// convolution (a Linear or Conv2d weight or bias), which autocast uses in
// bf16, rather than a norm's scale and shift or the class embedding, which
// the ops read in f32.
func (t UNetTensor) IsCast() bool {
	return t.Name != "class_embed.weight" && !strings.Contains(t.Name, "norm")
}

// CastParams copies the GEMM and convolution operands among the parameters
// (IsCast) to dtype dt once, into one flat buffer from a (returned, for the
// caller to free), and returns the parameters with those copies in place
// of the f32 masters: a forward-only graph under autocast to dt then casts
// nothing per evaluation (a sampler's loop). The other parameters stay
// views of Flat. Queued on e.
func (m *UNet) CastParams(e *ops.Engine, a device.Allocator, dt tensor.DType) ([]Param, *tensor.Tensor, error) {
	buf, err := tensor.Alloc(a, "", dt, m.n)
	if err != nil {
		return nil, nil, err
	}
	if err := e.Cast(buf, m.flat); err != nil {
		buf.Buf.Free()
		return nil, nil, err
	}
	out := make([]Param, len(m.layout))
	for i, t := range m.layout {
		out[i] = Param{Name: t.Name, Value: m.params[i].Value}
		if !t.IsCast() {
			continue
		}
		v, err := buf.Narrow(0, t.Offset, t.Numel())
		if err == nil {
			v, err = v.View(t.FlatShape()...)
		}
		if err != nil {
			buf.Buf.Free()
			return nil, nil, err
		}
		out[i].Value = v
	}
	return out, buf, nil
}

// WeightsEMA are the EMA buffer's views as parameters without gradients
// (nil when the model has no EMA).
func (m *UNet) WeightsEMA() []Param { return m.emaPar }

// UNetTrainStep is a U-Net's training step over a static batch recorded on
// an ops.Graph: the caller writes X0 (clean images, f32 [B, S, S, Cin] in
// [−1, 1]), T (i32 [B] timesteps) and Y (i32 [B] labels, the null class
// where dropped), then runs Graph.Forward and Backward; Loss holds the
// mean squared error of the predicted noise (Ho et al. 2020's L_simple).
type UNetTrainStep struct {
	Graph    *ops.Graph
	X0, T, Y *tensor.Tensor
	Loss     *tensor.Tensor
	Pred     *ops.Var // ε̂
	Target   *ops.Var // ε
	NoisedX  *ops.Var // x_t
	owned    owned
}

// NoiseStream is the Philox stream of the training noise (ε of q_sample),
// with the optimizer's step counter as the step.
const NoiseStream = 0x6e6f6973 // "nois"

// RecordTrain builds the training graph over e at batch B: q_sample of X0
// at timesteps T with noise from (opts.Seed, NoiseStream, opts.Counter)
// — sab and s1mab are √ᾱ_t and √(1−ᾱ_t) (f32 [steps], on e's device) —
// then the U-Net on (x_t, T, Y) and the MSE against the noise. Buffers
// come from a named <prefix>/acts/... and <prefix>/grads/...; the model
// must have gradients.
func (m *UNet) RecordTrain(e *ops.Engine, a device.Allocator, prefix string, batch int, opts ops.GraphOptions, sab, s1mab *tensor.Tensor) (s *UNetTrainStep, err error) {
	if batch < 1 {
		return nil, fmt.Errorf("%w: batch %d", ErrUNetConfig, batch)
	}
	if m.grad == nil {
		return nil, fmt.Errorf("%w: a training graph needs a model made with gradients", ErrUNetConfig)
	}
	c := m.cfg
	g := ops.NewGraph(e, a, prefix, opts)
	s = &UNetTrainStep{Graph: g, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			s.Free()
			s = nil
		}
	}()
	in := func(name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
		return s.owned.alloc("acts", name, dt, shape...)
	}
	if s.X0, err = in("x0", tensor.F32, batch, c.Size, c.Size, c.InChannels); err != nil {
		return s, err
	}
	if s.T, err = in("t", tensor.I32, batch); err != nil {
		return s, err
	}
	if s.Y, err = in("y", tensor.I32, batch); err != nil {
		return s, err
	}
	tv, yv := g.Input("t", s.T), g.Input("y", s.Y)
	s.NoisedX, s.Target = g.QSample(g.Input("x0", s.X0), tv, sab, s1mab, NoiseStream)
	s.Pred = m.Forward(g, m.params, s.NoisedX, tv, yv)
	loss := g.MSELoss(s.Pred, s.Target)
	if err := g.Build(true); err != nil {
		return s, err
	}
	s.Loss = loss.Value
	return s, nil
}

// Free releases the step's buffers (not the model's).
func (s *UNetTrainStep) Free() error { return errors.Join(s.Graph.Free(), s.owned.free()) }

// UNetEval is a forward-only U-Net graph at a static batch (a sampler's
// model evaluation): the caller writes X (the model input, [B, S, S, Cin]
// in XDType), T and Y, runs Graph.Forward, and reads Eps (ε̂, [B, S, S,
// Cin] in the graph's activation dtype).
type UNetEval struct {
	Graph   *ops.Graph
	X, T, Y *tensor.Tensor
	Eps     *ops.Var
	owned   owned
}

// RecordEval builds a forward-only graph at batch B with weights w (Params
// or WeightsEMA), its model input X allocated in the activation dtype of
// opts.Autocast.
func (m *UNet) RecordEval(e *ops.Engine, a device.Allocator, prefix string, batch int, opts ops.GraphOptions, w []Param) (s *UNetEval, err error) {
	if batch < 1 {
		return nil, fmt.Errorf("%w: batch %d", ErrUNetConfig, batch)
	}
	c := m.cfg
	opts.Train, opts.Eval = false, true // forward-only: ConvBlock records fused nodes
	g := ops.NewGraph(e, a, prefix, opts)
	s = &UNetEval{Graph: g, owned: owned{a: a, prefix: prefix}}
	defer func() {
		if err != nil {
			s.Free()
			s = nil
		}
	}()
	in := func(name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
		return s.owned.alloc("acts", name, dt, shape...)
	}
	if s.X, err = in("x", g.ActDType(), batch, c.Size, c.Size, c.InChannels); err != nil {
		return s, err
	}
	if s.T, err = in("t", tensor.I32, batch); err != nil {
		return s, err
	}
	if s.Y, err = in("y", tensor.I32, batch); err != nil {
		return s, err
	}
	s.Eps = m.Forward(g, w, g.Input("x", s.X), g.Input("t", s.T), g.Input("y", s.Y))
	if err := g.Build(false); err != nil {
		return s, err
	}
	return s, nil
}

// Free releases the graph's buffers (not the model's).
func (s *UNetEval) Free() error { return errors.Join(s.Graph.Free(), s.owned.free()) }
