package exec

// Kernel loading and launches. The CUDA backend is the launch.Launcher of
// libgpu/kernels/launch's typed launchers: Launch looks the kernel up
// (Function: once per engine, compiling the unit that provides it from the
// embedded source through libgpu/kernels' compiler and cache on first
// use), raises its dynamic shared-memory limit when asked for more than
// the default, and queues it on the current stream.
//
// Prefetch is the hint that makes first launches fast: an op family's
// Graph method names the kernels (or files) its steps will launch as it
// records them, so a run's kernels compile in parallel on libgpu/kernels'
// worker pool while the model is still being recorded, and only those. A
// kernel not named compiles when it is first launched (OnDemandKernels
// lists those, for tests).

import (
	"fmt"
	"sync"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/kernels/launch"
)

// kernelCache holds the kernels a CUDA backend looked up, and the dynamic
// shared memory each was allowed beyond the default.
type kernelCache struct {
	mu   sync.Mutex
	m    map[launch.Kernel]cuda.Function
	smem map[cuda.Function]uint32
	// onDemand lists the kernels ("file:name") whose first launch found
	// them neither compiled nor prefetched.
	onDemand []string
}

// smemDefault is the dynamic shared memory a kernel may use without
// raising CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (48 KiB on every
// architecture; Hopper allows up to 227 KiB per block once raised).
const smemDefault = 48 << 10

var _ launch.Launcher = (*CUDA)(nil)

// Compiler is the process's compiler of the embedded kernels for the
// backend's context (kernels.ForContext).
func (c *CUDA) Compiler() (*kernels.DeviceCompiler, error) {
	return kernels.ForContext(c.dev.Context())
}

// Function returns kernel k, compiling and loading what provides it on
// first use. A kernel first used while the stream is being captured is an
// error (compilation and module loading are not allowed then: run the
// step once eagerly first). Inside Do.
func (c *CUDA) Function(k launch.Kernel) (cuda.Function, error) {
	c.kc.mu.Lock()
	defer c.kc.mu.Unlock()
	if f, ok := c.kc.m[k]; ok {
		return f, nil
	}
	if capturing, err := c.stream.IsCapturing(); err == nil && capturing {
		return 0, fmt.Errorf("exec: kernel %s/%s first used while capturing (run the step once eagerly first)", k.File, k.Name)
	}
	d, err := c.Compiler()
	if err != nil {
		return 0, err
	}
	if !d.Prefetched(k.File, k.Name) {
		c.kc.onDemand = append(c.kc.onDemand, k.String())
	}
	f, err := d.Function(k.File, k.Name)
	if err != nil {
		return 0, err
	}
	if c.kc.m == nil {
		c.kc.m = map[launch.Kernel]cuda.Function{}
	}
	c.kc.m[k] = f
	return f, nil
}

// staticSmem is f's static shared memory in bytes (0 when the driver does
// not say); static and dynamic together must fit the 48 KiB default
// unless the kernel's dynamic limit is raised (seen on an H100: a LayerNorm
// backward with exactly 48 KiB dynamic plus some static failed to launch
// with CUDA_ERROR_INVALID_VALUE).
func staticSmem(f cuda.Function) uint32 {
	n, err := f.Attribute(cuda.FuncSharedSizeBytes)
	if err != nil || n < 0 {
		return 0
	}
	return uint32(n)
}

// allowSmem raises f's dynamic shared memory limit to at least n bytes
// (once per kernel and size).
func (c *CUDA) allowSmem(f cuda.Function, n uint32) error {
	c.kc.mu.Lock()
	defer c.kc.mu.Unlock()
	if c.kc.smem[f] >= n {
		return nil
	}
	if err := f.SetAttribute(cuda.FuncMaxDynamicSharedSizeBytes, int(n)); err != nil {
		return err
	}
	if c.kc.smem == nil {
		c.kc.smem = map[cuda.Function]uint32{}
	}
	c.kc.smem[f] = n
	return nil
}

// Launch implements launch.Launcher: it queues kernel k on the current
// stream with dynamic shared memory smem bytes (above 48 KiB with the
// kernel's static memory, its limit is raised first). args point to values
// of exactly the kernel's parameter types (the typed launchers build them).
// Inside Do.
func (c *CUDA) Launch(k launch.Kernel, grid, block [3]uint32, smem uint32, args ...unsafe.Pointer) error {
	f, err := c.Function(k)
	if err != nil {
		return err
	}
	if smem > 0 && smem+staticSmem(f) > smemDefault {
		if err := c.allowSmem(f, smem); err != nil {
			return fmt.Errorf("exec: %s: %d bytes of shared memory: %w", k.Name, smem, err)
		}
	}
	if err := cuda.LaunchKernel(f, grid, block, smem, c.stream, args...); err != nil {
		return fmt.Errorf("exec: launch %s: %w", k.Name, err)
	}
	return nil
}

// Prefetch starts compiling, in the background, the kernels of the embedded
// source file (libgpu/kernels; none named: the whole file), so their first
// launch does not wait for NVRTC. It returns at once and reports nothing
// (a failed compilation is reported by the launch that needs it).
func (c *CUDA) Prefetch(file string, kernels ...string) {
	if kc, err := c.Compiler(); err == nil {
		kc.Prefetch(file, kernels...)
	}
}

// Prefetch is CUDA.Prefetch on the CUDA backend; it does nothing on the
// host.
func (e *Engine) Prefetch(file string, kernels ...string) {
	if e.cuda != nil {
		e.cuda.Prefetch(file, kernels...)
	}
}

// PrefetchKernels is Prefetch of the kernels ks (the typed launchers'
// names: launch.XKernel), each from its own file.
func (e *Engine) PrefetchKernels(ks ...launch.Kernel) {
	if e.cuda == nil {
		return
	}
	for _, k := range ks {
		e.cuda.Prefetch(k.File, k.Name)
	}
}

// OnDemandKernels lists the kernels ("file:name") whose first launch on e
// found them neither compiled nor prefetched (nil on the host): a model
// whose Graph methods prefetch what they launch has none.
func (e *Engine) OnDemandKernels() []string {
	if c := e.cuda; c != nil {
		c.kc.mu.Lock()
		defer c.kc.mu.Unlock()
		return append([]string(nil), c.kc.onDemand...)
	}
	return nil
}
