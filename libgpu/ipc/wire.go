package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/trace"
)

// Version is the protocol version this package speaks. A peer that receives
// a message with another version answers with ErrVersion and closes the
// connection (PROTOCOL.md, "Versions").
const Version = 1

// Limits of one message (PROTOCOL.md, "Limits").
const (
	// MaxMessage is the largest encoded message in bytes (128 KiB). A
	// SOCK_SEQPACKET message must fit in the sender's socket buffer
	// (net.core.wmem_default is 208 KiB on stock Linux), so 1 MiB frames would
	// need a sysctl on every machine.
	MaxMessage = 128 << 10
	// MaxFDs is the most file descriptors one message may carry.
	MaxFDs = 8
	// MaxDepth is the deepest nesting of msgpack arrays and maps accepted.
	MaxDepth = 32
)

// Type says whether a message is a request or a reply.
type Type uint8

const (
	// TypeRequest asks the peer to run Op.
	TypeRequest Type = 1
	// TypeReply answers the request with the same ID.
	TypeReply Type = 2
)

// Message is one framed message. Body is the op's msgpack-encoded argument or
// result; Err is set on a failed reply (and then Body is empty).
type Message struct {
	Version uint16             `msgpack:"v"`
	Type    Type               `msgpack:"t"`
	ID      uint64             `msgpack:"id"`
	Op      string             `msgpack:"op"`
	Flow    uint64             `msgpack:"flow,omitempty"`
	Body    msgpack.RawMessage `msgpack:"body,omitempty"`
	Err     *WireError         `msgpack:"err,omitempty"`
	// NoReply (requests only) asks the server not to answer: it runs the
	// request and sends nothing back, whatever the outcome. A server that
	// predates the key ignores it and answers.
	NoReply bool `msgpack:"noreply,omitempty"`
}

// WireError is an error as it travels: Code names the sentinel (see
// RegisterError), Message is the full text of the error on the sender.
type WireError struct {
	Code    string `msgpack:"code"`
	Message string `msgpack:"message"`
}

// Encode returns the wire form of m. It fails with ErrTooLarge when the
// result exceeds MaxMessage bytes.
func Encode(m *Message) ([]byte, error) { return appendEncode(nil, m) }

// appendEncode appends the wire form of m to b.
func appendEncode(b []byte, m *Message) ([]byte, error) {
	start := len(b)
	b = appendMessage(b, m)
	if n := len(b) - start; n > MaxMessage {
		return nil, fmt.Errorf("%w: %s message of %d bytes", ErrTooLarge, m.Op, n)
	}
	return b, nil
}

// Decode parses one frame. Errors wrap ErrTooLarge, ErrMalformed or
// ErrVersion; with ErrVersion the decoded message is returned too, so the
// receiver can answer its ID. Unknown envelope fields are ignored. The
// message does not alias b.
func Decode(b []byte) (*Message, error) {
	if len(b) > MaxMessage {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(b))
	}
	if bytes.HasPrefix(b, []byte(trace.Magic)) {
		return nil, fmt.Errorf("%w: the peer speaks the gpukit trace protocol (this is a tracer collector's socket)", ErrMalformed)
	}
	if err := Validate(b); err != nil {
		return nil, err
	}
	if len(b) == 0 || !isMap(b[0]) {
		return nil, fmt.Errorf("%w: envelope is not a map", ErrMalformed)
	}
	var m Message
	if parseMessage(b, &m) {
		m.Body = bytes.Clone(m.Body) // the message must not alias b
	} else {
		// An unusual encoding: integers msgpack's decoder would wrap
		// around (a negative id read as 2^64-5), and an op that is not a
		// str (msgpack's decoder reads bin into a string), are refused
		// first.
		if err := checkEnvelope(b); err != nil {
			return nil, err
		}
		m = Message{}
		if err := msgpack.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
	}
	if !utf8.ValidString(m.Op) {
		return nil, fmt.Errorf("%w: op is not UTF-8", ErrMalformed)
	}
	if m.Version != Version {
		return &m, fmt.Errorf("%w: peer speaks %d, this side %d", ErrVersion, m.Version, Version)
	}
	if m.Type != TypeRequest && m.Type != TypeReply {
		return nil, fmt.Errorf("%w: message type %d", ErrMalformed, m.Type)
	}
	if m.Op == "" {
		return nil, fmt.Errorf("%w: empty op", ErrMalformed)
	}
	if m.Type == TypeRequest && m.ID == 0 {
		return nil, fmt.Errorf("%w: request id 0 (ids start at 1; 0 is the server's, for frames it could not read)", ErrMalformed)
	}
	return &m, nil
}

// checkEnvelope checks that the envelope's integer fields (v, t, id,
// flow), where present and not nil, are msgpack integers of any width that
// are not negative, and that op is a msgpack str. b is a map that Validate
// accepted.
func checkEnvelope(b []byte) error {
	r := NewReader(b)
	c := b[0]
	n := 0
	switch {
	case c>>4 == 0x8:
		n, r.r.p = int(c&0x0f), 1
	case c == 0xde:
		n, r.r.p = int(binary.BigEndian.Uint16(b[1:])), 3
	case c == 0xdf:
		n, r.r.p = int(binary.BigEndian.Uint32(b[1:])), 5
	}
	for i := 0; i < n && r.r.p < len(b); i++ {
		var key string
		if k := b[r.r.p]; k>>5 == 0x5 || k == 0xd9 || k == 0xda || k == 0xdb {
			key = string(r.Str())
		} else {
			r.Skip()
		}
		if !r.r.ok || r.r.p >= len(b) {
			return nil // msgpack's decoder says what is wrong
		}
		v := b[r.r.p]
		switch key {
		case "v", "t", "id", "flow":
		case "op":
			if !(v>>5 == 0x5 || v == 0xd9 || v == 0xda || v == 0xdb || v == 0xc0) {
				return fmt.Errorf("%w: op is not a str (msgpack type byte 0x%02x)", ErrMalformed, v)
			}
			r.Skip()
			continue
		default:
			r.Skip()
			continue
		}
		switch {
		case v <= 0x7f, v >= 0xcc && v <= 0xcf, v == 0xc0:
		case v >= 0xe0:
			return fmt.Errorf("%w: %s is negative (%d)", ErrMalformed, key, int8(v))
		case v >= 0xd0 && v <= 0xd3:
			if b[r.r.p+1]&0x80 != 0 {
				return fmt.Errorf("%w: %s is negative", ErrMalformed, key)
			}
		default:
			return fmt.Errorf("%w: %s is not an integer (msgpack type byte 0x%02x)", ErrMalformed, key, v)
		}
		r.Skip()
	}
	return nil
}

