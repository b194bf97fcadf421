package dist

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// ErrBucket: a bucket plan's parameters or configuration are unusable.
var ErrBucket = errors.New("dist: bad bucket plan")

// Bucket sizes of PyTorch's DistributedDataParallel: bucket_cap_mb=25 and
// the first bucket of 1 MiB (torch.distributed's
// _DEFAULT_FIRST_BUCKET_BYTES), so the first all-reduce starts early in
// the backward.
const (
	DefaultBucketBytes      = 25 << 20
	DefaultFirstBucketBytes = 1 << 20
	// DefaultAlign is the byte alignment of every gradient in its bucket
	// and of every bucket: cudaMalloc's 256 bytes, so a gradient view is
	// as aligned as a gradient of its own (vectorised kernels need 16).
	DefaultAlign = 256
)

// Param describes one trainable parameter's gradient: a name for errors
// and buffer names, its dtype and its shape.
type Param struct {
	Name  string
	DType tensor.DType
	Shape []int
}

// BucketConfig sizes the buckets; zero fields take the defaults above.
type BucketConfig struct {
	// Bytes is a bucket's size limit: a bucket closes as soon as it holds
	// at least Bytes (so it may pass the limit by its last gradient, and a
	// gradient larger than the limit has a bucket of its own).
	Bytes int64
	// FirstBytes is the limit of the first bucket of each dtype.
	FirstBytes int64
	// Align is the byte alignment of each gradient within its bucket and
	// of each bucket in the storage; a power of two, at least 16.
	Align int64
}

// Bucket is a run of gradients of one dtype, contiguous in the storage,
// that one all-reduce covers.
type Bucket struct {
	DType tensor.DType
	// Params are indices into Layout.Params, in the order the backward is
	// expected to produce them (the reverse of Plan's order).
	Params []int
	// Numel is the bucket's length in elements, alignment padding included.
	Numel int
	// Offset is the bucket's byte offset in the storage.
	Offset int64
}

// Bytes is the bucket's length in bytes.
func (b Bucket) Bytes() int64 { return int64(b.Numel) * int64(b.DType.Size()) }

// Slot is where one gradient lives: its bucket and its element offset in
// the bucket.
type Slot struct {
	Bucket int
	Offset int
}

// Layout is a plan of gradient storage in buckets (Plan).
type Layout struct {
	Params  []Param
	Buckets []Bucket // in the order their first gradient is expected
	Slots   []Slot   // per parameter
	Bytes   int64    // the whole storage, a multiple of the alignment
	Align   int64
}

// Plan assigns gradients to buckets as PyTorch's DDP does
// (torch.distributed's _compute_bucket_assignment_by_size): params come in
// the order of their first use in the forward (model.parameters() order),
// and are assigned in reverse, because the backward produces the last
// layer's gradients first; each dtype fills buckets of its own; a bucket
// closes once it holds at least its limit (FirstBytes for a dtype's first
// bucket, Bytes after). Inside a bucket gradients sit in assignment order,
// each aligned to Align bytes, so that every gradient is a view of the
// bucket and one all-reduce of the bucket reduces them all without a
// packing copy. Errors (ErrBucket): no parameters, a parameter with no
// elements, a dtype without a size, a bad alignment or negative limits.
func Plan(params []Param, cfg BucketConfig) (*Layout, error) {
	if cfg.Bytes == 0 {
		cfg.Bytes = DefaultBucketBytes
	}
	if cfg.FirstBytes == 0 {
		cfg.FirstBytes = DefaultFirstBucketBytes
	}
	if cfg.Align == 0 {
		cfg.Align = DefaultAlign
	}
	if cfg.Bytes < 0 || cfg.FirstBytes < 0 || cfg.Align < 16 || cfg.Align&(cfg.Align-1) != 0 {
		return nil, fmt.Errorf("%w: bucket bytes %d, first %d, align %d (want limits ≥ 0 and a power-of-two alignment ≥ 16)",
			ErrBucket, cfg.Bytes, cfg.FirstBytes, cfg.Align)
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("%w: no parameters", ErrBucket)
	}
	l := &Layout{Params: make([]Param, len(params)), Slots: make([]Slot, len(params)), Align: cfg.Align}
	for i, p := range params {
		if p.DType.Size() == 0 {
			return nil, fmt.Errorf("%w: %s has dtype %v", ErrBucket, p.Name, p.DType)
		}
		if n := tensor.Numel(p.Shape); n <= 0 {
			return nil, fmt.Errorf("%w: %s has shape %v (no elements)", ErrBucket, p.Name, p.Shape)
		}
		for _, d := range p.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: %s has shape %v", ErrBucket, p.Name, p.Shape)
			}
		}
		p.Shape = append([]int(nil), p.Shape...)
		l.Params[i] = p
	}
	type open struct {
		b      int   // index in l.Buckets
		bytes  int64 // filled so far, padding included
		closed int   // buckets of this dtype closed so far
	}
	opened := map[tensor.DType]*open{}
	for i := len(params) - 1; i >= 0; i-- {
		p := l.Params[i]
		es := int64(p.DType.Size())
		o := opened[p.DType]
		if o == nil || o.b < 0 {
			if o == nil {
				o = &open{}
				opened[p.DType] = o
			}
			o.b, o.bytes = len(l.Buckets), 0
			l.Buckets = append(l.Buckets, Bucket{DType: p.DType})
		}
		b := &l.Buckets[o.b]
		start := roundUp(o.bytes, cfg.Align)
		b.Params = append(b.Params, i)
		l.Slots[i] = Slot{Bucket: o.b, Offset: int(start / es)}
		o.bytes = start + int64(tensor.Numel(p.Shape))*es
		b.Numel = int(o.bytes / es)
		limit := cfg.Bytes
		if o.closed == 0 {
			limit = cfg.FirstBytes
		}
		if o.bytes >= limit {
			o.b, o.closed = -1, o.closed+1
		}
	}
	for b := range l.Buckets {
		bk := &l.Buckets[b]
		es := int64(bk.DType.Size())
		bk.Numel = int(roundUp(int64(bk.Numel)*es, cfg.Align) / es)
		bk.Offset = l.Bytes
		l.Bytes += bk.Bytes()
	}
	return l, nil
}

