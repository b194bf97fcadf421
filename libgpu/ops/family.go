package ops

// The op-family pattern. An op family (layernorm, attention, embedding,
// ...) lives in one place and is added without editing any central table:
//
//   - libgpu/ops/<family>.go: the Engine methods (forward and backward,
//     argument checks), the host implementation, the CUDA launch code with
//     one typed Go function per kernel, and the Graph method that records
//     the op on an autograd tape (forward and backward in one closure pair);
//   - libgpu/kernels/<family>.cu: the kernels, extern "C", one instance per
//     dtype named <kernel>_f32 / <kernel>_bf16 (dtSuffix);
//   - libgpu/ops/opstest/<family>.go: the float64 reference and the checks
//     (forward against the reference with outputs poisoned first, backward
//     against finite differences, accumulation, validation), registered
//     with opstest.Register so opstest.CheckFamilies runs them on every
//     backend and precision.
//
// Engine methods dispatch with e.dispatch(host, cuda); CUDA code reaches
// its kernels with c.kernel(file, name), compiled from the embedded source
// through the kernel cache on first use. The Graph method names the
// kernels (or the file) its steps launch with g.prefetch (prefetch.go), so
// they compile in parallel while the model is recorded.

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// dispatch runs host on the host backend and gpu on the CUDA backend (on
// the device's thread, its context current). Other backends get
// ErrNoBackend.
func (e *Engine) dispatch(host func(h *hostImpl) error, gpu func(c *cudaImpl) error) error {
	switch b := e.impl.(type) {
	case *hostImpl:
		if host == nil {
			break
		}
		return host(b)
	case *cudaImpl:
		if gpu == nil {
			break
		}
		return b.dev.Do(func() error { return gpu(b) })
	}
	return fmt.Errorf("%w: %v", ErrNoBackend, e.dev)
}

// kernelCache holds the kernels a CUDA backend looked up by (file, name),
// and the dynamic shared memory each was allowed beyond the default.
type kernelCache struct {
	mu   sync.Mutex
	m    map[[2]string]cuda.Function
	smem map[cuda.Function]uint32
	// onDemand lists the kernels ("file:name") whose first launch found
	// them neither compiled nor prefetched (prefetch.go).
	onDemand []string
}

// smemDefault is the dynamic shared memory a kernel may use without
// raising CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (48 KiB on every
// architecture; Hopper allows up to 227 KiB per block once raised).
const smemDefault = 48 << 10

// allowSmem raises f's dynamic shared memory limit to at least n bytes
// (once per kernel and size).
// staticSmem is f's static shared memory in bytes (0 when the driver does
// not say); static and dynamic together must fit the 48 KiB default
// unless the kernel's dynamic limit is raised (seen on an H100: a LayerNorm
// backward with exactly 48 KiB dynamic plus some static failed to launch
// with CUDA_ERROR_INVALID_VALUE).
func (c *cudaImpl) staticSmem(f cuda.Function) uint32 {
	n, err := f.Attribute(cuda.FuncSharedSizeBytes)
	if err != nil || n < 0 {
		return 0
	}
	return uint32(n)
}

