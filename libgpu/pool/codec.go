package pool

import (
	"math"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
)

// Hand-written msgpack codecs of the bodies on the alloc and free path
// (ipc.BodyAppender, ipc.BodyParser): AppendBody writes the bytes msgpack's
// reflection encoder writes (TestCodecsMatchReflection), ParseBody reads
// their common forms and leaves anything else to reflection (the Fuzz*Body
// targets check that both readers agree).

func appendInts(b []byte, v []int64) []byte {
	b = ipc.AppendArrayHeader(b, len(v))
	for _, n := range v {
		b = ipc.AppendInt(b, n)
	}
	return b
}

func appendUints(b []byte, v []uint64) []byte {
	b = ipc.AppendArrayHeader(b, len(v))
	for _, n := range v {
		b = ipc.AppendUint(b, n)
	}
	return b
}

func readInts(r *ipc.Reader) []int64 {
	n := r.ArrayLen()
	if !r.OK() {
		return nil
	}
	v := make([]int64, n)
	for i := range v {
		v[i] = r.Int()
	}
	return v
}

func readUints(r *ipc.Reader) []uint64 {
	n := r.ArrayLen()
	if !r.OK() {
		return nil
	}
	v := make([]uint64, n)
	for i := range v {
		v[i] = r.Uint(math.MaxUint64)
	}
	return v
}

