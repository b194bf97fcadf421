package service

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/ipc/ipctest"
)

// same compares step bodies (NaN learning rates are the same; −0 is 0, as
// omitempty leaves it out).
func same(a, b any) bool {
	switch a := a.(type) {
	case StepRequest:
		x, y := a.LR, b.(StepRequest).LR
		return x == y || x != x && y != y
	case StepReply:
		return a == b.(StepReply)
	}
	return false
}

// TestStepCodecsMatchReflection: the hand-written encoders write exactly
// what reflection writes, and both decoders read it back to the same value,
// for learning rates and step counts of every form and integer width.
func TestStepCodecsMatchReflection(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	lrs := []float32{0, 1e-3, 0.5, -1, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, math.SmallestNonzeroFloat32, float32(math.Copysign(0, -1)),
		math.Float32frombits(0x7f94beb2), math.Float32frombits(0xffa2e227), math.Float32frombits(0x7f800001)} // signalling NaNs
	steps := []int{0, -1, 1, 127, 128, 255, 256, -32, -33, -128, -129, 65535, 65536, math.MaxInt32, math.MinInt32, math.MaxInt64, math.MinInt64}
	for range 200 {
		lrs = append(lrs, math.Float32frombits(r.Uint32()))
		steps = append(steps, int(r.Uint64()>>r.IntN(64)), -int(r.Uint64()>>(1+r.IntN(63))))
	}
	var vals []any
	for _, lr := range lrs {
		vals = append(vals, StepRequest{LR: lr})
	}
	for _, s := range steps {
		vals = append(vals, StepReply{Step: s})
	}
	for _, v := range vals {
		want := ipctest.ReflectEncode(t, v)
		got := v.(ipc.BodyAppender).AppendBody(nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("%T %+v:\nhand       %x\nreflection %x", v, v, got, want)
		}
		var back, refl any
		switch v.(type) {
		case StepRequest:
			var h, f StepRequest
			if !h.ParseBody(got) {
				t.Fatalf("%T: ParseBody refused its own encoding %x", v, got)
			}
			if err := msgpack.Unmarshal(got, &f); err != nil {
				t.Fatal(err)
			}
			back, refl = h, f
		case StepReply:
			var h, f StepReply
			if !h.ParseBody(got) {
				t.Fatalf("%T: ParseBody refused its own encoding %x", v, got)
			}
			if err := msgpack.Unmarshal(got, &f); err != nil {
				t.Fatal(err)
			}
			back, refl = h, f
		}
		if !same(back, v) || !same(refl, v) {
			t.Fatalf("%T: wrote %+v, read back %+v by hand and %+v by reflection", v, v, back, refl)
		}
	}
}

// TestStepReplyParseBody: other encodings of a reply that reflection reads
// (wider integers, other keys, an empty map) are read alike by hand, and
// what ParseBody refuses (a float step, a step beyond int64, not a map,
// truncated) leaves the value alone.
func TestStepReplyParseBody(t *testing.T) {
	read := map[string]int{
		"81a473746570d3ffffffffffffffff":   -1,
		"81a473746570cf0000000000000007":   7,
		"82a178c0a473746570cd0100":         256,
		"80":                               5, // keeps what was there
		"82a473746570d1ff00a473746570cc09": 9, // the last key wins, as in reflection
		"81a4737465700a":                   10,
		"83a1619101a16280a473746570e0":     -32,
	}
	for hx, want := range read {
		b := unhex(t, hx)
		h := StepReply{Step: 5}
		if !h.ParseBody(b) {
			t.Fatalf("%s: refused", hx)
		}
		f := StepReply{Step: 5}
		if err := msgpack.Unmarshal(b, &f); err != nil {
			t.Fatal(err)
		}
		if h.Step != want || f.Step != want {
			t.Fatalf("%s: hand %d, reflection %d, want %d", hx, h.Step, f.Step, want)
		}
	}
	for _, hx := range []string{"81a473746570ca3f800000", "81a473746570cf8000000000000000", "91a473746570", "81a473746570", "81a47374657001ff"} {
		h := StepReply{Step: 5}
		if h.ParseBody(unhex(t, hx)) || h.Step != 5 {
			t.Fatalf("%s: ParseBody took it (step %d)", hx, h.Step)
		}
	}
	// Refused by hand, a body goes to reflection, which refuses a float
	// step too: the reply is malformed, never read as 0.
	r := StepReply{Step: 5}
	if err := ipc.UnmarshalBody(unhex(t, "81a473746570ca40400000"), &r); !errors.Is(err, ipc.ErrMalformed) {
		t.Fatalf("a float step through UnmarshalBody: step %d, %v; want ErrMalformed", r.Step, err)
	}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b := make([]byte, len(s)/2)
	for i := range b {
		var c byte
		for _, d := range s[2*i : 2*i+2] {
			c <<= 4
			switch {
			case d >= '0' && d <= '9':
				c |= byte(d - '0')
			case d >= 'a' && d <= 'f':
				c |= byte(d - 'a' + 10)
			default:
				t.Fatalf("bad hex %q", s)
			}
		}
		b[i] = c
	}
	return b
}

// FuzzStepBodies: on any valid msgpack value, a ParseBody that accepts it
// reads what reflection reads, and one that refuses it leaves the value
// alone.
func FuzzStepBodies(f *testing.F) {
	for _, v := range []any{StepRequest{}, StepRequest{LR: 0.1}, StepReply{Step: -1}, StepReply{Step: 1 << 40}} {
		f.Add(ipctest.ReflectEncode(f, v))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if ipc.Validate(b) != nil {
			return
		}
		q := StepRequest{LR: 42}
		if q.ParseBody(b) {
			f := StepRequest{LR: 42}
			if err := msgpack.Unmarshal(b, &f); err != nil || !same(q, f) {
				t.Fatalf("%x: request by hand %+v, by reflection %+v (%v)", b, q, f, err)
			}
		} else if q.LR != 42 {
			t.Fatalf("%x: refused request changed to %+v", b, q)
		}
		r := StepReply{Step: 42}
		if r.ParseBody(b) {
			f := StepReply{Step: 42}
			if err := msgpack.Unmarshal(b, &f); err != nil || r != f {
				t.Fatalf("%x: reply by hand %+v, by reflection %+v (%v)", b, r, f, err)
			}
		} else if r.Step != 42 {
			t.Fatalf("%x: refused reply changed to %+v", b, r)
		}
	})
}
