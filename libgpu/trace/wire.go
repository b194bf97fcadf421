package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Kind is the type of one wire record (see doc.go, "Wire format").
type Kind uint8

// Record kinds.
const (
	KindSpan     Kind = 1 // a complete span: Start and Dur
	KindInstant  Kind = 2 // a point in time
	KindCounter  Kind = 3 // a counter sample: Name = Value
	KindTrack    Kind = 4 // names track Track of the sending process
	KindProcess  Kind = 5 // names the sending process
	maxKind           = KindProcess
	recordHeader      = 1 + 4 + 8 // kind, track, ts
)

// Flow directions of a span (Record.FlowDir).
const (
	FlowNone uint8 = 0
	FlowOut  uint8 = 1 // the span sends message Flow (Chrome "s")
	FlowIn   uint8 = 2 // the span handles message Flow (Chrome "f")
)

// Limits of the wire format.
const (
	// MaxArgs is the most arguments one span or instant carries; more are
	// ignored by Span.Arg.
	MaxArgs = 4
	// MaxString is the longest string sent, in bytes; longer ones are cut.
	MaxString = 512
	// MaxBatch is the largest datagram a client sends, in bytes. It fits
	// the default socket buffer of a SOCK_SEQPACKET socket (net.core.wmem_default
	// is 208 KiB on stock Linux).
	MaxBatch = 64 << 10
	// batchHeader is magic, pid, dropped, count.
	batchHeader = 4 + 4 + 4 + 2
)

// Magic starts every batch.
const Magic = "GKT1"

// Arg types on the wire.
const (
	argInt   uint8 = 1
	argStr   uint8 = 2
	argFloat uint8 = 3
)

// ErrMalformed is a batch that does not decode; the collector counts and drops it.
var ErrMalformed = errors.New("trace: malformed batch")

// Arg is one argument of a span or instant (Chrome "args"): make one with
// Int, Str or Float.
type Arg struct {
	Key   string
	Str   string
	Int   int64
	Float float64
	Type  uint8 // 1 int, 2 string, 3 float
}

// Int is an integer argument.
func Int(key string, v int64) Arg { return Arg{Key: key, Int: v, Type: argInt} }

// Str is a string argument.
func Str(key, v string) Arg { return Arg{Key: key, Str: v, Type: argStr} }

// Float is a floating-point argument. NaN and ±Inf, which JSON cannot
// carry, become the strings "NaN", "+Inf" and "-Inf".
func Float(key string, v float64) Arg {
	switch {
	case math.IsNaN(v):
		return Str(key, "NaN")
	case math.IsInf(v, 1):
		return Str(key, "+Inf")
	case math.IsInf(v, -1):
		return Str(key, "-Inf")
	}
	return Arg{Key: key, Float: v, Type: argFloat}
}

// Value returns the argument's value as int64, string or float64.
func (a Arg) Value() any {
	switch a.Type {
	case argInt:
		return a.Int
	case argFloat:
		return a.Float
	}
	return a.Str
}

// Record is one decoded event. Times are nanoseconds of CLOCK_MONOTONIC, the
// clock every process on a host shares.
type Record struct {
	Kind    Kind
	Track   uint32 // 0 is the process's main track
	Start   int64  // ns, CLOCK_MONOTONIC
	Dur     int64  // ns; spans only, >= 0
	Cat     string // spans and instants
	Name    string // span, instant, counter, track or process name
	FlowDir uint8  // spans: FlowNone, FlowOut or FlowIn
	Flow    uint64 // spans with FlowDir != FlowNone: the flow id (non-zero)
	Value   float64
	NArgs   uint8
	Args    [MaxArgs]Arg
}

// Batch is one decoded datagram.
type Batch struct {
	PID     uint32
	Dropped uint32 // the sender's count of dropped events so far (saturates)
	Records []Record
}

func cut(s string) string {
	if len(s) > MaxString {
		return s[:MaxString]
	}
	return s
}

func appendStr(b []byte, s string) []byte {
	s = cut(s)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// recordSize is an upper bound of r's encoded size.
func recordSize(r *Record) int {
	n := recordHeader + 8 + 2 + len(r.Cat) + 2 + len(r.Name) + 1 + 8 + 8 + 1
	for i := 0; i < int(r.NArgs); i++ {
		n += 2 + len(r.Args[i].Key) + 1 + 8 + 2 + len(r.Args[i].Str)
	}
	return n
}

// AppendRecord appends the wire form of r to b. Strings longer than
// MaxString are cut; at most MaxArgs arguments are written.
func AppendRecord(b []byte, r *Record) []byte {
	b = append(b, byte(r.Kind))
	b = binary.LittleEndian.AppendUint32(b, r.Track)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Start))
	switch r.Kind {
	case KindSpan:
		b = binary.LittleEndian.AppendUint64(b, uint64(r.Dur))
		fallthrough
	case KindInstant:
		b = appendStr(b, r.Cat)
		b = appendStr(b, r.Name)
		if r.Kind == KindSpan {
			b = append(b, r.FlowDir)
			if r.FlowDir != FlowNone {
				b = binary.LittleEndian.AppendUint64(b, r.Flow)
			}
		}
		n := min(int(r.NArgs), MaxArgs)
		b = append(b, byte(n))
		for i := 0; i < n; i++ {
			a := &r.Args[i]
			b = appendStr(b, a.Key)
			b = append(b, a.Type)
			switch a.Type {
			case argInt:
				b = binary.LittleEndian.AppendUint64(b, uint64(a.Int))
			case argFloat:
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(a.Float))
			default:
				b = appendStr(b, a.Str)
			}
		}
	case KindCounter:
		b = appendStr(b, r.Name)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.Value))
	default: // KindTrack, KindProcess
		b = appendStr(b, r.Name)
	}
	return b
}

