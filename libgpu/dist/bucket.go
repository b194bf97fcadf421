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
	// LastBytes, when positive, caps the last bucket of each dtype: the
	// one holding the parameters the forward uses first, whose gradients
	// the backward writes last (the token and position embeddings, the
	// first block), so that its all-reduce has nothing left to overlap
	// and is the exposed tail of the step. The leading parameters of the
	// dtype in forward order whose bytes (alignment included) fit in
	// LastBytes — at least one — get a bucket of their own, and the
	// bucket before it closes where they begin. 0 leaves the last bucket
	// to whatever the others leave (PyTorch DDP's plan).
	LastBytes int64
	// Shards, when above 1, is the number of equal parts each bucket is
	// cut into (ZeRO's optimizer-state partitioning, one part per rank:
	// a bucket is reduce-scattered into its parts and all-gathered back):
	// each bucket's length is rounded up to a multiple of Shards ×
	// Align/size elements, so every part is Align-aligned. 0 or 1: none.
	Shards int
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
	// Shards is the number of equal parts of every bucket (Part), at
	// least 1.
	Shards int
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
	if cfg.Bytes < 0 || cfg.FirstBytes < 0 || cfg.LastBytes < 0 || cfg.Shards < 0 || cfg.Align < 16 || cfg.Align&(cfg.Align-1) != 0 {
		return nil, fmt.Errorf("%w: bucket bytes %d, first %d, last %d, align %d, shards %d (want limits and shards ≥ 0 and a power-of-two alignment ≥ 16)",
			ErrBucket, cfg.Bytes, cfg.FirstBytes, cfg.LastBytes, cfg.Align, cfg.Shards)
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("%w: no parameters", ErrBucket)
	}
	l := &Layout{Params: make([]Param, len(params)), Slots: make([]Slot, len(params)), Align: cfg.Align, Shards: max(cfg.Shards, 1)}
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
	tail := tailStarts(l.Params, cfg)
	type open struct {
		b      int   // index in l.Buckets
		bytes  int64 // filled so far, padding included
		closed int   // buckets of this dtype closed so far
		tail   bool  // the bucket is the dtype's last (LastBytes)
	}
	opened := map[tensor.DType]*open{}
	for i := len(params) - 1; i >= 0; i-- {
		p := l.Params[i]
		es := int64(p.DType.Size())
		o := opened[p.DType]
		inTail := i <= tail[p.DType]
		if o != nil && o.b >= 0 && inTail && !o.tail {
			o.b, o.closed = -1, o.closed+1 // the last bucket begins here
		}
		if o == nil || o.b < 0 {
			if o == nil {
				o = &open{}
				opened[p.DType] = o
			}
			o.b, o.bytes, o.tail = len(l.Buckets), 0, inTail
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
		if o.bytes >= limit && !o.tail {
			o.b, o.closed = -1, o.closed+1
		}
	}
	for b := range l.Buckets {
		bk := &l.Buckets[b]
		es := int64(bk.DType.Size())
		bk.Numel = int(roundUp(int64(bk.Numel)*es, cfg.Align*int64(l.Shards)) / es)
		bk.Offset = l.Bytes
		l.Bytes += bk.Bytes()
	}
	return l, nil
}

// tailStarts is, per dtype, the index of the last parameter (in forward
// order) of the dtype's last bucket under cfg.LastBytes: the leading
// parameters of the dtype whose aligned bytes fit in LastBytes, at least
// one; −1 for every dtype without LastBytes.
func tailStarts(ps []Param, cfg BucketConfig) map[tensor.DType]int {
	out := map[tensor.DType]int{}
	filled := map[tensor.DType]int64{}
	done := map[tensor.DType]bool{}
	for i, p := range ps {
		if _, ok := out[p.DType]; !ok {
			out[p.DType] = -1
		}
		if cfg.LastBytes <= 0 || done[p.DType] {
			continue
		}
		end := roundUp(filled[p.DType], cfg.Align) + int64(tensor.Numel(p.Shape)*p.DType.Size())
		if end > cfg.LastBytes && out[p.DType] >= 0 {
			done[p.DType] = true
			continue
		}
		out[p.DType], filled[p.DType] = i, end
	}
	return out
}

func roundUp(n, a int64) int64 { return (n + a - 1) / a * a }

// Part is rank r's part of bucket b when the buckets are cut into
// Layout.Shards equal parts: its first element in the bucket and its
// length (Bucket.Numel / Shards elements, Align-aligned). Rank r of a
// ZeRO-1 job owns part r of every bucket: the optimizer state of those
// elements, and their reduced gradients after a reduce-scatter.
func (l *Layout) Part(b, r int) (off, n int) {
	n = l.Buckets[b].Numel / l.Shards
	return r * n, n
}

// PartView is rank r's part of bucket b's tensor t (a bucket of a Grads
// laid out by l): a view of its elements [off, off+n) of Part(b, r).
func (l *Layout) PartView(t *tensor.Tensor, b, r int) (*tensor.Tensor, error) {
	off, n := l.Part(b, r)
	return t.Rows(off, off+n)
}

// Segment is the piece of one parameter inside one rank's part of one
// bucket: elements [Offset, Offset+Numel) of the parameter (row-major,
// flattened) sit at elements [At, At+Numel) of bucket Bucket.
type Segment struct {
	Param, Bucket int
	Offset, At    int
	Numel         int
}

// Segments lists the pieces of parameters in rank r's parts of the
// buckets (Part), in bucket order and, inside a bucket, in slot order.
// A parameter may be cut between ranks; the alignment padding belongs to
// no segment. Every element of every parameter is in exactly one
// segment of one rank.
func (l *Layout) Segments(r int) []Segment {
	var out []Segment
	for b, bk := range l.Buckets {
		lo, n := l.Part(b, r)
		hi := lo + n
		for _, i := range bk.Params {
			s := l.Slots[i]
			pe := s.Offset + tensor.Numel(l.Params[i].Shape)
			a, z := max(lo, s.Offset), min(hi, pe)
			if a < z {
				out = append(out, Segment{Param: i, Bucket: b, Offset: a - s.Offset, At: a, Numel: z - a})
			}
		}
	}
	return out
}

// Grads is gradient storage laid out by a Layout: one buffer, each bucket
// a 1-D tensor over its part, each gradient a view of its bucket. The same
// storage serves parameters laid out like their gradients (ZeRO-1's
// all-gather of updated parameters, one per bucket, in place).
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
