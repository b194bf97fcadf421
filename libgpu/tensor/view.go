package tensor

import (
	"fmt"
	"math"
)

// Views share the buffer of the tensor they come from; none copies. Ops
// accept views where their kernels take strides (each op's doc says which
// operands may be strided); elsewhere they ask for Contiguous tensors and
// fail with ErrLayout.

// Rank is the number of dimensions.
func (t *Tensor) Rank() int { return len(t.Shape) }

// axis resolves a possibly negative dimension index (−1 is the last).
func (t *Tensor) axis(d int) (int, error) {
	r := len(t.Shape)
	if d < 0 {
		d += r
	}
	if d < 0 || d >= r {
		return 0, fmt.Errorf("%w: dimension %d of a rank-%d tensor", ErrShape, d, r)
	}
	return d, nil
}

// Dim is the size of dimension d (negative d counts from the end). It
// panics on a bad index, like a slice index: use it on shapes the caller
// has checked.
func (t *Tensor) Dim(d int) int {
	a, err := t.axis(d)
	if err != nil {
		panic(err)
	}
	return t.Shape[a]
}

func (t *Tensor) view(shape, strides []int, offset int) *Tensor {
	return &Tensor{Buf: t.Buf, DType: t.DType, Shape: shape, Strides: strides, Offset: offset}
}

// Permute returns the view whose dimension i is t's dimension dims[i]
// (torch.Tensor.permute). dims must be a permutation of 0..Rank()-1.
func (t *Tensor) Permute(dims ...int) (*Tensor, error) {
	if len(dims) != len(t.Shape) {
		return nil, fmt.Errorf("%w: permute %v of %v", ErrShape, dims, t.Shape)
	}
	seen := make([]bool, len(dims))
	shape, strides := make([]int, len(dims)), make([]int, len(dims))
	for i, d := range dims {
		a, err := t.axis(d)
		if err != nil || seen[a] {
			return nil, fmt.Errorf("%w: permute %v of %v", ErrShape, dims, t.Shape)
		}
		seen[a] = true
		shape[i], strides[i] = t.Shape[a], t.Strides[a]
	}
	return t.view(shape, strides, t.Offset), nil
}

// Transpose returns the view with dimensions a and b swapped
// (torch.Tensor.transpose).
func (t *Tensor) Transpose(a, b int) (*Tensor, error) {
	ia, err := t.axis(a)
	if err != nil {
		return nil, err
	}
	ib, err := t.axis(b)
	if err != nil {
		return nil, err
	}
	dims := make([]int, len(t.Shape))
	for i := range dims {
		dims[i] = i
	}
	dims[ia], dims[ib] = ib, ia
	return t.Permute(dims...)
}

// Narrow returns the view of indices [start, start+length) along dimension
// d (torch.Tensor.narrow).
func (t *Tensor) Narrow(d, start, length int) (*Tensor, error) {
	a, err := t.axis(d)
	if err != nil {
		return nil, err
	}
	if start < 0 || length < 0 || start+length > t.Shape[a] {
		return nil, fmt.Errorf("%w: narrow [%d,+%d) of dimension %d of %v", ErrShape, start, length, d, t.Shape)
	}
	shape := append([]int(nil), t.Shape...)
	shape[a] = length
	return t.view(shape, append([]int(nil), t.Strides...), t.Offset+start*t.Strides[a]), nil
}

// Select returns the view at index i of dimension d, with that dimension
// removed (torch.Tensor.select).
func (t *Tensor) Select(d, i int) (*Tensor, error) {
	a, err := t.axis(d)
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= t.Shape[a] {
		return nil, fmt.Errorf("%w: select %d of dimension %d of %v", ErrShape, i, d, t.Shape)
	}
	shape := append(append([]int(nil), t.Shape[:a]...), t.Shape[a+1:]...)
	strides := append(append([]int(nil), t.Strides[:a]...), t.Strides[a+1:]...)
	return t.view(shape, strides, t.Offset+i*t.Strides[a]), nil
}

