package optim

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
)

// Spec names an optimizer and its hyper-parameters in one flat,
// serialisable form: what command lines (trainer --optim ...) and the
// optimizer service (register) carry. Start from Defaults(name) and change
// fields; New builds the optimizer. Fields an algorithm does not use are
// ignored.
type Spec struct {
	Name string `msgpack:"name" json:"name"` // adamw, sgd, shampoo, soap, muon, kfac, adamatan2, signsgd

	LR          float32 `msgpack:"lr" json:"lr"`
	WeightDecay float32 `msgpack:"weight_decay" json:"weight_decay"`
	Beta1       float32 `msgpack:"beta1" json:"beta1"`
	Beta2       float32 `msgpack:"beta2" json:"beta2"` // Shampoo: statistics; SOAP and AdamW: second moment
	Eps         float32 `msgpack:"eps" json:"eps"`
	Momentum    float32 `msgpack:"momentum" json:"momentum"` // SGD, Muon, K-FAC

	// Shampoo and SOAP.
	MaxBlock   int     `msgpack:"max_block" json:"max_block"`
	UpdateFreq int     `msgpack:"update_freq" json:"update_freq"` // K-FAC: inverses
	StartStep  int     `msgpack:"start_step" json:"start_step"`
	Graft      string  `msgpack:"graft" json:"graft"`             // Shampoo: adam or adagrad
	GraftBeta2 float32 `msgpack:"graft_beta2" json:"graft_beta2"` // Shampoo
	GraftEps   float32 `msgpack:"graft_eps" json:"graft_eps"`     // Shampoo
	MatrixEps  float32 `msgpack:"matrix_eps" json:"matrix_eps"`
	RelEps     float32 `msgpack:"rel_eps" json:"rel_eps"`

	// Roots (Shampoo, SOAP, K-FAC).
	Root         string `msgpack:"root" json:"root"` // eigen or newton
	NewtonIters  int    `msgpack:"newton_iters" json:"newton_iters"`
	Async        bool   `msgpack:"async" json:"async"`
	MaxStaleness int    `msgpack:"max_staleness" json:"max_staleness"`

	// Muon: AdamW for the other parameters.
	AdamLR float32 `msgpack:"adam_lr" json:"adam_lr"`

	// K-FAC.
	Damping   float32 `msgpack:"damping" json:"damping"`
	StatDecay float32 `msgpack:"stat_decay" json:"stat_decay"`
	CovEvery  int     `msgpack:"cov_every" json:"cov_every"`
	KLClip    float32 `msgpack:"kl_clip" json:"kl_clip"`

	// Adam-atan2's a and b constants (0: 1, the adam-atan2 package's) and
	// the paper's bias correction of m inside the atan2
	// (ops.AdamATan2Config).
	ATan2A      float32 `msgpack:"atan2_a" json:"atan2_a,omitempty"`
	ATan2B      float32 `msgpack:"atan2_b" json:"atan2_b,omitempty"`
	ATan2Inside bool    `msgpack:"atan2_inside" json:"atan2_inside,omitempty"`

	// Exclude lists substrings of parameter names that the matrix method
	// leaves to its first-order companion (Shampoo: graft only; SOAP and
	// Muon: AdamW); nil keeps the algorithm's default.
	Exclude []string `msgpack:"exclude" json:"exclude,omitempty"`
}

// Names lists the optimizers New builds.
var Names = []string{"adamw", "sgd", "shampoo", "soap", "muon", "kfac", "adamatan2", "signsgd"}