func roundUp(n, a int64) int64 { return (n + a - 1) / a * a }

// Grads is gradient storage laid out by a Layout: one buffer, each bucket
// a 1-D tensor over its part, each gradient a view of its bucket.
type Grads struct {
	Buf     *device.Buffer
	Buckets []*tensor.Tensor // bucket b: [Buckets[b].Numel] of its dtype
	Params  []*tensor.Tensor // parameter i's gradient: its shape, a view of its bucket
}

// Alloc allocates the storage (Layout.Bytes through a, named name),
// zeroes it (so the alignment padding, which every all-reduce and any norm
// over a whole bucket reads, holds zeros) and lays the views out (View).
func (l *Layout) Alloc(a device.Allocator, name string) (*Grads, error) {
	buf, err := a.Alloc(name, l.Bytes)
	if err != nil {
		return nil, fmt.Errorf("dist: gradient buckets (%d bytes): %w", l.Bytes, err)
	}
	zero := make([]byte, min(l.Bytes, 64<<20))
	for off := int64(0); off < l.Bytes; off += int64(len(zero)) {
		n := min(int64(len(zero)), l.Bytes-off)
		if err := a.Device().CopyIn(buf, off, zero[:n]); err != nil {
			buf.Free()
			return nil, fmt.Errorf("dist: zeroing gradient buckets: %w", err)
		}
	}
	g, err := l.View(buf)
	if err != nil {
		buf.Free()
		return nil, err
	}
	return g, nil
}

// View lays the buckets and gradients out over buf (at least Layout.Bytes
// long, aligned as the layout's alignment wants).
func (l *Layout) View(buf *device.Buffer) (*Grads, error) {
	if buf.Size() < l.Bytes {
		return nil, fmt.Errorf("%w: buffer of %d bytes for %d bytes of buckets", ErrBucket, buf.Size(), l.Bytes)
	}
	if buf.Ptr()%uintptr(l.Align) != 0 {
		return nil, fmt.Errorf("%w: buffer at %#x is not %d-byte aligned", ErrBucket, buf.Ptr(), l.Align)
	}
	g := &Grads{Buf: buf}
	for _, b := range l.Buckets {
		es := int64(b.DType.Size())
		if b.Offset%es != 0 {
			return nil, fmt.Errorf("%w: bucket offset %d is not a multiple of %v's size", ErrBucket, b.Offset, b.DType)
		}
		t := &tensor.Tensor{Buf: buf, DType: b.DType, Shape: []int{b.Numel}, Strides: []int{1}, Offset: int(b.Offset / es)}
		g.Buckets = append(g.Buckets, t)
	}
	for i, p := range l.Params {
		s := l.Slots[i]
		bt := g.Buckets[s.Bucket]
		g.Params = append(g.Params, &tensor.Tensor{Buf: buf, DType: p.DType, Shape: append([]int(nil), p.Shape...),
			Strides: tensor.RowMajor(p.Shape), Offset: bt.Offset + s.Offset})
	}
	return g, nil
}

// Free frees the storage; the tensors must not be used afterwards.
func (g *Grads) Free() error { return g.Buf.Free() }