// AppendBatchHeader starts a batch of n records from pid.
func AppendBatchHeader(b []byte, pid, dropped uint32, n uint16) []byte {
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint32(b, pid)
	b = binary.LittleEndian.AppendUint32(b, dropped)
	return binary.LittleEndian.AppendUint16(b, n)
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = fmt.Errorf("%w: truncated", ErrMalformed)
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *reader) str() string {
	p := r.take(2)
	if p == nil {
		return ""
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n > MaxString {
		r.err = fmt.Errorf("%w: string of %d bytes", ErrMalformed, n)
		return ""
	}
	return string(r.take(n))
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, a...)...)
	}
}

// DecodeBatch parses one datagram. It is strict: a wrong magic, an unknown
// kind, a negative duration or timestamp, a flow without id, an unknown
// argument type, more than MaxArgs arguments, an over-long string, a
// truncated record or trailing bytes give an error wrapping ErrMalformed, and
// the whole batch is refused.
func DecodeBatch(b []byte) (Batch, error) {
	if len(b) > MaxBatch {
		return Batch{}, fmt.Errorf("%w: %d bytes > %d", ErrMalformed, len(b), MaxBatch)
	}
	r := reader{b: b}
	if string(r.take(4)) != Magic {
		return Batch{}, fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	var bt Batch
	bt.PID = r.u32()
	bt.Dropped = r.u32()
	p := r.take(2)
	if r.err != nil {
		return Batch{}, r.err
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n*recordHeader > len(r.b) {
		return Batch{}, fmt.Errorf("%w: %d records in %d bytes", ErrMalformed, n, len(r.b))
	}
	bt.Records = make([]Record, n)
	for i := range bt.Records {
		decodeRecord(&r, &bt.Records[i])
		if r.err != nil {
			return Batch{}, fmt.Errorf("record %d: %w", i, r.err)
		}
	}
	if len(r.b) != 0 {
		return Batch{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(r.b))
	}
	return bt, nil
}

func decodeRecord(r *reader, rec *Record) {
	rec.Kind = Kind(r.u8())
	rec.Track = r.u32()
	rec.Start = int64(r.u64())
	if r.err != nil {
		return
	}
	if rec.Kind == 0 || rec.Kind > maxKind {
		r.fail("unknown kind %d", rec.Kind)
		return
	}
	if rec.Start < 0 {
		r.fail("negative timestamp")
		return
	}
	switch rec.Kind {
	case KindSpan:
		rec.Dur = int64(r.u64())
		if rec.Dur < 0 {
			r.fail("negative duration")
			return
		}
		fallthrough
	case KindInstant:
		rec.Cat = r.str()
		rec.Name = r.str()
		if rec.Kind == KindSpan {
			rec.FlowDir = r.u8()
			switch rec.FlowDir {
			case FlowNone:
			case FlowOut, FlowIn:
				if rec.Flow = r.u64(); rec.Flow == 0 && r.err == nil {
					r.fail("flow id 0")
				}
			default:
				r.fail("flow direction %d", rec.FlowDir)
			}
		}
		rec.NArgs = r.u8()
		if rec.NArgs > MaxArgs {
			r.fail("%d args", rec.NArgs)
			return
		}
		for i := 0; i < int(rec.NArgs) && r.err == nil; i++ {
			a := &rec.Args[i]
			a.Key = r.str()
			a.Type = r.u8()
			switch a.Type {
			case argInt:
				a.Int = int64(r.u64())
			case argFloat:
				a.Float = math.Float64frombits(r.u64())
				if math.IsNaN(a.Float) || math.IsInf(a.Float, 0) {
					r.fail("non-finite arg")
				}
			case argStr:
				a.Str = r.str()
			default:
				r.fail("arg type %d", a.Type)
			}
		}
	case KindCounter:
		rec.Name = r.str()
		rec.Value = math.Float64frombits(r.u64())
		if math.IsNaN(rec.Value) || math.IsInf(rec.Value, 0) {
			r.fail("non-finite counter")
		}
	default:
		rec.Name = r.str()
	}
	if r.err == nil && rec.Name == "" {
		r.fail("empty name")
	}
}
