package driver

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// OptimNames are the values of --optim.
var OptimNames = optim.Names

// OptimConfig are the settings of the second-order optimizers (--optim
// shampoo, soap, muon, kfac) besides the learning rate, weight decay,
// momentum and betas every run has; models store it in their
// configuration. Zero values keep libgpu/optim's defaults.
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
	CovEvery     int     `json:"cov_every,omitempty"`     // K-FAC: steps between factor updates
}

// OptimFlags are the flags of the optimizers (libgpu/optim) for a model
// that trains with any of them: --optim (default def), the second-order
// optimizers' settings and --optimizer-socket. OptimFromFlags reads them.
func OptimFlags(def, note string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "optim", Value: def, Usage: strings.Join(OptimNames, "|") + " (libgpu/optim)" + note},
		&cli.StringFlag{Name: "optimizer-socket", Usage: "SOCK: run the optimizer in the service at SOCK (optimizer serve; needs --pool): one message per step"},
		&cli.IntFlag{Name: "update-freq", DefaultText: "10", Usage: "shampoo, soap, kfac: steps between preconditioner refreshes"},
		&cli.IntFlag{Name: "max-block", DefaultText: "1024", Usage: "shampoo, soap: largest preconditioned block side"},
		&cli.StringFlag{Name: "root", DefaultText: "eigen", Usage: "shampoo, kfac: eigen|newton, how inverse roots are computed"},
		&cli.BoolFlag{Name: "async-roots", Usage: "shampoo, soap, kfac: compute preconditioners on a second stream, off the step's critical path"},
		&cli.IntFlag{Name: "max-staleness", Usage: "with --async-roots: steps after its refresh a preconditioner is put in use (≤ --update-freq)"},
		&cli.Float64Flag{Name: "adam-lr", DefaultText: "0.001", Usage: "muon: AdamW's learning rate for embeddings, heads and vectors"},
		&cli.Float64Flag{Name: "rel-eps", DefaultText: "1e-06", Usage: "shampoo: the roots' ridge relative to each statistic's Frobenius norm (--root newton runs its products in TF32 from 2e-3, in f32 below)"},
		&cli.Float64Flag{Name: "damping", DefaultText: "0.1", Usage: "kfac: Tikhonov damping λ, split between the factors by π"},
		&cli.Float64Flag{Name: "kl-clip", DefaultText: "0.001", Usage: "kfac: κ, the bound on each step's predicted KL divergence"},
		&cli.IntFlag{Name: "cov-every", DefaultText: "1", Usage: "kfac: steps between updates of the Kronecker factors (kfac-pytorch's factor_update_steps)"},
	}
}

// OptimFixed are the names of OptimFlags that a resumed run may not
// change (all but --optimizer-socket, which says where, not what).
var OptimFixed = []string{"optim", "update-freq", "max-block", "root", "async-roots", "max-staleness", "adam-lr", "rel-eps", "damping", "kl-clip", "cov-every"}

// OptimFromFlags reads the second-order optimizers' flags (OptimFlags).
func OptimFromFlags(c *cli.Context) OptimConfig {
	return OptimConfig{UpdateFreq: c.Int("update-freq"), MaxBlock: c.Int("max-block"), Root: c.String("root"),
		Async: c.Bool("async-roots"), MaxStaleness: c.Int("max-staleness"), AdamLR: float32(c.Float64("adam-lr")),
		RelEps: float32(c.Float64("rel-eps")), Damping: float32(c.Float64("damping")), KLClip: float32(c.Float64("kl-clip")),
		CovEvery: c.Int("cov-every")}
}

