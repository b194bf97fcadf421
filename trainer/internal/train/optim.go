package train

import (
	"fmt"
	"strings"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/tensor"
)

// OptimNames are the values of --optim.
var OptimNames = optim.Names

// OptimConfig are the settings of the second-order optimizers (--optim
// shampoo, soap, muon, kfac) besides the learning rate, weight decay,
// momentum and betas every run has; stored in checkpoints. Zero values
// keep libgpu/optim's defaults.
type OptimConfig struct {
	UpdateFreq   int     `json:"update_freq,omitempty"`   // preconditioner refresh interval
	MaxBlock     int     `json:"max_block,omitempty"`     // Shampoo, SOAP
	Root         string  `json:"root,omitempty"`          // eigen or newton
	Async        bool    `json:"async,omitempty"`         // preconditioners on the side stream
	MaxStaleness int     `json:"max_staleness,omitempty"` // with Async
	AdamLR       float32 `json:"adam_lr,omitempty"`       // Muon: the other parameters' AdamW
	RelEps       float32 `json:"rel_eps,omitempty"`       // Shampoo: the roots' relative ridge
	Damping      float32 `json:"damping,omitempty"`       // K-FAC: λ
	KLClip       float32 `json:"kl_clip,omitempty"`       // K-FAC: κ
}

// spec is the optim.Spec of --optim name with a run's hyper-parameters.
func (x OptimConfig) spec(name string, lr, wd, momentum, beta1, beta2 float32) (optim.Spec, error) {
	s, err := optim.Defaults(name)
	if err != nil {
		return s, fmt.Errorf("%w: --optim %q (want %s)", ErrConfig, name, strings.Join(OptimNames, ", "))
	}
	s.LR, s.WeightDecay = lr, wd
	switch name {
	case "sgd", "kfac":
		s.Momentum = momentum
	case "adamw", "soap", "adamatan2":
		s.Beta1, s.Beta2 = beta1, beta2
	case "shampoo":
		s.Beta1, s.GraftBeta2 = beta1, beta2
	case "muon":
		s.Beta1, s.Beta2 = beta1, beta2
		if x.AdamLR > 0 {
			s.AdamLR = x.AdamLR
		}
	}
	if x.UpdateFreq > 0 {
		s.UpdateFreq = x.UpdateFreq
	}
	if x.MaxBlock > 0 {
		s.MaxBlock = x.MaxBlock
	}
	if x.Root != "" {
		s.Root = x.Root
	}
	if x.RelEps > 0 {
		s.RelEps = x.RelEps
	}
	if x.Damping > 0 {
		s.Damping = x.Damping
	}
	if x.KLClip > 0 {
		s.KLClip = x.KLClip
	}
	s.Async, s.MaxStaleness = x.Async, x.MaxStaleness
	return s, nil
}

// validate checks what the flags can get wrong before a model exists.
func (x OptimConfig) validate(name string) error {
	switch {
	case x.UpdateFreq < 0 || x.MaxBlock < 0 || x.MaxStaleness < 0 || !(x.AdamLR >= 0) || !(x.RelEps >= 0 && x.RelEps < 1) ||
		!(x.Damping >= 0) || !(x.KLClip >= 0):
		return fmt.Errorf("%w: --update-freq %d, --max-block %d, --max-staleness %d, --adam-lr %v, --rel-eps %v, --damping %v, --kl-clip %v (want ≥ 0; --rel-eps < 1)", ErrConfig,
			x.UpdateFreq, x.MaxBlock, x.MaxStaleness, x.AdamLR, x.RelEps, x.Damping, x.KLClip)
	case x.Root != "" && x.Root != "eigen" && x.Root != "newton":
		return fmt.Errorf("%w: --root %q (want eigen or newton)", ErrConfig, x.Root)
	case x.MaxStaleness > 0 && !x.Async:
		return fmt.Errorf("%w: --max-staleness needs --async-roots", ErrConfig)
	}
	for _, n := range OptimNames {
		if n == name {
			return nil
		}
	}
	return fmt.Errorf("%w: --optim %q (want %s)", ErrConfig, name, strings.Join(OptimNames, ", "))
}

