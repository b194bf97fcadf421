package service

import (
	"encoding/binary"
	"math"

	"gpukit/libgpu/ipc"
)

// Hand-written msgpack codecs of the step's bodies (ipc.BodyAppender,
// ipc.BodyParser), the one message a training step costs: AppendBody
// writes the bytes msgpack's reflection encoder writes
// (TestStepCodecsMatchReflection), ParseBody reads their common forms and
// leaves anything else to reflection (FuzzStepBodies checks that both
// readers agree). The service reads a step request with its own decoder
// (optimizer/internal/server's DecodeStep), which takes these bytes
// without allocating.

// AppendBody implements ipc.BodyAppender: {} or {lr: float32}.
func (q StepRequest) AppendBody(b []byte) []byte {
	if q.LR == 0 {
		return append(b, 0x80)
	}
	bits := math.Float32bits(q.LR)
	if q.LR != q.LR {
		// A signalling NaN goes out quiet, as reflection writes it (its
		// float32 passes through float64, which sets the quiet bit).
		bits |= 1 << 22
	}
	b = append(b, 0x81, 0xa2, 'l', 'r', 0xca)
	return binary.BigEndian.AppendUint32(b, bits)
}

// ParseBody implements ipc.BodyParser: the forms AppendBody writes.
func (q *StepRequest) ParseBody(b []byte) bool {
	switch {
	case len(b) == 1 && b[0] == 0x80:
		return true // as reflection, an absent key leaves the field alone
	case len(b) == 9 && b[0] == 0x81 && b[1] == 0xa2 && b[2] == 'l' && b[3] == 'r' && b[4] == 0xca:
		q.LR = math.Float32frombits(binary.BigEndian.Uint32(b[5:]))
		return true
	}
	return false
}

// AppendBody implements ipc.BodyAppender: {step: int}.
func (r StepReply) AppendBody(b []byte) []byte {
	return ipc.AppendInt(append(b, 0x81, 0xa4, 's', 't', 'e', 'p'), int64(r.Step))
}

// ParseBody implements ipc.BodyParser: a map whose "step" is an integer
// (other keys skipped).
func (r *StepReply) ParseBody(b []byte) bool {
	rd := ipc.NewReader(b)
	v := *r
	n := rd.MapLen()
	for i := 0; i < n && rd.OK(); i++ {
		switch string(rd.Str()) {
		case "step":
			s := rd.Int()
			if s < math.MinInt || s > math.MaxInt {
				return false
			}
			v.Step = int(s)
		default:
			rd.Skip()
		}
	}
	if !rd.Done() {
		return false
	}
	*r = v
	return true
}

var (
	_ ipc.BodyAppender = StepRequest{}
	_ ipc.BodyParser   = (*StepRequest)(nil)
	_ ipc.BodyAppender = StepReply{}
	_ ipc.BodyParser   = (*StepReply)(nil)
)
