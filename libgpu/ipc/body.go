package ipc

import (
	"encoding/binary"
	"math"
)

// BodyAppender is a body type with a hand-written msgpack encoder:
// MarshalBody calls AppendBody instead of msgpack's reflection. AppendBody
// appends exactly one msgpack value to b, the bytes msgpack's reflection
// encoder with compact integers writes for the same value (the pool's
// hot-path bodies; their tests compare the two).
type BodyAppender interface {
	AppendBody(b []byte) []byte
}

// BodyParser is a body type with a hand-written msgpack decoder:
// UnmarshalBody calls ParseBody with a body Validate accepted. ParseBody
// returns false for anything it leaves to msgpack's reflection (an unusual
// but valid encoding, or an invalid one), and then must not have changed
// the value; UnmarshalBody falls back to reflection.
type BodyParser interface {
	ParseBody(b []byte) bool
}

// AppendMapHeader appends the header of a msgpack map of n pairs.
func AppendMapHeader(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

// AppendArrayHeader appends the header of a msgpack array of n values.
func AppendArrayHeader(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

// AppendUint appends n in its smallest msgpack form.
func AppendUint(b []byte, n uint64) []byte { return appendUint(b, n) }

// AppendInt appends n in its smallest msgpack form (non-negative values as
// unsigned, as msgpack's compact encoder does).
func AppendInt(b []byte, n int64) []byte {
	switch {
	case n >= 0:
		return appendUint(b, uint64(n))
	case n >= -32:
		return append(b, byte(n))
	case n >= math.MinInt8:
		return append(b, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(n))
}

// AppendString appends s as a msgpack str.
func AppendString(b []byte, s string) []byte { return appendString(b, s) }

// AppendBool appends v as msgpack true or false.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// AppendBin appends p as msgpack bin (nil as msgpack nil, as reflection
// writes a nil []byte).
func AppendBin(b []byte, p []byte) []byte {
	switch n := len(p); {
	case p == nil:
		return append(b, 0xc0)
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, p...)
}

// Reader reads the common msgpack forms of a value Validate accepted, for
// hand-written body decoders (BodyParser). Its first failure (a form it
// does not read, a value out of range) makes OK false for good, and later
// reads return zero values.
type Reader struct{ r parser }

// NewReader reads b, which Validate accepted.
func NewReader(b []byte) Reader { return Reader{parser{b: b, ok: len(b) > 0}} }

// OK says whether every read so far succeeded.
func (r *Reader) OK() bool { return r.r.ok }

// Done says whether every read succeeded and b is read to its end.
func (r *Reader) Done() bool { return r.r.ok && r.r.p == len(r.r.b) }

// more fails the reader at the end of b (a decoder reading past the value's
// structure).
func (r *Reader) more() bool {
	if r.r.p >= len(r.r.b) {
		r.r.ok = false
	}
	return r.r.ok
}

// MapLen reads a map header (fixmap or map16) and returns its pair count.
func (r *Reader) MapLen() int {
	r.more()
	return r.r.mapLen()
}

// ArrayLen reads an array header (fixarray or array16).
func (r *Reader) ArrayLen() int {
	if !r.more() {
		return 0
	}
	c := r.r.b[r.r.p]
	switch {
	case c>>4 == 0x9:
		r.r.p++
		return int(c & 0x0f)
	case c == 0xdc:
		n := int(binary.BigEndian.Uint16(r.r.b[r.r.p+1:]))
		r.r.p += 3
		return n
	}
	r.r.ok = false
	return 0
}

// Str reads a str and returns its bytes (aliasing b).
func (r *Reader) Str() []byte {
	r.more()
	return r.r.str()
}

// Uint reads a non-negative integer of at most max.
func (r *Reader) Uint(max uint64) uint64 {
	r.more()
	return r.r.uint(max)
}

// Int reads an integer that fits int64.
func (r *Reader) Int() int64 {
	if !r.more() {
		return 0
	}
	b, p := r.r.b, r.r.p
	c := b[p]
	switch {
	case c >= 0xe0:
		r.r.p++
		return int64(int8(c))
	case c == 0xd0:
		r.r.p += 2
		return int64(int8(b[p+1]))
	case c == 0xd1:
		r.r.p += 3
		return int64(int16(binary.BigEndian.Uint16(b[p+1:])))
	case c == 0xd2:
		r.r.p += 5
		return int64(int32(binary.BigEndian.Uint32(b[p+1:])))
	case c == 0xd3:
		r.r.p += 9
		return int64(binary.BigEndian.Uint64(b[p+1:]))
	}
	return int64(r.r.uint(math.MaxInt64))
}

// Bool reads true or false.
func (r *Reader) Bool() bool {
	if !r.more() {
		return false
	}
	switch r.r.b[r.r.p] {
	case 0xc2:
		r.r.p++
		return false
	case 0xc3:
		r.r.p++
		return true
	}
	r.r.ok = false
	return false
}

// Bin reads a bin value and returns its bytes (aliasing b).
func (r *Reader) Bin() []byte {
	if !r.more() {
		return nil
	}
	b, p := r.r.b, r.r.p
	var n, h int
	switch b[p] {
	case 0xc4:
		n, h = int(b[p+1]), 2
	case 0xc5:
		n, h = int(binary.BigEndian.Uint16(b[p+1:])), 3
	case 0xc6:
		n, h = int(binary.BigEndian.Uint32(b[p+1:])), 5
	default:
		r.r.ok = false
		return nil
	}
	r.r.p += h + n
	return b[p+h : p+h+n]
}

// Skip reads past one value of any form.
func (r *Reader) Skip() {
	r.more()
	r.r.skip()
}