// optimizerSet is a run's optimizer with what the step needs of it: the
// step counter dropout keys on, and whether the step may be captured.
type optimizerSet struct {
	optim.Optimizer
	counter *tensor.Tensor
	eager   bool // not capturable: the runner steps it after the graph
	scaled  bool // reads the device learning-rate scale (no SetLR per step)
}

// buildOptimizer makes the optimizer over params: in this process, or,
// with a socket, in the optimizer service there (the parameters' buffers
// named through book, the state mapped through mem). lrScale, when set,
// is the run's device learning-rate scale, which optimizers that can read
// it (AdamW, Muon) follow.
func buildOptimizer(e *ops.Engine, a device.Allocator, run string, params []nn.Param, layers []optim.KFACLayer,
	spec optim.Spec, socket string, book *service.NameBook, mem service.Opener, lrScale *tensor.Tensor) (*optimizerSet, error) {
	var o optim.Optimizer
	scaled := false
	if socket != "" {
		if book == nil || mem == nil {
			return nil, fmt.Errorf("%w: --optimizer-socket needs --pool (the service maps the run's buffers from it)", ErrConfig)
		}
		c, err := service.Dial(socket)
		if err != nil {
			return nil, fmt.Errorf("--optimizer-socket %s: %w", socket, err)
		}
		r, err := c.Register(e, service.Registration{Run: run, Spec: spec, Params: params, Layers: layers, Buffers: book,
			Mem: mem, LRScale: lrScale})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("--optimizer-socket %s: %w", socket, err)
		}
		o, scaled = r, r.LRScaled()
	} else {
		var err error
		if o, err = optim.New(a, run, params, layers, spec); err != nil {
			return nil, fmt.Errorf("building the optimizer: %w", err)
		}
		if sc, ok := o.(interface{ SetLRScale(*tensor.Tensor) }); ok && lrScale != nil {
			sc.SetLRScale(lrScale)
			scaled = true
		}
	}
	set := &optimizerSet{Optimizer: o, eager: !optim.CanCapture(o), scaled: scaled}
	if c, ok := o.(interface{ Counter() *tensor.Tensor }); ok {
		set.counter = c.Counter()
	}
	return set, nil
}

// serviceAlloc is where a run allocates: a, or, with an optimizer socket,
// a NameBook over the pool client a (so the service can be told the
// buffers' names) and the client itself to map the service's state.
func serviceAlloc(a device.Allocator, socket string) (device.Allocator, *service.NameBook, service.Opener, error) {
	if socket == "" {
		return a, nil, nil, nil
	}
	mem, ok := a.(service.Opener)
	if !ok {
		return nil, nil, nil, fmt.Errorf("%w: --optimizer-socket needs --pool (the service maps the run's buffers from it)", ErrConfig)
	}
	book := service.NewNameBook(a)
	return book, book, mem, nil
}

// RootsLine reports a second-order optimizer's preconditioner refreshes
// so far (libgpu/optim.RootStats): on evaluation lines, so a run whose
// roots failed — and were replaced by float64 recomputations or kept
// from an earlier refresh — says so.
type RootsLine struct {
	Refreshes int `json:"refreshes"`
	Failures  int `json:"failures"`
	F64       int `json:"f64"`
}

// rootsLine is o's RootsLine, or nil for an optimizer without roots (or
// a service that cannot be asked).
func rootsLine(o optim.Optimizer) *RootsLine {
	switch x := o.(type) {
	case interface{ RootStats() optim.RootStats }:
		s := x.RootStats()
		return &RootsLine{Refreshes: s.Refreshes, Failures: s.Failures, F64: s.F64}
	case *service.Remote:
		s, err := x.Stats()
		if err != nil || s.Refreshes == 0 && s.Failures == 0 {
			return nil
		}
		return &RootsLine{Refreshes: s.Refreshes, Failures: s.Failures, F64: s.F64}
	}
	return nil
}