// View returns a view with a new shape of the same element count
// (torch.Tensor.view): it works on any tensor whose dimensions being merged
// or split are laid out contiguously with respect to each other, and fails
// with ErrLayout otherwise (where PyTorch too would need reshape's copy).
// One entry of shape may be −1 and is inferred.
func (t *Tensor) View(shape ...int) (*Tensor, error) {
	shape, err := inferShape(shape, t.Numel())
	if err != nil {
		return nil, fmt.Errorf("%w: view %v as %v", err, t.Shape, shape)
	}
	if t.Contiguous() {
		return t.view(shape, RowMajor(shape), t.Offset), nil
	}
	strides, ok := viewStrides(t.Shape, t.Strides, shape)
	if !ok {
		return nil, fmt.Errorf("%w: view %v (strides %v) as %v", ErrLayout, t.Shape, t.Strides, shape)
	}
	return t.view(shape, strides, t.Offset), nil
}

func inferShape(shape []int, n int) ([]int, error) {
	shape = append([]int(nil), shape...)
	infer, known := -1, 1
	for i, s := range shape {
		switch {
		case s == -1 && infer < 0:
			infer = i
		case s < 0:
			return shape, ErrShape
		default:
			known *= s
		}
	}
	if infer >= 0 {
		if known == 0 || n%known != 0 {
			return shape, ErrShape
		}
		shape[infer] = n / known
	} else if known != n {
		return shape, ErrShape
	}
	return shape, nil
}

// viewStrides computes strides for viewing (oldShape, oldStrides) as
// newShape without a copy, grouping dimensions into chunks whose element
// counts match; each old chunk must be contiguous within itself (the
// algorithm of PyTorch's computeStride, written from its description).
func viewStrides(oldShape, oldStrides, newShape []int) ([]int, bool) {
	newStrides := make([]int, len(newShape))
	if Numel(oldShape) == 0 {
		return RowMajor(newShape), true
	}
	vi := len(newShape) - 1
	chunkBase := oldStrides[len(oldStrides)-1]
	tensorElems, viewElems := 1, 1
	for ti := len(oldShape) - 1; ti >= 0; ti-- {
		tensorElems *= oldShape[ti]
		// A chunk ends where the next-outer old dimension is not laid
		// out right after this one.
		if ti == 0 || (oldShape[ti-1] != 1 && oldStrides[ti-1] != tensorElems*chunkBase) {
			for vi >= 0 && (viewElems < tensorElems || newShape[vi] == 1) {
				newStrides[vi] = viewElems * chunkBase
				viewElems *= newShape[vi]
				vi--
			}
			if viewElems != tensorElems {
				return nil, false
			}
			if ti > 0 {
				chunkBase = oldStrides[ti-1]
				tensorElems, viewElems = 1, 1
			}
		}
	}
	if vi != -1 {
		return nil, false
	}
	return newStrides, true
}

// Unsqueeze returns the view with a dimension of size 1 inserted at d
// (0 ≤ d ≤ Rank(); negative d counts from Rank()+1).
func (t *Tensor) Unsqueeze(d int) (*Tensor, error) {
	r := len(t.Shape)
	if d < 0 {
		d += r + 1
	}
	if d < 0 || d > r {
		return nil, fmt.Errorf("%w: unsqueeze %d of %v", ErrShape, d, t.Shape)
	}
	st := 1
	if d < r {
		st = t.Strides[d] * t.Shape[d]
	}
	shape := append(append(append([]int(nil), t.Shape[:d]...), 1), t.Shape[d:]...)
	strides := append(append(append([]int(nil), t.Strides[:d]...), st), t.Strides[d:]...)
	return t.view(shape, strides, t.Offset), nil
}

// InnerContiguous reports whether the last dimension has stride 1 (or
// size ≤ 1): the layout kernels that take row strides need.
func (t *Tensor) InnerContiguous() bool {
	r := len(t.Shape)
	return r == 0 || t.Shape[r-1] <= 1 || t.Strides[r-1] == 1
}

// Extent is the number of elements from the first to one past the last
// element the view can address (0 for an empty view). A view is inside its
// buffer when (Offset + Extent) · DType.Size() ≤ Buf.Size().
func (t *Tensor) Extent() int {
	if t.Numel() == 0 {
		return 0
	}
	last := 0
	for i, s := range t.Shape {
		last += (s - 1) * t.Strides[i]
	}
	return last + 1
}