func (c *cudaImpl) allowSmem(f cuda.Function, n uint32) error {
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

// kernel returns the kernel name of the embedded source file, compiling
// and loading the module on first use. Must run inside Do.
func (c *cudaImpl) kernel(file, name string) (cuda.Function, error) {
	c.kc.mu.Lock()
	defer c.kc.mu.Unlock()
	key := [2]string{file, name}
	if f, ok := c.kc.m[key]; ok {
		return f, nil
	}
	if capturing, err := c.stream.IsCapturing(); err == nil && capturing {
		return 0, fmt.Errorf("ops: kernel %s/%s first used while capturing (run the step once eagerly first)", file, name)
	}
	d, err := kernelCompiler(c)
	if err != nil {
		return 0, err
	}
	if !d.Prefetched(file, name) {
		c.kc.onDemand = append(c.kc.onDemand, file+":"+name)
	}
	f, err := d.Function(file, name)
	if err != nil {
		return 0, err
	}
	if c.kc.m == nil {
		c.kc.m = map[[2]string]cuda.Function{}
	}
	c.kc.m[key] = f
	return f, nil
}

// dtSuffix is the kernel-name suffix of a floating dtype's instance.
func dtSuffix(dt tensor.DType) string {
	switch dt {
	case tensor.BF16:
		return "_bf16"
	case tensor.F16:
		return "_f16"
	}
	return "_f32"
}

// Launch implements launch.Launcher: the typed launchers of
// libgpu/kernels/launch queue kernel k through it on the backend's stream
// with dynamic shared memory smem bytes (above 48 KiB, the kernel's limit
// is raised first). Must run inside Do.
func (c *cudaImpl) Launch(k launch.Kernel, grid, block [3]uint32, smem uint32, args ...unsafe.Pointer) error {
	f, err := c.kernel(k.File, k.Name)
	if err != nil {
		return err
	}
	if smem > 0 && smem+c.staticSmem(f) > smemDefault {
		if err := c.allowSmem(f, smem); err != nil {
			return fmt.Errorf("ops: %s: %d bytes of shared memory: %w", k.Name, smem, err)
		}
	}
	if err := cuda.LaunchKernel(f, grid, block, smem, c.stream, args...); err != nil {
		return fmt.Errorf("ops: launch %s: %w", k.Name, err)
	}
	return nil
}

// dtName is a floating dtype's name in kernel instance names ("f32",
// "bf16", "f16").
func dtName(dt tensor.DType) string { return dtSuffix(dt)[1:] }

// grid1 is the 1-D grid of n blocks (at least 1, at most 2³¹−1).
func grid1(n int) [3]uint32 { return [3]uint32{uint32(min(max(n, 1), math.MaxInt32)), 1, 1} }

// block1 is a 1-D block of n threads.
func block1(n int) [3]uint32 { return [3]uint32{uint32(n), 1, 1} }

// hostIn returns the elements of an f32, bf16 or f16 host tensor of any
// strides as row-major f32: the tensor's own memory when it is contiguous
// f32 (do not write to it), else a widened copy.
func hostIn(t *tensor.Tensor) ([]float32, error) {
	if t == nil {
		return nil, nil
	}
	if t.DType == tensor.F32 && t.Contiguous() {
		s, err := t.F32()
		if err != nil {
			return nil, fmt.Errorf("ops: host backend: %w", err)
		}
		return s, nil
	}
	s, err := t.ReadFloat32()
	if err != nil {
		return nil, fmt.Errorf("ops: host backend: %w", err)
	}
	return s, nil
}

// hostIns is hostIn of each tensor, in order (a nil tensor gives nil).
func hostIns(ts ...*tensor.Tensor) ([][]float32, error) {
	ins := make([][]float32, len(ts))
	for i, t := range ts {
		var err error
		if ins[i], err = hostIn(t); err != nil {
			return nil, err
		}
	}
	return ins, nil
}

// hostOut64 writes v (float64 sums, rounded to f32) to t, or adds them to
// its contents with acc (hostOut's rules).
func hostOut64(t *tensor.Tensor, acc bool, v []float64) error {
	out, commit, err := hostOut(t, acc)
	if err != nil {
		return err
	}
	for j := range out {
		out[j] = float32(v[j])
	}
	return commit()
}

// hostMap is the host side of an element-wise op: y = f(x) per element.
func hostMap(y, x *tensor.Tensor, f func(x float32) float32) error {
	xs, err := hostIn(x)
	if err != nil {
		return err
	}
	ys, commit, err := hostOut(y, false)
	if err != nil {
		return err
	}
	for i, v := range xs {
		ys[i] = f(v)
	}
	return commit()
}

// hostMapBackward is the host side of an element-wise op's backward: dx =
// f(dy, x) per element, or added to dx when acc. dx may be dy: each
// element is read before it is written.
func hostMapBackward(dx, dy, x *tensor.Tensor, acc bool, f func(dy, x float32) float32) error {
	xs, err := hostIn(x)
	if err != nil {
		return err
	}
	gs, err := hostIn(dy)
	if err != nil {
		return err
	}
	dxs, commit, err := hostOut(dx, acc)
	if err != nil {
		return err
	}
	for i, v := range xs {
		dxs[i] = f(gs[i], v)
	}
	return commit()
}

// hostOut returns row-major f32 space for an op's result for t (f32,
// bf16 or f16, any strides, host memory) and the commit that stores it:
// rounding to t's dtype, and adding to t's values when acc. For a
// contiguous f32 t written without acc the space is t's memory and commit
// does nothing.
func hostOut(t *tensor.Tensor, acc bool) ([]float32, func() error, error) {
	if t == nil {
		return nil, func() error { return nil }, nil
	}
	if t.DType == tensor.F32 && t.Contiguous() && !acc {
		s, err := t.F32()
		if err != nil {
			return nil, nil, fmt.Errorf("ops: host backend: %w", err)
		}
		return s, func() error { return nil }, nil
	}
	buf := make([]float32, t.Numel())
	return buf, func() error {
		if acc {
			old, err := t.ReadFloat32()
			if err != nil {
				return err
			}
			for i := range buf {
				buf[i] += old[i]
			}
		}
		return t.WriteFloat32(buf)
	}, nil
}

// floatTypes are the dtypes floating-point ops take.
var floatTypes = []tensor.DType{tensor.F32, tensor.BF16}

// checkView verifies that t is present, of one of the dtypes dts, of shape
// want (a nil want accepts any shape), inside its buffer and on the
// engine's device; with contig, that it is contiguous, else that its last
// dimension is (row-strided views).
func (e *Engine) checkView(what string, t *tensor.Tensor, contig bool, dts []tensor.DType, want ...int) error {
	if t == nil {
		return fmt.Errorf("%w: %s is missing", tensor.ErrShape, what)
	}
	okType := false
	for _, d := range dts {
		okType = okType || t.DType == d
	}
	if !okType {
		return fmt.Errorf("%w: %s is %v, want one of %v", tensor.ErrDType, what, t.DType, dts)
	}
	if want != nil && !tensor.SameShape(t.Shape, want) {
		return fmt.Errorf("%w: %s is %v, want %v", tensor.ErrShape, what, t.Shape, want)
	}
	if t.Buf == nil {
		return fmt.Errorf("%w: %s has no buffer", tensor.ErrShape, what)
	}
	for _, s := range t.Strides {
		if s < 0 {
			return fmt.Errorf("%w: %s has a negative stride %v", tensor.ErrLayout, what, t.Strides)
		}
	}
	if contig && !t.Contiguous() {
		return fmt.Errorf("%w: %s %v strides %v (want contiguous)", tensor.ErrLayout, what, t.Shape, t.Strides)
	}
	if !t.InnerContiguous() {
		return fmt.Errorf("%w: %s %v strides %v (want the last dimension contiguous)", tensor.ErrLayout, what, t.Shape, t.Strides)
	}
	if !sameDevice(t.Device(), e.dev) {
		return fmt.Errorf("%w: %s is on %v, engine on %v", ErrDevice, what, t.Device(), e.dev)
	}
	if int64(t.Offset+t.Extent())*int64(t.DType.Size()) > t.Buf.Size() {
		return fmt.Errorf("%w: %s view runs past its buffer", tensor.ErrShape, what)
	}
	return nil
}

// sameShapes fails unless every tensor has ref's shape.
func sameShapes(op string, ref *tensor.Tensor, ts ...*tensor.Tensor) error {
	for _, t := range ts {
		if t != nil && !tensor.SameShape(t.Shape, ref.Shape) {
			return fmt.Errorf("%w: %s: %v and %v", tensor.ErrShape, op, ref.Shape, t.Shape)
		}
	}
	return nil
}

// rowsCols views a tensor of rank ≥ 1 as rows × cols, cols the last
// dimension (a scalar is 1 × 1).
func rowsCols(t *tensor.Tensor) (rows, cols int) {
	if len(t.Shape) == 0 {
		return 1, 1
	}
	cols = t.Shape[len(t.Shape)-1]
	if cols == 0 {
		return 0, 0
	}
	return t.Numel() / cols, cols
}
