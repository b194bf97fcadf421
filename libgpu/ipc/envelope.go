package ipc

import (
	"encoding/binary"
	"math"
)

// The envelope's hand-written codec: appendMessage writes exactly the bytes
// msgpack's reflection encoder writes for a Message with compact integers
// (TestEnvelopeMatchesReflection), and parseMessage reads the common form of
// a frame without reflection, leaving anything unusual to msgpack
// (FuzzDecode checks that both readers agree).

func appendUint(b []byte, n uint64) []byte {
	switch {
	case n <= 0x7f:
		return append(b, byte(n))
	case n <= math.MaxUint8:
		return append(b, 0xcc, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(n))
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), n)
}

func appendString(b []byte, s string) []byte {
	switch n := len(s); {
	case n <= 31:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// appendMessage appends the wire form of m to b.
func appendMessage(b []byte, m *Message) []byte {
	n := 4
	if m.Flow != 0 {
		n++
	}
	if len(m.Body) != 0 {
		n++
	}
	if m.Err != nil {
		n++
	}
	if m.NoReply {
		n++
	}
	b = append(b, 0x80|byte(n))
	b = appendUint(append(b, 0xa1, 'v'), uint64(m.Version))
	b = appendUint(append(b, 0xa1, 't'), uint64(m.Type))
	b = appendUint(append(b, 0xa2, 'i', 'd'), m.ID)
	b = appendString(append(b, 0xa2, 'o', 'p'), m.Op)
	if m.Flow != 0 {
		b = appendUint(append(b, 0xa4, 'f', 'l', 'o', 'w'), m.Flow)
	}
	if len(m.Body) != 0 {
		b = append(append(b, 0xa4, 'b', 'o', 'd', 'y'), m.Body...)
	}
	if m.Err != nil {
		b = append(b, 0xa3, 'e', 'r', 'r', 0x82)
		b = appendString(append(b, 0xa4, 'c', 'o', 'd', 'e'), m.Err.Code)
		b = appendString(append(b, 0xa7, 'm', 'e', 's', 's', 'a', 'g', 'e'), m.Err.Message)
	}
	if m.NoReply {
		b = append(b, 0xa7, 'n', 'o', 'r', 'e', 'p', 'l', 'y', 0xc3)
	}
	return b
}

// parser reads a frame that Validate accepted; ok turns false at the
// first thing it leaves to msgpack.
type parser struct {
	b  []byte
	p  int
	ok bool
}

func (r *parser) mapLen() int {
	if !r.ok {
		return 0
	}
	c := r.b[r.p]
	switch {
	case c>>4 == 0x8:
		r.p++
		return int(c & 0x0f)
	case c == 0xde:
		n := int(binary.BigEndian.Uint16(r.b[r.p+1:]))
		r.p += 3
		return n
	}
	r.ok = false // map32 frames do not fit MaxMessage anyway
	return 0
}

// str returns the bytes of a str value (aliasing the frame).
func (r *parser) str() []byte {
	if !r.ok {
		return nil
	}
	c := r.b[r.p]
	var n, h int
	switch {
	case c>>5 == 0x5:
		n, h = int(c&0x1f), 1
	case c == 0xd9:
		n, h = int(r.b[r.p+1]), 2
	case c == 0xda:
		n, h = int(binary.BigEndian.Uint16(r.b[r.p+1:])), 3
	case c == 0xdb:
		n, h = int(binary.BigEndian.Uint32(r.b[r.p+1:])), 5
	default:
		r.ok = false
		return nil
	}
	s := r.b[r.p+h : r.p+h+n]
	r.p += h + n
	return s
}

// uint reads a non-negative integer of at most max.
func (r *parser) uint(max uint64) uint64 {
	if !r.ok {
		return 0
	}
	c := r.b[r.p]
	var n uint64
	switch {
	case c <= 0x7f:
		n, r.p = uint64(c), r.p+1
	case c == 0xcc:
		n, r.p = uint64(r.b[r.p+1]), r.p+2
	case c == 0xcd:
		n, r.p = uint64(binary.BigEndian.Uint16(r.b[r.p+1:])), r.p+3
	case c == 0xce:
		n, r.p = uint64(binary.BigEndian.Uint32(r.b[r.p+1:])), r.p+5
	case c == 0xcf:
		n, r.p = binary.BigEndian.Uint64(r.b[r.p+1:]), r.p+9
	default:
		r.ok = false
		return 0
	}
	if n > max {
		r.ok = false
	}
	return n
}

// value returns the bytes of any value but nil (aliasing the frame).
func (r *parser) value() []byte {
	if !r.ok {
		return nil
	}
	if r.b[r.p] == 0xc0 {
		r.ok = false
		return nil
	}
	start := r.p
	r.skip()
	return r.b[start:r.p]
}

func (r *parser) skip() {
	if !r.ok {
		return
	}
	end, err := skip(r.b, r.p)
	if err != nil {
		r.ok = false
		return
	}
	r.p = end
}

// parseMessage reads frame b (which Validate accepted) into m; false means
// it left the frame to msgpack. m.Body aliases b.
func parseMessage(b []byte, m *Message) bool {
	r := parser{b: b, ok: len(b) > 0}
	n := r.mapLen()
	for i := 0; i < n && r.ok; i++ {
		switch string(r.str()) {
		case "v":
			m.Version = uint16(r.uint(math.MaxUint16))
		case "t":
			m.Type = Type(r.uint(math.MaxUint8))
		case "id":
			m.ID = r.uint(math.MaxUint64)
		case "op":
			m.Op = string(r.str())
		case "flow":
			m.Flow = r.uint(math.MaxUint64)
		case "body":
			m.Body = r.value()
		case "err":
			if m.Err == nil {
				m.Err = &WireError{}
			}
			k := r.mapLen()
			for j := 0; j < k && r.ok; j++ {
				switch string(r.str()) {
				case "code":
					m.Err.Code = string(r.str())
				case "message":
					m.Err.Message = string(r.str())
				default:
					r.skip()
				}
			}
		case "noreply":
			switch r.b[r.p] {
			case 0xc2, 0xc3:
				m.NoReply = r.b[r.p] == 0xc3
				r.p++
			default:
				r.ok = false
			}
		default:
			r.skip()
		}
	}
	return r.ok && r.p == len(b)
}