// Offsets calls f with the element offset (from the buffer's start, in
// elements) of every element of t in row-major order. Host backends use it
// to read and write strided views.
func (t *Tensor) Offsets(f func(i, off int)) {
	n := t.Numel()
	if n == 0 {
		return
	}
	r := len(t.Shape)
	if r == 0 {
		f(0, t.Offset)
		return
	}
	idx := make([]int, r)
	off := t.Offset
	inner, is := t.Shape[r-1], t.Strides[r-1]
	for i := 0; i < n; i += inner {
		for j := 0; j < inner; j++ {
			f(i+j, off+j*is)
		}
		// Advance the outer index (dimensions 0..r-2).
		for d := r - 2; d >= 0; d-- {
			idx[d]++
			off += t.Strides[d]
			if idx[d] < t.Shape[d] {
				break
			}
			off -= t.Strides[d] * t.Shape[d]
			idx[d] = 0
		}
	}
}

// ReadFloat32 copies the elements of an f32, bf16 or f16 tensor (any
// strides, any device) into a new row-major []float32, widening 16-bit
// floats exactly.
func (t *Tensor) ReadFloat32() ([]float32, error) {
	if t.DType != F32 && t.DType != BF16 && t.DType != F16 {
		return nil, fmt.Errorf("%w: ReadFloat32 of %v", ErrDType, t.DType)
	}
	raw, err := t.rawSpan()
	if err != nil {
		return nil, err
	}
	out := make([]float32, t.Numel())
	base := t.Offset - t.spanStart()
	switch t.DType {
	case F32:
		v := BytesAs[float32](raw)
		t.Offsets(func(i, off int) { out[i] = v[off-t.Offset+base] })
	case BF16:
		v := BytesAs[uint16](raw)
		t.Offsets(func(i, off int) { out[i] = BF16ToF32(v[off-t.Offset+base]) })
	case F16:
		v := BytesAs[uint16](raw)
		t.Offsets(func(i, off int) { out[i] = F16ToF32(v[off-t.Offset+base]) })
	}
	return out, nil
}

// WriteFloat32 writes v (row-major, Numel() values) into an f32, bf16 or
// f16 tensor of any strides on any device, rounding to nearest even for
// 16-bit floats. Elements outside the view keep their values.
func (t *Tensor) WriteFloat32(v []float32) error {
	if t.DType != F32 && t.DType != BF16 && t.DType != F16 {
		return fmt.Errorf("%w: WriteFloat32 of %v", ErrDType, t.DType)
	}
	if len(v) != t.Numel() {
		return fmt.Errorf("%w: writing %d values into %v", ErrShape, len(v), t.Shape)
	}
	if t.Contiguous() && t.DType == F32 {
		return t.Write(AsBytes(v))
	}
	raw, err := t.rawSpan()
	if err != nil {
		return err
	}
	base := t.Offset - t.spanStart()
	switch t.DType {
	case F32:
		d := BytesAs[float32](raw)
		t.Offsets(func(i, off int) { d[off-t.Offset+base] = v[i] })
	case BF16:
		d := BytesAs[uint16](raw)
		t.Offsets(func(i, off int) { d[off-t.Offset+base] = BF16FromF32(v[i]) })
	case F16:
		d := BytesAs[uint16](raw)
		t.Offsets(func(i, off int) { d[off-t.Offset+base] = F16FromF32(v[i]) })
	}
	return t.Device().CopyIn(t.Buf, int64(t.spanStart()*t.DType.Size()), raw)
}

// spanStart is the smallest element offset the view addresses (strides
// are non-negative for every view this package makes).
func (t *Tensor) spanStart() int { return t.Offset }

// rawSpan copies the bytes of [Offset, Offset+Extent) out of the buffer.
func (t *Tensor) rawSpan() ([]byte, error) {
	n := int64(t.Extent() * t.DType.Size())
	off := int64(t.spanStart() * t.DType.Size())
	if err := t.Buf.CheckRange(off, n); err != nil {
		return nil, fmt.Errorf("%w: view past end of buffer: %v", ErrShape, err)
	}
	// Allocate as u32 words so BytesAs of any 4-byte type is aligned.
	words := make([]uint32, (n+3)/4)
	raw := AsBytes(words)[:n]
	if n == 0 {
		return raw, nil
	}
	if err := t.Device().CopyOut(raw, t.Buf, off); err != nil {
		return nil, err
	}
	return raw, nil
}

// Float32sOf converts float64 values to float32 (round to nearest).
func Float32sOf(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// RoundBF16 rounds every value to the nearest bf16 (what storing into a
// bf16 tensor does), in place, and returns v.
func RoundBF16(v []float32) []float32 {
	for i, x := range v {
		v[i] = BF16ToF32(BF16FromF32(x))
	}
	return v
}

// IsFinite reports whether every value is finite.
func IsFinite(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}
