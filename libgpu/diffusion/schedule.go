package diffusion

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"gpukit/libgpu/ops"
)

// ErrConfig reports an unusable schedule, scheduler or plan.
var ErrConfig = errors.New("diffusion: invalid configuration")

// Schedule is a discrete noise schedule of T steps: β_t and ᾱ_t = Π_{s≤t}
// (1 − β_s) for t = 0..T−1 (the paper's t = 1..T).
type Schedule struct {
	Kind     string
	Betas    []float64
	AlphaBar []float64
}

// T is the number of steps.
func (s Schedule) T() int { return len(s.Betas) }

// Linear is DDPM's schedule (Ho et al. 2020, §4): β rising linearly from
// 1e-4 to 0.02 over T steps (T = 1000 in the paper; the endpoints are
// scaled by 1000/T so other T keep the same ᾱ path, as guided-diffusion's
// get_named_beta_schedule does).
func Linear(T int) Schedule {
	scale := 1000 / float64(T)
	b0, b1 := scale*1e-4, scale*0.02
	betas := make([]float64, T)
	for i := range betas {
		if T == 1 {
			betas[i] = b0
			continue
		}
		betas[i] = b0 + (b1-b0)*float64(i)/float64(T-1)
	}
	return fromBetas("linear", betas)
}

// Cosine is the cosine schedule of Nichol & Dhariwal 2021 (eq. 17):
// ᾱ(t) = f(t)/f(0), f(t) = cos²(((t/T) + s)/(1 + s)·π/2) with s = 0.008,
// β_t = 1 − ᾱ(t+1)/ᾱ(t) clipped to at most 0.999.
func Cosine(T int) Schedule {
	const s = 0.008
	f := func(t float64) float64 {
		c := math.Cos((t/float64(T) + s) / (1 + s) * math.Pi / 2)
		return c * c
	}
	betas := make([]float64, T)
	for i := range betas {
		betas[i] = math.Min(1-f(float64(i+1))/f(float64(i)), 0.999)
	}
	return fromBetas("cosine", betas)
}

func fromBetas(kind string, betas []float64) Schedule {
	ab := make([]float64, len(betas))
	p := 1.0
	for i, b := range betas {
		p *= 1 - b
		ab[i] = p
	}
	return Schedule{Kind: kind, Betas: betas, AlphaBar: ab}
}

// NewSchedule returns the schedule called kind ("linear" or "cosine") of
// T steps.
func NewSchedule(kind string, T int) (Schedule, error) {
	if T < 1 || T > 1<<20 {
		return Schedule{}, fmt.Errorf("%w: %d diffusion steps", ErrConfig, T)
	}
	switch kind {
	case "linear":
		return Linear(T), nil
	case "cosine":
		return Cosine(T), nil
	}
	return Schedule{}, fmt.Errorf("%w: schedule %q (want linear or cosine)", ErrConfig, kind)
}

// Tables are √ᾱ_t and √(1 − ᾱ_t) in f32: the q_sample coefficients
// (ops.QSample) of a training step.
func (s Schedule) Tables() (sab, s1mab []float32) {
	sab, s1mab = make([]float32, s.T()), make([]float32, s.T())
	for i, ab := range s.AlphaBar {
		sab[i], s1mab[i] = float32(math.Sqrt(ab)), float32(math.Sqrt(1-ab))
	}
	return sab, s1mab
}

// Scheduler is a sampling method.
type Scheduler int

const (
	// DDPM is ancestral sampling from the posterior q(x_{t'} | x_t, x̂0)
	// with variance β̃ (Ho et al. 2020, eqs. 6–7), on a subsequence of
	// timesteps as respaced DDPM (Nichol & Dhariwal 2021, §4).
	DDPM Scheduler = iota
	// DDIM is Song et al. 2021's update (eq. 12) with σ = η·√((1−ᾱ')/(1−ᾱ))·√(1−ᾱ/ᾱ'):
	// deterministic at η = 0.
	DDIM
	// DPMSolverPP is DPM-Solver++(2M), the multistep second-order solver
	// of the diffusion ODE in data prediction (Lu et al. 2022,
	// Algorithm 2), first order at the first and last steps.
	DPMSolverPP
)

func (s Scheduler) String() string {
	switch s {
	case DDPM:
		return "ddpm"
	case DDIM:
		return "ddim"
	case DPMSolverPP:
		return "dpmsolver++"
	}
	return fmt.Sprintf("scheduler(%d)", int(s))
}