// Spec is the optim.Spec of --optim name with a run's hyper-parameters.
func (x OptimConfig) Spec(name string, lr, wd, momentum, beta1, beta2 float32) (optim.Spec, error) {
	s, err := optim.Defaults(name)
	if err != nil {
		return s, Configf("--optim %q (want %s)", name, strings.Join(OptimNames, ", "))
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
	if x.CovEvery > 0 {
		s.CovEvery = x.CovEvery
	}
	s.Async, s.MaxStaleness = x.Async, x.MaxStaleness
	return s, nil
}

// Validate checks what the flags can get wrong before a model exists, for
// the optimizer name, and names the first bad setting.
func (x OptimConfig) Validate(name string) error {
	switch {
	case !slices.Contains(OptimNames, name):
		return Configf("--optim %q (want %s)", name, strings.Join(OptimNames, ", "))
	case x.UpdateFreq < 0:
		return Configf("--update-freq %d (want ≥ 0; 0: the optimizer's)", x.UpdateFreq)
	case x.MaxBlock < 0:
		return Configf("--max-block %d (want ≥ 0; 0: the optimizer's)", x.MaxBlock)
	case x.MaxStaleness < 0:
		return Configf("--max-staleness %d (want ≥ 0)", x.MaxStaleness)
	case !(x.AdamLR >= 0):
		return Configf("--adam-lr %v (want ≥ 0; 0: the optimizer's)", x.AdamLR)
	case !(x.RelEps >= 0 && x.RelEps < 1):
		return Configf("--rel-eps %v (want 0 ≤ rel-eps < 1)", x.RelEps)
	case !(x.Damping >= 0):
		return Configf("--damping %v (want ≥ 0)", x.Damping)
	case !(x.KLClip >= 0):
		return Configf("--kl-clip %v (want ≥ 0)", x.KLClip)
	case x.Root != "" && x.Root != "eigen" && x.Root != "newton":
		return Configf("--root %q (want eigen or newton)", x.Root)
	case x.MaxStaleness > 0 && !x.Async:
		return Configf("--max-staleness needs --async-roots")
	}
	return nil
}

// OptimizerSet is a run's optimizer with what the step needs of it: the
// step counter dropout keys on, and whether the step may be captured.
type OptimizerSet struct {
	optim.Optimizer
	Counter *tensor.Tensor // the device step counter (nil: none)
	Eager   bool           // not capturable: step it after the graph (Runner.SetPost, EagerStep)
	Scaled  bool           // reads the device learning-rate scale (no SetLR per step)
}

// BuildOptimizer makes the optimizer over params: in this process, or,
// with a socket, in the optimizer service there (the parameters' buffers
// named through book, the state mapped through mem; see ServiceAlloc).
// lrScale, when set, is the run's device learning-rate scale, which
// optimizers that can read it (AdamW, Muon) follow. layers are K-FAC's.
//
// With several data-parallel ranks (dp), an optimizer in process shares its
// preconditioner refreshes over them (optim.ShareRoots: each rank computes
// its part of every refresh and broadcasts it) unless ShareRoots is off.
func BuildOptimizer(e *ops.Engine, a device.Allocator, run string, params []nn.Param, layers []optim.KFACLayer,
	spec optim.Spec, socket string, book *service.NameBook, mem service.Opener, lrScale *tensor.Tensor, dp *DP) (*OptimizerSet, error) {
	var o optim.Optimizer
	scaled := false
	if socket != "" {
		if book == nil || mem == nil {
			return nil, Configf("--optimizer-socket needs --pool (the service maps the run's buffers from it)")
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
		if dp != nil && ShareRoots {
			if _, err := optim.ShareRoots(o, dp.Comm); err != nil {
				o.Free()
				return nil, err
			}
		}
	}
	set := &OptimizerSet{Optimizer: o, Eager: !optim.CanCapture(o), Scaled: scaled}
	if c, ok := o.(interface{ Counter() *tensor.Tensor }); ok {
		set.Counter = c.Counter()
	}
	return set, nil
}

// PhaseGraphs says whether optimizers whose steps are capturable at some
// steps only (optim.Phaser: Shampoo, SOAP, K-FAC) replay a captured graph
// per phase outside refresh steps, and K-FAC's MLP its forward and
// backward per phase of its factor hooks (the default), or step eagerly
// every step (GPUKIT_OPTIM_PHASES=0). On an H200 (2026-11-28,
// bench/optim-gpt.sh, 300 steps) Shampoo's step took 18.0 ms with phase
// graphs against 20.0 eager, SOAP's 23.2 either way; the losses are
// bitwise the eager run's (TestGPUPhaseGraphsEqualEager).
var PhaseGraphs = os.Getenv("GPUKIT_OPTIM_PHASES") != "0"

// ShareRoots says whether data-parallel ranks share the preconditioner
// refreshes of Shampoo, SOAP and K-FAC (optim.ShareRoots; the default),
// or each rank computes all of them (GPUKIT_SHARE_ROOTS=0, as before).
var ShareRoots = os.Getenv("GPUKIT_SHARE_ROOTS") != "0"

// PostPhases is what Runner.SetPostPhases needs to capture the set's
// eager step (EagerStep) per phase: nil, nil when the optimizer is no
// optim.Phaser, PhaseGraphs is off, or the run's learning rate changes
// and the optimizer takes it from the host (constLR: the model's is
// constant; else the set must be Scaled).
func (s *OptimizerSet) PostPhases(constLR bool) (phase func() int, replayed func()) {
	p, ok := s.Optimizer.(optim.Phaser)
	if !ok || !PhaseGraphs || !(constLR || s.Scaled) {
		return nil, nil
	}
	return p.NextPhase, p.Replayed
}

// EagerStep steps an optimizer that runs outside the captured step, as an
// "optimizer" phase.
func EagerStep(e *ops.Engine, o optim.Optimizer, gt *trace.GPUTimer) error {
	p := BeginPhase(gt, SpanOptimizer)
	err := o.Step(e)
	p.End()
	return err
}

// ServiceAlloc is where a run allocates: a, or, with an optimizer socket,
// a NameBook over the pool client a (so the service can be told the
// buffers' names) and the client itself to map the service's state.
func ServiceAlloc(a device.Allocator, socket string) (device.Allocator, *service.NameBook, service.Opener, error) {
	if socket == "" {
		return a, nil, nil, nil
	}
	mem, ok := a.(service.Opener)
	if !ok {
		return nil, nil, nil, Configf("--optimizer-socket needs --pool (the service maps the run's buffers from it)")
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
	// Jobs returned from float64 to their own method (optim.RootStats.Retried).
	Retried int `json:"f64_retried,omitempty"`
	// Asynchronous refreshes timed, those the main stream waited for, and
	// its total wait (optim.RootStats; a GPU only).
	Timed  int     `json:"refreshes_timed,omitempty"`
	Waited int     `json:"refreshes_waited,omitempty"`
	WaitMS float64 `json:"refresh_wait_ms,omitempty"`
	// The host's wall-clock ms waiting for the previous refresh's
	// statuses and queueing refreshes (optim.RootStats.CheckMS, QueueMS).
	CheckMS float64 `json:"refresh_check_ms,omitempty"`
	QueueMS float64 `json:"refresh_queue_ms,omitempty"`
	// Job refreshes replayed from captured graphs, and jobs that could not
	// be captured (optim.RootStats.Replayed, Uncaptured).
	Replayed   int `json:"refresh_graphs,omitempty"`
	Uncaptured int `json:"refreshes_uncaptured,omitempty"`
	// The matrices this rank computed at its refreshes (all of them, or
	// its share with several ranks: optim.RootStats.Blocks), and the
	// asynchronous refreshes' GPU time on the side stream
	// (RootStats.RefreshesTimed, RefreshMS; a GPU only).
	Blocks         int     `json:"refresh_blocks,omitempty"`
	RefreshesTimed int     `json:"refreshes_gpu_timed,omitempty"`
	RefreshMS      float64 `json:"refresh_gpu_ms,omitempty"`
}

// Roots is o's RootsLine, or nil for an optimizer without roots (or a
// service that cannot be asked).
func Roots(o optim.Optimizer) *RootsLine {
	switch x := o.(type) {
	case interface{ RootStats() optim.RootStats }:
		s := x.RootStats()
		return &RootsLine{Refreshes: s.Refreshes, Failures: s.Failures, F64: s.F64, Retried: s.Retried, Timed: s.Timed, Waited: s.Waited,
			WaitMS: Round(s.WaitMS, 3), CheckMS: Round(s.CheckMS, 3), QueueMS: Round(s.QueueMS, 3),
			Replayed: s.Replayed, Uncaptured: s.Uncaptured, Blocks: s.Blocks, RefreshesTimed: s.RefreshesTimed,
			RefreshMS: Round(s.RefreshMS, 3)}
	case *service.Remote:
		s, err := x.Stats()
		if err != nil || s.Refreshes == 0 && s.Failures == 0 {
			return nil
		}
		return &RootsLine{Refreshes: s.Refreshes, Failures: s.Failures, F64: s.F64}
	}
	return nil
}
