package ops

import (
	"fmt"

	"gpukit/libgpu/cuda"
)

// solverLaneCount is how many streams the per-matrix solver calls of QR
// (geqrf, orgqr) and Eigh (syevd) are spread over on CUDA
// (exec.CUDA.Lanes): cuSOLVER has no batched QR or eigensolver at the
// orders of Shampoo's and SOAP's blocks (its batched syevj stops at 32),
// and one call of order 256–1024 keeps a few multiprocessors busy, so
// matrices factorised side by side fill the GPU. 16 (MaxLanes): the fastest
// of 1, 4, 8 and 16 at orders 384 and 768, three times one lane's speed
// (BENCHMARKS.md, issue 26; BenchmarkCUDAQR). syevd gains nothing
// measurable: its calls wait on the host for part of their work.
var solverLaneCount = 16

// solverLanes calls f(solver, b, ws) for every matrix b of a batch,
// matrix b on lane b mod the lane count with that lane's solver handle and
// a workspace of wsBytes of its own (scratch wsName). Inside Do.
func (c *cudaImpl) solverLanes(wsName string, batch int, wsBytes int64, f func(*cuda.SolverHandle, int64, cuda.DevicePtr) error) error {
	lanes := min(batch, solverLaneCount)
	return c.Lanes(lanes, func(lane int) error {
		solver, err := c.Solver()
		if err != nil {
			return err
		}
		ws, err := c.Scratch(wsName, wsBytes)
		if err != nil {
			return err
		}
		for b := int64(lane); b < int64(batch); b += int64(lanes) {
			if err := f(solver, b, ws); err != nil {
				return fmt.Errorf("matrix %d: %w", b, err)
			}
		}
		return nil
	})
}
