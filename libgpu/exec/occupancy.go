package exec

import (
	"fmt"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
)

// Launch geometry from the device and a kernel's resources: persistent
// kernels (the fast LayerNorm ones) size their grids to what the GPU holds
// at once, so no partial second wave of blocks trails the first.

type residentKey struct {
	f       cuda.Function
	threads int
	smem    uint32
}

// SMCount is the device's multiprocessor count (132 on an H100 SXM), read
// once; 132 when the device does not say. Inside Do.
func (c *CUDA) SMCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sms > 0 {
		return c.sms
	}
	c.sms = 132
	if d, ok := c.dev.(interface{ DriverDevice() cuda.Device }); ok {
		if n, err := d.DriverDevice().Attribute(cuda.AttrMultiprocessorCount); err == nil && n > 0 {
			c.sms = n
		}
	}
	return c.sms
}

// ResidentGrid is how many blocks of kernel k with threads threads and
// smem bytes of dynamic shared memory the GPU runs at once: blocks per
// multiprocessor from its registers (allocated per warp in units of 256),
// its shared memory (228 KiB per multiprocessor, 1 KiB reserved per block)
// and the limits of 2048 threads and 32 blocks (sm_90), times the
// multiprocessors. At least one block per multiprocessor. Inside Do.
func (c *CUDA) ResidentGrid(k launch.Kernel, threads int, smem uint32) (int, error) {
	f, err := c.Function(k)
	if err != nil {
		return 0, err
	}
	key := residentKey{f, threads, smem}
	c.mu.Lock()
	n, ok := c.resident[key]
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	regs, err := f.Attribute(cuda.FuncNumRegs)
	if err != nil {
		return 0, fmt.Errorf("exec: %s: %w", k.Name, err)
	}
	static, err := f.Attribute(cuda.FuncSharedSizeBytes)
	if err != nil {
		return 0, fmt.Errorf("exec: %s: %w", k.Name, err)
	}
	n = residentBlocks(regs, static+int(smem), threads) * c.SMCount()
	c.mu.Lock()
	if c.resident == nil {
		c.resident = map[residentKey]int{}
	}
	c.resident[key] = n
	c.mu.Unlock()
	return n, nil
}

// residentBlocks is the blocks of threads threads, regs registers per
// thread and smem bytes of shared memory that one sm_90 multiprocessor
// holds (65536 registers, 228 KiB of shared memory, 2048 threads, 32
// blocks), at least 1.
func residentBlocks(regs, smem, threads int) int {
	warps := (threads + 31) / 32
	perWarp := (max(regs, 1)*32 + 255) / 256 * 256
	n := min(65536/(perWarp*warps), 2048/(warps*32), 32, (228<<10)/(smem+1024))
	return max(n, 1)
}