// Defaults is the Spec of each algorithm's default configuration
// (DefaultShampoo, DefaultSOAP, DefaultMuon, DefaultKFAC, ops.DefaultAdamW,
// SGD with momentum 0.9, ops.DefaultAdamATan2, and sign-SGD with HRM's
// class defaults lr 1e-3, weight decay 1e-2).
func Defaults(name string) (Spec, error) {
	s := Spec{Name: name, Root: "eigen"}
	switch name {
	case "adamw":
		a := ops.DefaultAdamW
		s.LR, s.Beta1, s.Beta2, s.Eps, s.WeightDecay = a.LR, a.Beta1, a.Beta2, a.Eps, a.WeightDecay
	case "sgd":
		s.LR, s.Momentum = 0.01, 0.9
	case "shampoo":
		c := DefaultShampoo
		s.LR, s.Beta1, s.Beta2, s.WeightDecay = c.LR, c.Beta1, c.Beta2, c.WeightDecay
		s.GraftBeta2, s.GraftEps, s.Graft = c.GraftBeta2, c.GraftEps, "adam"
		s.MaxBlock, s.MatrixEps, s.RelEps, s.StartStep, s.UpdateFreq = c.MaxBlock, c.MatrixEps, c.MatrixRelEps, c.StartStep, c.UpdateFreq
	case "soap":
		c := DefaultSOAP
		s.LR, s.Beta1, s.Beta2, s.Eps, s.WeightDecay = c.LR, c.Beta1, c.Beta2, c.Eps, c.WeightDecay
		s.MaxBlock, s.UpdateFreq = c.MaxBlock, c.UpdateFreq
	case "muon":
		c := DefaultMuon
		s.LR, s.Momentum, s.WeightDecay = c.LR, c.Momentum, c.WeightDecay
		s.AdamLR, s.Beta1, s.Beta2, s.Eps = c.AdamW.LR, c.AdamW.Beta1, c.AdamW.Beta2, c.AdamW.Eps
	case "kfac":
		c := DefaultKFAC
		s.LR, s.Momentum, s.WeightDecay = c.LR, c.Momentum, c.WeightDecay
		s.Damping, s.StatDecay, s.CovEvery, s.UpdateFreq, s.KLClip = c.Damping, c.StatDecay, c.CovEvery, c.InvEvery, c.KLClip
	case "adamatan2":
		c := ops.DefaultAdamATan2
		s.LR, s.Beta1, s.Beta2, s.WeightDecay = c.LR, c.Beta1, c.Beta2, c.WeightDecay
	case "signsgd":
		s.LR, s.WeightDecay = 1e-3, 1e-2
	default:
		return s, fmt.Errorf("%w: optimizer %q (want one of %s)", ErrConfig, name, strings.Join(Names, ", "))
	}
	return s, nil
}