func readBin(r *ipc.Reader) []byte {
	b := r.Bin()
	if !r.OK() {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

func count(n int, set ...bool) int {
	for _, s := range set {
		if s {
			n++
		}
	}
	return n
}

// AppendBody implements ipc.BodyAppender.
func (q AllocRequest) AppendBody(b []byte) []byte {
	b = ipc.AppendMapHeader(b, count(1, q.Name != "", q.Keep, q.Unsealed, q.Legacy, q.DType != "", len(q.Shape) != 0))
	if q.Name != "" {
		b = ipc.AppendString(append(b, 0xa4, 'n', 'a', 'm', 'e'), q.Name)
	}
	b = ipc.AppendInt(append(b, 0xa4, 's', 'i', 'z', 'e'), q.Size)
	if q.Keep {
		b = append(b, 0xa4, 'k', 'e', 'e', 'p', 0xc3)
	}
	if q.Unsealed {
		b = append(b, 0xa8, 'u', 'n', 's', 'e', 'a', 'l', 'e', 'd', 0xc3)
	}
	if q.Legacy {
		b = append(b, 0xa6, 'l', 'e', 'g', 'a', 'c', 'y', 0xc3)
	}
	if q.DType != "" {
		b = ipc.AppendString(append(b, 0xa5, 'd', 't', 'y', 'p', 'e'), q.DType)
	}
	if len(q.Shape) != 0 {
		b = appendInts(append(b, 0xa5, 's', 'h', 'a', 'p', 'e'), q.Shape)
	}
	return b
}

// ParseBody implements ipc.BodyParser.
func (q *AllocRequest) ParseBody(b []byte) bool {
	r := ipc.NewReader(b)
	v := *q
	n := r.MapLen()
	for i := 0; i < n && r.OK(); i++ {
		switch string(r.Str()) {
		case "name":
			v.Name = string(r.Str())
		case "size":
			v.Size = r.Int()
		case "keep":
			v.Keep = r.Bool()
		case "unsealed":
			v.Unsealed = r.Bool()
		case "legacy":
			v.Legacy = r.Bool()
		case "dtype":
			v.DType = string(r.Str())
		case "shape":
			v.Shape = readInts(&r)
		default:
			r.Skip()
		}
	}
	if !r.Done() {
		return false
	}
	*q = v
	return true
}

// AppendBody implements ipc.BodyAppender.
func (l Lease) AppendBody(b []byte) []byte {
	b = ipc.AppendMapHeader(b, count(6, l.Name != "", l.FD, len(l.Legacy) != 0, l.Sealed, l.DType != "", len(l.Shape) != 0, len(l.Event) != 0, len(l.Dropped) != 0))
	b = ipc.AppendUint(append(b, 0xa6, 'h', 'a', 'n', 'd', 'l', 'e'), l.Handle)
	if l.Name != "" {
		b = ipc.AppendString(append(b, 0xa4, 'n', 'a', 'm', 'e'), l.Name)
	}
	b = ipc.AppendUint(append(b, 0xa4, 's', 'l', 'a', 'b'), l.Slab)
	b = ipc.AppendInt(append(b, 0xa9, 's', 'l', 'a', 'b', '_', 's', 'i', 'z', 'e'), l.SlabSize)
	b = ipc.AppendUint(append(b, 0xa4, 'k', 'i', 'n', 'd'), uint64(l.Kind))
	b = ipc.AppendInt(append(b, 0xa6, 'o', 'f', 'f', 's', 'e', 't'), l.Offset)
	b = ipc.AppendInt(append(b, 0xa4, 's', 'i', 'z', 'e'), l.Size)
	if l.FD {
		b = append(b, 0xa2, 'f', 'd', 0xc3)
	}
	if len(l.Legacy) != 0 {
		b = ipc.AppendBin(append(b, 0xa6, 'l', 'e', 'g', 'a', 'c', 'y'), l.Legacy)
	}
	if l.Sealed {
		b = append(b, 0xa6, 's', 'e', 'a', 'l', 'e', 'd', 0xc3)
	}
	if l.DType != "" {
		b = ipc.AppendString(append(b, 0xa5, 'd', 't', 'y', 'p', 'e'), l.DType)
	}
	if len(l.Shape) != 0 {
		b = appendInts(append(b, 0xa5, 's', 'h', 'a', 'p', 'e'), l.Shape)
	}
	if len(l.Event) != 0 {
		b = ipc.AppendBin(append(b, 0xa5, 'e', 'v', 'e', 'n', 't'), l.Event)
	}
	if len(l.Dropped) != 0 {
		b = appendUints(append(b, 0xa7, 'd', 'r', 'o', 'p', 'p', 'e', 'd'), l.Dropped)
	}
	return b
}

// ParseBody implements ipc.BodyParser.
func (l *Lease) ParseBody(b []byte) bool {
	r := ipc.NewReader(b)
	v := *l
	n := r.MapLen()
	for i := 0; i < n && r.OK(); i++ {
		switch string(r.Str()) {
		case "handle":
			v.Handle = r.Uint(math.MaxUint64)
		case "name":
			v.Name = string(r.Str())
		case "slab":
			v.Slab = r.Uint(math.MaxUint64)
		case "slab_size":
			v.SlabSize = r.Int()
		case "kind":
			v.Kind = device.ShareKind(r.Uint(math.MaxUint8))
		case "offset":
			v.Offset = r.Int()
		case "size":
			v.Size = r.Int()
		case "fd":
			v.FD = r.Bool()
		case "legacy":
			v.Legacy = readBin(&r)
		case "sealed":
			v.Sealed = r.Bool()
		case "dtype":
			v.DType = string(r.Str())
		case "shape":
			v.Shape = readInts(&r)
		case "event":
			v.Event = readBin(&r)
		case "dropped":
			v.Dropped = readUints(&r)
		default:
			r.Skip()
		}
	}
	if !r.Done() {
		return false
	}
	*l = v
	return true
}

// AppendBody implements ipc.BodyAppender.
func (q FreeRequest) AppendBody(b []byte) []byte {
	b = ipc.AppendMapHeader(b, count(0, q.Handle != 0, q.Name != ""))
	if q.Handle != 0 {
		b = ipc.AppendUint(append(b, 0xa6, 'h', 'a', 'n', 'd', 'l', 'e'), q.Handle)
	}
	if q.Name != "" {
		b = ipc.AppendString(append(b, 0xa4, 'n', 'a', 'm', 'e'), q.Name)
	}
	return b
}

// ParseBody implements ipc.BodyParser.
func (q *FreeRequest) ParseBody(b []byte) bool {
	r := ipc.NewReader(b)
	v := *q
	n := r.MapLen()
	for i := 0; i < n && r.OK(); i++ {
		switch string(r.Str()) {
		case "handle":
			v.Handle = r.Uint(math.MaxUint64)
		case "name":
			v.Name = string(r.Str())
		default:
			r.Skip()
		}
	}
	if !r.Done() {
		return false
	}
	*q = v
	return true
}

// AppendBody implements ipc.BodyAppender.
func (f FreeReply) AppendBody(b []byte) []byte {
	if len(f.Dropped) == 0 {
		return append(b, 0x80)
	}
	return appendUints(append(b, 0x81, 0xa7, 'd', 'r', 'o', 'p', 'p', 'e', 'd'), f.Dropped)
}

// ParseBody implements ipc.BodyParser.
func (f *FreeReply) ParseBody(b []byte) bool {
	r := ipc.NewReader(b)
	v := *f
	n := r.MapLen()
	for i := 0; i < n && r.OK(); i++ {
		switch string(r.Str()) {
		case "dropped":
			v.Dropped = readUints(&r)
		default:
			r.Skip()
		}
	}
	if !r.Done() {
		return false
	}
	*f = v
	return true
}