// UnmarshalBody decodes a message body into v. An empty body leaves v
// untouched. Errors wrap ErrMalformed.
func UnmarshalBody(body msgpack.RawMessage, v any) error {
	if len(body) == 0 || v == nil {
		return nil
	}
	if err := Validate(body); err != nil {
		return err
	}
	if p, ok := v.(BodyParser); ok && p.ParseBody(body) {
		return nil
	}
	if err := msgpack.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: body: %v", ErrMalformed, err)
	}
	return nil
}

// MarshalBody encodes v as a message body (nil gives an empty body).
func MarshalBody(v any) (msgpack.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	if a, ok := v.(BodyAppender); ok {
		return a.AppendBody(make([]byte, 0, 64)), nil
	}
	e := bodyEncoders.Get().(*bodyEncoder)
	defer bodyEncoders.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return nil, fmt.Errorf("ipc: encode body: %w", err)
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// bodyEncoder is a msgpack encoder with compact integers and its buffer,
// kept for reuse in bodyEncoders.
type bodyEncoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

var bodyEncoders = sync.Pool{New: func() any {
	e := &bodyEncoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.UseCompactInts(true)
	return e
}}

func isMap(c byte) bool { return c>>4 == 0x8 || c == 0xde || c == 0xdf }

var errShort = errors.New("truncated")

// Validate checks that b is exactly one well-formed msgpack value, nested at
// most MaxDepth deep, whose declared lengths fit in b. It walks b without
// recursion or allocation proportional to declared sizes, so a hostile frame
// cannot exhaust the stack or memory of the decoder behind it. Errors wrap
// ErrMalformed.
func Validate(b []byte) error {
	p, err := skip(b, 0)
	if err != nil {
		return err
	}
	if p != len(b) {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(b)-p)
	}
	return nil
}

// skip walks the one msgpack value at b[p:] as Validate does and returns
// the offset just past it.
func skip(b []byte, p int) (int, error) {
	var stack [MaxDepth + 1]int // remaining values per open container
	depth := 0
	stack[0] = 1
	for {
		for depth > 0 && stack[depth] == 0 {
			depth--
		}
		if stack[depth] == 0 {
			break
		}
		stack[depth]--
		if p >= len(b) {
			return 0, fmt.Errorf("%w: %v at byte %d", ErrMalformed, errShort, p)
		}
		c := b[p]
		p++
		var skip, n int // bytes to skip; children to read
		var lenBytes int
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c>>4 == 0x8:
			n = 2 * int(c&0x0f)
		case c>>4 == 0x9:
			n = int(c & 0x0f)
		case c>>5 == 0x5:
			skip = int(c & 0x1f)
		case c == 0xc1:
			return 0, fmt.Errorf("%w: reserved byte 0xc1 at %d", ErrMalformed, p-1)
		case c == 0xc4, c == 0xd9:
			lenBytes = 1
		case c == 0xc5, c == 0xda:
			lenBytes = 2
		case c == 0xc6, c == 0xdb:
			lenBytes = 4
		case c == 0xc7, c == 0xc8, c == 0xc9:
			lenBytes = 1 << (c - 0xc7)
		case c == 0xca:
			skip = 4
		case c == 0xcb:
			skip = 8
		case c >= 0xcc && c <= 0xcf:
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3:
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8:
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc, c == 0xde:
			lenBytes = 2
		case c == 0xdd, c == 0xdf:
			lenBytes = 4
		}
		if lenBytes > 0 {
			if p+lenBytes > len(b) {
				return 0, fmt.Errorf("%w: %v length at byte %d", ErrMalformed, errShort, p)
			}
			l := 0
			for i := 0; i < lenBytes; i++ {
				l = l<<8 | int(b[p+i])
			}
			p += lenBytes
			switch {
			case c >= 0xc7 && c <= 0xc9: // ext: type byte then data
				skip = 1 + l
			case c == 0xdc || c == 0xdd:
				n = l
			case c == 0xde || c == 0xdf:
				n = 2 * l
			default:
				skip = l
			}
		}
		if skip > len(b)-p {
			return 0, fmt.Errorf("%w: %v: %d bytes declared at byte %d, %d left", ErrMalformed, errShort, skip, p, len(b)-p)
		}
		p += skip
		if n > 0 {
			// Every child takes at least one byte.
			if n > len(b)-p {
				return 0, fmt.Errorf("%w: %v: %d values declared at byte %d, %d bytes left", ErrMalformed, errShort, n, p, len(b)-p)
			}
			if depth == MaxDepth {
				return 0, fmt.Errorf("%w: nested deeper than %d", ErrMalformed, MaxDepth)
			}
			depth++
			stack[depth] = n
		}
	}
	return p, nil
}