func (s Spec) roots() (RootOptions, error) {
	m := ops.RootEigen
	if s.Root != "" {
		var err error
		if m, err = ops.ParseRootMethod(s.Root); err != nil {
			return RootOptions{}, fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	return RootOptions{Method: m, NewtonIters: s.NewtonIters, Async: s.Async, MaxStaleness: s.MaxStaleness}, nil
}

// MaxOrder is the largest order of a preconditioner matrix (Shampoo's and
// SOAP's max_block, the sides of K-FAC's factors): a d×d f32 matrix of
// order 2^14 takes 1 GiB, and its eigendecomposition O(d³) work. A bound,
// so that sizes computed from it cannot overflow and a request cannot ask
// for work no machine finishes.
const MaxOrder = 1 << 14

// Check reports the first setting of s outside its range, by its name
// (the msgpack and JSON key: "lr", "beta1", ...), for the fields the
// algorithm s.Name uses: learning rates, weight decay, damping and
// epsilons finite and not negative (epsilons and damping positive where
// the rule divides by them), betas and momentum in [0, 1) (Shampoo's β2
// and graft β2 in (0, 1]), block sizes 1 to MaxOrder, frequencies at least
// 1. Errors wrap ErrConfig. New calls it.
func (s Spec) Check() error {
	if s.Name == "" {
		return fmt.Errorf("%w: name is empty (want one of %s)", ErrConfig, strings.Join(Names, ", "))
	}
	if !slices.Contains(Names, s.Name) {
		return fmt.Errorf("%w: name %q (want one of %s)", ErrConfig, s.Name, strings.Join(Names, ", "))
	}
	var err error
	f := func(key string, v float32, lo, hi float64, loOpen, hiOpen bool) {
		x := float64(v)
		if err != nil {
			return
		}
		if math.IsNaN(x) || math.IsInf(x, 0) || x < lo || x > hi || (loOpen && x == lo) || (hiOpen && x == hi) {
			l, h := "[", "]"
			if loOpen {
				l = "("
			}
			if hiOpen {
				h = ")"
			}
			hs := "∞"
			if !math.IsInf(hi, 1) {
				hs = strconv.FormatFloat(hi, 'g', -1, 64)
			}
			err = fmt.Errorf("%w: %s %v is out of range (want %s%g, %s%s, finite)", ErrConfig, key, v, l, lo, hs, h)
		}
	}
	n := func(key string, v, lo, hi int) {
		if err == nil && (v < lo || v > hi) {
			err = fmt.Errorf("%w: %s %d is out of range (want %d to %d)", ErrConfig, key, v, lo, hi)
		}
	}
	inf := math.Inf(1)
	f("lr", s.LR, 0, inf, false, false)
	f("weight_decay", s.WeightDecay, 0, inf, false, false)
	beta1 := func() { f("beta1", s.Beta1, 0, 1, false, true) }
	roots := func(every int) {
		if err == nil && s.Root != "" && s.Root != "eigen" && s.Root != "newton" {
			err = fmt.Errorf("%w: root %q (want eigen or newton)", ErrConfig, s.Root)
		}
		n("newton_iters", s.NewtonIters, 0, 1000)
		if s.Async {
			n("max_staleness", s.MaxStaleness, 0, every)
		} else {
			n("max_staleness", s.MaxStaleness, 0, 0)
		}
	}
	switch s.Name {
	case "adamw":
		beta1()
		f("beta2", s.Beta2, 0, 1, false, true)
		f("eps", s.Eps, 0, inf, true, false)
	case "sgd":
		f("momentum", s.Momentum, 0, 1, false, true)
	case "shampoo":
		beta1()
		f("beta2", s.Beta2, 0, 1, true, false)
		f("graft_beta2", s.GraftBeta2, 0, 1, true, false)
		f("graft_eps", s.GraftEps, 0, inf, true, false)
		f("matrix_eps", s.MatrixEps, 0, inf, false, false)
		f("rel_eps", s.RelEps, 0, inf, false, false)
		if err == nil && s.MatrixEps+s.RelEps <= 0 {
			err = fmt.Errorf("%w: matrix_eps and rel_eps are both 0 (one must be positive)", ErrConfig)
		}
		if err == nil && s.Graft != "" && s.Graft != "adam" && s.Graft != "adagrad" {
			err = fmt.Errorf("%w: graft %q (want adam or adagrad)", ErrConfig, s.Graft)
		}
		n("max_block", s.MaxBlock, 1, MaxOrder)
		n("start_step", s.StartStep, 1, math.MaxInt32)
		n("update_freq", s.UpdateFreq, 1, math.MaxInt32)
		roots(s.UpdateFreq)
	case "soap":
		beta1()
		f("beta2", s.Beta2, 0, 1, false, true)
		f("eps", s.Eps, 0, inf, true, false)
		n("max_block", s.MaxBlock, 1, MaxOrder)
		n("update_freq", s.UpdateFreq, 1, math.MaxInt32)
		roots(s.UpdateFreq)
	case "muon":
		f("momentum", s.Momentum, 0, 1, false, true)
		f("adam_lr", s.AdamLR, 0, inf, false, false)
		beta1()
		f("beta2", s.Beta2, 0, 1, false, true)
		f("eps", s.Eps, 0, inf, true, false)
	case "kfac":
		f("momentum", s.Momentum, 0, 1, false, true)
		f("damping", s.Damping, 0, inf, true, false)
		f("stat_decay", s.StatDecay, 0, 1, false, true)
		f("kl_clip", s.KLClip, 0, inf, false, false)
		n("cov_every", s.CovEvery, 1, math.MaxInt32)
		n("update_freq", s.UpdateFreq, 1, math.MaxInt32)
		roots(s.UpdateFreq)
	}
	return err
}

// New builds the optimizer s names over params, allocating its state
// through a under prefix (see each constructor). layers are K-FAC's linear
// layers (ignored by the others). Errors wrap ErrConfig or ErrParams.
func New(a device.Allocator, prefix string, params []nn.Param, layers []KFACLayer, s Spec) (Optimizer, error) {
	o, err := build(a, prefix, params, layers, s)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return o, nil
}

func build(a device.Allocator, prefix string, params []nn.Param, layers []KFACLayer, s Spec) (Optimizer, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	roots, err := s.roots()
	if err != nil {
		return nil, err
	}
	switch s.Name {
	case "adamw":
		return NewAdamW(a, prefix, params, ops.AdamWConfig{LR: s.LR, Beta1: s.Beta1, Beta2: s.Beta2, Eps: s.Eps, WeightDecay: s.WeightDecay})
	case "sgd":
		return NewSGD(a, prefix, params, ops.SGDConfig{LR: s.LR, Momentum: s.Momentum, WeightDecay: s.WeightDecay})
	case "shampoo":
		c := ShampooConfig{LR: s.LR, Beta1: s.Beta1, Beta2: s.Beta2, WeightDecay: s.WeightDecay, GraftBeta2: s.GraftBeta2,
			GraftEps: s.GraftEps, AdaGradGraft: s.Graft == "adagrad", MaxBlock: s.MaxBlock, MatrixEps: s.MatrixEps,
			MatrixRelEps: s.RelEps, StartStep: s.StartStep, UpdateFreq: s.UpdateFreq, Roots: roots, GraftOnly: s.Exclude}
		if s.Graft != "" && s.Graft != "adam" && s.Graft != "adagrad" {
			return nil, fmt.Errorf("%w: graft %q (want adam or adagrad)", ErrConfig, s.Graft)
		}
		return NewShampoo(a, prefix, params, c)
	case "soap":
		return NewSOAP(a, prefix, params, SOAPConfig{LR: s.LR, Beta1: s.Beta1, Beta2: s.Beta2, Eps: s.Eps, WeightDecay: s.WeightDecay,
			MaxBlock: s.MaxBlock, UpdateFreq: s.UpdateFreq, Roots: roots, AdamOnly: s.Exclude})
	case "muon":
		c := DefaultMuon
		c.LR, c.Momentum, c.WeightDecay = s.LR, s.Momentum, s.WeightDecay
		c.AdamW = ops.AdamWConfig{LR: s.AdamLR, Beta1: s.Beta1, Beta2: s.Beta2, Eps: s.Eps, WeightDecay: s.WeightDecay}
		if s.Exclude != nil {
			c.AdamWParams = s.Exclude
		}
		return NewMuon(a, prefix, params, c)
	case "adamatan2":
		return NewAdamATan2(a, prefix, params, ops.AdamATan2Config{LR: s.LR, Beta1: s.Beta1, Beta2: s.Beta2, WeightDecay: s.WeightDecay,
			A: s.ATan2A, B: s.ATan2B, BiasInside: s.ATan2Inside})
	case "signsgd":
		return NewSignSGD(params, ops.SignSGDConfig{LR: s.LR, WeightDecay: s.WeightDecay})
	case "kfac":
		return NewKFAC(a, prefix, params, layers, KFACConfig{LR: s.LR, Momentum: s.Momentum, WeightDecay: s.WeightDecay,
			Damping: s.Damping, StatDecay: s.StatDecay, CovEvery: s.CovEvery, InvEvery: s.UpdateFreq, KLClip: s.KLClip, Roots: roots})
	}
	return nil, fmt.Errorf("%w: optimizer %q (want one of %s)", ErrConfig, s.Name, strings.Join(Names, ", "))
}
