package ops

// Convolution path selection. A bf16 convolution's forward can run as the
// wgmma implicit GEMM (conv2d_wg.cu, sm_90a), the mma.sync implicit GEMM
// (conv_igemm_fwd) or im2col + cuBLASLt, and which is fastest depends on
// the shape (on an H100, 2026-11-23: the implicit GEMM 0.299 ms against
// im2col's 0.623 at 512×32²×64→64, but 0.268 against 0.166 at
// 512×8²×256→256). With convTune on, the first time the CUDA backend runs
// a shape's forward eagerly it times each path convPath allows for it
// (writing the caller's output, which the chosen path then writes again:
// no side effects, no extra memory) and keeps the fastest; the choice is kept in the GEMM family's table beside the kernel
// cache (gemm-algos.json, key "conv|..."), so every later process on the
// machine takes the same path and runs stay bitwise reproducible across
// processes, as the GEMM algorithms do. A forward first met during stream
// capture runs convPath's own choice (and is tuned at its next eager run,
// as gemmtune does). The backward's two passes are chosen the same way
// under convBwdPath, each on its own: the input gradient among wgmma,
// mma.sync and im2col (col2im), the weight gradient between wgmma and
// the im2col GEMM; a pass that adds into its gradient (acc) is not timed
// (running it again would add again): it runs the policy's own choice
// until a run that overwrites tunes it. (An H200, 2026-11-29, conv table:
// the backward's best path was wgmma at six of eight shapes, im2col at
// 16×32²×640 (1.27×), mma.sync at 16×64²×320 (1.07×).)
//
// On by default since it ran on a GPU machine (an H200, 2026-11-28:
// TestCUDAConvTuned passes; the guided sampling step at batch 256 7.36 ms
// against 8.50 untuned on mma.sync, the batch-1 video frame 2.72 against
// 5.29). GPUKIT_CONV_TUNE=0 turns it off for a process.

import (
	"fmt"
	"math"
	"os"
	"slices"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/tensor"
)

// convTune: see the file comment.
var convTune = os.Getenv("GPUKIT_CONV_TUNE") != "0"

const convTuneReps = 3 // timed runs per candidate after a warm-up (the minimum is kept)

// convTuner is a CUDA backend's per-shape forward path.
type convTuner struct {
	choice map[string]int
}

// convFwdCandidates lists the paths convPath allows for the forward of s,
// convPath's own choice first: wgmma where wgOK, the mma.sync implicit
// GEMM where igemmOK, and im2col + cuBLASLt (which runs every shape; a
// pointwise convolution is one GEMM whatever the path).
func (c *cudaImpl) convFwdCandidates(y, x, w, b *tensor.Tensor, s *convShape) []int {
	if s.pointwise || convPath == convIm2col {
		return []int{convIm2col}
	}
	var ps []int
	if igemmOK(convWG, s.cin, s.cout, x, w, y, b) && c.wgOK(convPath, s.cin, s.cout) {
		ps = append(ps, convWG)
	}
	if igemmOK(convMMA, s.cin, s.cout, x, w, y, b) {
		ps = append(ps, convMMA)
	}
	return append(ps, convIm2col)
}

// convTuneKey names pass ("fwd", "bwd-dx", "bwd-dw") of s on this device
// for dtype dt under policy (convPath for the forward, convBwdPath for
// the backward) and convWS, which changes what the wgmma path runs.
func (c *cudaImpl) convTuneKey(dt tensor.DType, s *convShape, pass string, policy int) string {
	k := fmt.Sprintf("conv|%s|%s|%v|n%d h%d w%d cin%d cout%d k%dx%d s%d p%d|policy%d", c.Device(), pass, dt,
		s.n, s.h, s.w, s.cin, s.cout, s.kh, s.kw, s.stride, s.pad, policy)
	if convWS {
		k += "|ws"
	}
	return k
}

// convFwdPath is the path of the forward of s: convPath's choice, or with
// convTune the fastest candidate (see the file comment).
func (c *cudaImpl) convFwdPath(e *Engine, y, x, w, b *tensor.Tensor, s *convShape) (int, error) {
	return c.convTunedPath(func() string { return c.convTuneKey(x.DType, s, "fwd", convPath) }, c.convFwdCandidates(y, x, w, b, s), true,
		func(p int) error { return c.conv2dOn(e, p, y, x, w, b, s) })
}

// convTunedPath is the path of the pass named key() among cands (the
// policy's own choice first; the key is built only when there is a
// choice to look up): cands[0] without convTune; else the choice
// this engine or the table (gemm-algos.json) holds; else, when the pass
// may be timed (canTime: it overwrites its output, so that running it
// again leaves no trace) and the stream is not capturing, the fastest of
// run(p) over cands, which is kept in both. A pass that may not be timed
// yet runs cands[0] and is tuned at a later run that may.
func (c *cudaImpl) convTunedPath(keyOf func() string, cands []int, canTime bool, run func(p int) error) (int, error) {
	if len(cands) < 2 || !convTune {
		return cands[0], nil
	}
	key := keyOf()
	t := exec.StateOf[convTuner](c.CUDA)
	if t.choice == nil {
		t.choice = map[string]int{}
	}
	if p, ok := t.choice[key]; ok {
		return p, nil
	}
	if p, ok := lookupChoice(key); ok && slices.Contains(cands, p) {
		t.choice[key] = p
		return p, nil
	}
	if !canTime {
		return cands[0], nil
	}
	if capturing, err := c.Stream().IsCapturing(); err != nil || capturing {
		return cands[0], nil // tuned at the next eager run
	}
	best, err := c.timeConvPaths(cands, run)
	if err != nil {
		return 0, err
	}
	if p := saveChoice(key, best); slices.Contains(cands, p) { // another process's choice wins
		best = p
	}
	t.choice[key] = best
	return best, nil
}

// timeConvPaths runs each candidate path (run), once to warm up and
// convTuneReps times between CUDA events, and returns the fastest.
func (c *cudaImpl) timeConvPaths(cands []int, run func(p int) error) (int, error) {
	start, err := cuda.EventCreate(cuda.EventDefault)
	if err != nil {
		return 0, err
	}
	defer start.Destroy()
	end, err := cuda.EventCreate(cuda.EventDefault)
	if err != nil {
		return 0, err
	}
	defer end.Destroy()
	best, bestMS := cands[0], math.Inf(1)
	for _, p := range cands {
		if err := run(p); err != nil { // warm-up: compiles, tunes its GEMMs
			return 0, err
		}
		ms := math.Inf(1)
		for r := 0; r < convTuneReps; r++ {
			if err := start.Record(c.Stream()); err != nil {
				return 0, err
			}
			if err := run(p); err != nil {
				return 0, err
			}
			if err := end.Record(c.Stream()); err != nil {
				return 0, err
			}
			if err := end.Synchronize(); err != nil {
				return 0, err
			}
			t, err := cuda.EventElapsed(start, end)
			if err != nil {
				return 0, err
			}
			ms = math.Min(ms, float64(t))
		}
		if ms < bestMS {
			best, bestMS = p, ms
		}
	}
	return best, nil
}
