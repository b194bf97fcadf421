package opstest

import "fmt"

// DriftFactor bounds how much further a run may drift from a PyTorch
// reference than the reference drifts from itself under a rounding-level
// change (DriftBound). Measured on an H100 (2026-11-28, torch 2.11): the
// running maximum of the trainer's difference from PyTorch stayed within
// 1.7× DriftBound's max(floor, the twin's running maximum) for the MoE GPT
// (bf16, 200 steps, seed 7; the twin's router input rounded to bf16:
// cross-entropy 0.4×, load-balancing 0.6×, z-loss 1.7×) and within 2.6×
// for the HRM (50 segment steps, five seeds; the twin's attention on
// SDPA's math backend: f32 up to 2.3×, bf16 up to 2.6×); 4 leaves some
// margin. MoE seed 899 exceeded it (one step of the trainer's bf16 run:
// trainer/moe_gpu_test.go).
const DriftFactor = 4

// DriftBound holds a run to a reference step by step for as long as the
// reference holds to itself. Training amplifies rounding: two PyTorch runs
// of the same model that differ only in how one operation rounds (a second
// "twin" run) drift apart by 1e-4 (HRM, f32) to 3e-2 (MoE GPT, bf16) within
// tens of steps (router top-k ties and halting flips, Adam-atan2's
// sign-like steps, a ReLU's kink), so a fixed bound over a long horizon
// tests the seed, not the implementation. At each step the running
// maximum of the run's relative difference from the reference must stay
// within max(Floor, DriftFactor × the running maximum of the twin's):
// where the twin still agrees to rounding (the first steps) the floor
// rules and a wrong formula fails at once; later the bound grows with the
// measured drift of the reference itself.
type DriftBound struct {
	Floor      float64
	ours, twin float64 // running maxima
}

// Step adds one step's relative differences (the run's from the
// reference, the twin's from the reference) and returns the bound and
// whether the run's running maximum is within it.
func (d *DriftBound) Step(ours, twin float64) (bound float64, ok bool) {
	d.ours, d.twin = max(d.ours, ours), max(d.twin, twin)
	bound = max(d.Floor, DriftFactor*d.twin)
	return bound, d.ours <= bound
}

func (d *DriftBound) String() string {
	return fmt.Sprintf("largest %.2g, the reference's twin %.2g (floor %.0e)", d.ours, d.twin, d.Floor)
}