// ParseScheduler accepts ddpm, ddim and dpmsolver++.
func ParseScheduler(s string) (Scheduler, error) {
	for _, k := range []Scheduler{DDPM, DDIM, DPMSolverPP} {
		if strings.EqualFold(s, k.String()) {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: scheduler %q (want ddpm, ddim or dpmsolver++)", ErrConfig, s)
}

// Timesteps are the model evaluations of a run of n steps from timestep
// tmax (exclusive: tmax = T samples from pure noise, less re-noises an
// image to that level), "trailing" spacing (Lin et al. 2024, "Common
// Diffusion Noise Schedules and Sample Steps are Flawed", table 2):
// t_i = round(tmax − i·tmax/n) − 1 for i = 0..n−1, so the first step is at
// tmax − 1 and a run of T steps visits every timestep. Steps that would
// repeat a timestep (n > tmax) are an error.
func Timesteps(tmax, n int) ([]int, error) {
	if n < 1 || tmax < 1 || n > tmax {
		return nil, fmt.Errorf("%w: %d steps from timestep %d", ErrConfig, n, tmax)
	}
	ts := make([]int, n)
	for i := range ts {
		ts[i] = int(math.Round(float64(tmax)-float64(i)*float64(tmax)/float64(n))) - 1
	}
	return ts, nil
}

// PlanOptions describe a sampling run.
type PlanOptions struct {
	Scheduler Scheduler
	Steps     int     // model evaluations
	Eta       float64 // DDIM's η (0: deterministic); ignored by the others
	Guidance  float64 // classifier-free guidance scale s: ε = ε_u + s·(ε_c − ε_u)
	NoClip    bool    // do not clip x̂0 to [−1, 1]
	// Strength in (0, 1] is the noise level a run starts from, as a
	// fraction of T: 1 samples from pure noise; less re-noises a previous
	// image (the video path) to timestep round(Strength·T).
	Strength float64
	// Blend is the weight of the previous frame in x̂0 at every step
	// (temporal blending; 0: none).
	Blend float64
	// Residual guides by residual classifier-free guidance (R-CFG, the
	// self-negative form of StreamDiffusion: Kodaira et al. 2023, arXiv
	// 2312.12491 §3.3) instead of an unconditional pass: the
	// unconditional prediction is the noise that takes the previous frame
	// to the current sample, (x − √ᾱ·prev)/√(1−ᾱ), so x̂0 = prev +
	// Guidance·(x̂0_c − prev) before clipping and blending, and each step
	// evaluates the model once. It needs a previous frame: a Sampler runs
	// such a plan only in video runs (RunOptions.Video).
	Residual bool
}

// Plan is a sampling run's coefficient table: row 0 starts the run
// (ops.DiffusionStart), row i ≥ 1 is step i (ops.DiffusionStep) with the
// fields ops.Coef*; it is what the device reads.
type Plan struct {
	Options   PlanOptions
	Timesteps []int
	Rows      [][ops.CoefWidth]float64
}

// Table is the plan's rows as f32 [len(Rows)·ops.CoefWidth].
func (p *Plan) Table() []float32 {
	out := make([]float32, 0, len(p.Rows)*ops.CoefWidth)
	for _, r := range p.Rows {
		for _, v := range r {
			out = append(out, float32(v))
		}
	}
	return out
}

// NewPlan computes the coefficient table of a run over schedule s. With
// x_t = a·x0 + σ_t·ε (a = √ᾱ_t, σ_t = √(1−ᾱ_t)) and the next timestep t'
// (ᾱ' = 1 after the last step: every run ends on the clean sample,
// DDIM's "set_alpha_to_one"):
//
//   - DDPM: x' = c1·x̂0 + c2·x_t + √β̃·z with β' = 1 − ᾱ/ᾱ',
//     c1 = √ᾱ'·β'/(1−ᾱ), c2 = √(ᾱ/ᾱ')·(1−ᾱ')/(1−ᾱ), β̃ = β'·(1−ᾱ')/(1−ᾱ);
//   - DDIM: x' = √ᾱ'·x̂0 + √(1−ᾱ'−σ²)·ε' + σ·z, ε' = (x_t − a·x̂0)/σ_t;
//   - DPM-Solver++(2M): with λ = log(a/σ_t), h = λ' − λ, r = h_prev/h,
//     x' = (σ'/σ_t)·x_t + (a' − σ'·a/σ_t)·((1 + 1/2r)·x̂0 − (1/2r)·x̂0_prev)
//     ((a' − σ'·a/σ_t) is −a'(e^(−h) − 1), finite at σ' = 0); first order
//     (x̂0_prev's weight 0) at the first step and the last.
func NewPlan(s Schedule, o PlanOptions) (*Plan, error) {
	T := s.T()
	if o.Strength == 0 {
		o.Strength = 1
	}
	if !(o.Strength > 0 && o.Strength <= 1) {
		return nil, fmt.Errorf("%w: strength %v (want 0 < strength ≤ 1)", ErrConfig, o.Strength)
	}
	if !(o.Eta >= 0) || math.IsInf(o.Eta, 0) || math.IsNaN(o.Guidance) || math.IsInf(o.Guidance, 0) || !(o.Blend >= 0 && o.Blend < 1) {
		return nil, fmt.Errorf("%w: eta %v, guidance %v, blend %v", ErrConfig, o.Eta, o.Guidance, o.Blend)
	}
	if o.Scheduler < DDPM || o.Scheduler > DPMSolverPP {
		return nil, fmt.Errorf("%w: %v", ErrConfig, o.Scheduler)
	}
	tmax := int(math.Round(o.Strength * float64(T)))
	ts, err := Timesteps(tmax, o.Steps)
	if err != nil {
		return nil, err
	}
	ab := func(i int) float64 { // ᾱ at step i (1 past the end)
		if i >= len(ts) {
			return 1
		}
		return s.AlphaBar[ts[i]]
	}
	p := &Plan{Options: o, Timesteps: ts, Rows: make([][ops.CoefWidth]float64, len(ts)+1)}
	start := &p.Rows[0]
	start[ops.CoefS] = 1 // pure noise
	if o.Strength < 1 {
		start[ops.CoefA], start[ops.CoefS] = math.Sqrt(ab(0)), math.Sqrt(1-ab(0))
	}
	start[ops.CoefTNext] = float64(ts[0])
	lambda := func(a float64) float64 { return 0.5 * math.Log(a/(1-a)) } // log(√ᾱ/√(1−ᾱ))
	for i := range ts {
		r := &p.Rows[i+1]
		a, an := ab(i), ab(i+1)
		A, S := math.Sqrt(a), math.Sqrt(1-a)
		An, Sn := math.Sqrt(an), math.Sqrt(1-an)
		r[ops.CoefA], r[ops.CoefS] = A, S
		r[ops.CoefGuidance] = o.Guidance
		if !o.NoClip {
			r[ops.CoefClip] = 1
		}
		r[ops.CoefBlend] = o.Blend
		if o.Residual {
			r[ops.CoefResidual] = 1
		}
		if i+1 < len(ts) {
			r[ops.CoefTNext] = float64(ts[i+1])
		} else {
			r[ops.CoefTNext] = float64(ts[i]) // unused: the run ends
		}
		switch o.Scheduler {
		case DDPM:
			bp := 1 - a/an
			r[ops.CoefX0] = math.Sqrt(an) * bp / (1 - a)
			r[ops.CoefX] = math.Sqrt(a/an) * (1 - an) / (1 - a)
			r[ops.CoefSigma] = math.Sqrt(math.Max(0, bp*(1-an)/(1-a)))
		case DDIM:
			sigma := o.Eta * math.Sqrt((1-an)/(1-a)) * math.Sqrt(math.Max(0, 1-a/an))
			r[ops.CoefX0] = An
			r[ops.CoefEps] = math.Sqrt(math.Max(0, 1-an-sigma*sigma))
			r[ops.CoefSigma] = sigma
		case DPMSolverPP:
			w := An - Sn*A/S // −a'(e^(−h) − 1)
			r[ops.CoefX] = Sn / S
			r[ops.CoefX0] = w
			last := i+1 == len(ts)
			if i > 0 && !last {
				h := lambda(an) - lambda(a)
				hPrev := lambda(a) - lambda(ab(i-1))
				k := 1 / (2 * hPrev / h) // 1/(2r)
				r[ops.CoefX0] = w * (1 + k)
				r[ops.CoefD] = -w * k
			}
		}
	}
	return p, nil
}
