package ipc

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func mustEncode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, uint64(rand.Int64())))
	for i := 0; i < 200; i++ {
		body := map[string]any{"name": "w", "size": r.Int64N(1 << 40)}
		raw, _ := MarshalBody(body)
		m := &Message{Version: Version, Type: Type(1 + r.IntN(2)), ID: r.Uint64(), Op: "alloc", Flow: r.Uint64(), Body: raw}
		if r.IntN(3) == 0 {
			m.Body, m.Err = nil, &WireError{Code: "pool.no_such_name", Message: "pool: no such name: w"}
		}
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != m.ID || got.Flow != m.Flow || got.Type != m.Type || got.Op != m.Op ||
			!bytes.Equal(got.Body, m.Body) || (m.Err == nil) != (got.Err == nil) ||
			(m.Err != nil && *m.Err != *got.Err) {
			t.Fatalf("round trip: sent %+v got %+v", m, got)
		}
	}
}

func TestDecodeIgnoresUnknownFields(t *testing.T) {
	b := mustEncode(t, map[string]any{"v": Version, "t": 1, "id": 7, "op": "ls", "future": []int{1, 2, 3}, "x": map[string]int{"a": 1}})
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != 7 || m.Op != "ls" {
		t.Fatalf("got %+v", m)
	}
}

func TestDecodeRejects(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, 100000)
	deep = append(deep, 0x01)
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"empty":         {nil, ErrMalformed},
		"not a map":     {mustEncode(t, []int{1, 2}), ErrMalformed},
		"truncated":     {mustEncode(t, map[string]any{"v": 1, "t": 1, "id": 1, "op": "hello"})[:9], ErrMalformed},
		"trailing":      {append(mustEncode(t, map[string]any{"v": 1, "t": 1, "id": 1, "op": "x"}), 0), ErrMalformed},
		"huge array":    {[]byte{0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff, 1, 2}, ErrMalformed},
		"huge str":      {[]byte{0x81, 0xa1, 'x', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'}, ErrMalformed},
		"deep":          {append([]byte{0x81, 0xa1, 'x'}, deep...), ErrMalformed},
		"reserved c1":   {[]byte{0x81, 0xa1, 'x', 0xc1}, ErrMalformed},
		"bad version":   {mustEncode(t, map[string]any{"v": 99, "t": 1, "id": 1, "op": "hello"}), ErrVersion},
		"bad type":      {mustEncode(t, map[string]any{"v": Version, "t": 9, "id": 1, "op": "hello"}), ErrMalformed},
		"no op":         {mustEncode(t, map[string]any{"v": Version, "t": 1, "id": 1}), ErrMalformed},
		"op wrong type": {mustEncode(t, map[string]any{"v": Version, "t": 1, "id": 1, "op": 5}), ErrMalformed},
		"too large":     {make([]byte, MaxMessage+1), ErrTooLarge},
	}
	for name, c := range cases {
		_, err := Decode(c.b)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
}

func TestEncodeTooLarge(t *testing.T) {
	body, _ := MarshalBody(string(make([]byte, MaxMessage)))
	if _, err := Encode(&Message{Version: Version, Type: TypeRequest, ID: 1, Op: "x", Body: body}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v", err)
	}
}

// TestValidateAgreesWithMsgpack checks the validator accepts what msgpack
// writes, for random nested values.
func TestValidateAgreesWithMsgpack(t *testing.T) {
	r := rand.New(rand.NewPCG(2, uint64(rand.Int64())))
	var gen func(d int) any
	gen = func(d int) any {
		switch k := r.IntN(9); {
		case d > 4 || k == 0:
			return r.Int64() >> r.IntN(64)
		case k == 1:
			return r.Float64()
		case k == 2:
			return string(make([]byte, r.IntN(70000)>>r.IntN(16)))
		case k == 3:
			return make([]byte, r.IntN(300))
		case k == 4:
			return nil
		case k == 5:
			return r.IntN(2) == 0
		case k == 6:
			m := map[string]any{}
			for i := r.IntN(20); i > 0; i-- {
				m[string(rune('a'+i))] = gen(d + 1)
			}
			return m
		default:
			a := make([]any, r.IntN(20))
			for i := range a {
				a[i] = gen(d + 1)
			}
			return a
		}
	}
	for i := 0; i < 300; i++ {
		v := gen(0)
		b := mustEncode(t, v)
		if err := Validate(b); err != nil {
			t.Fatalf("valid msgpack rejected: %v", err)
		}
		if len(b) > 1 {
			if err := Validate(b[:len(b)-1]); err == nil {
				t.Fatalf("truncated msgpack accepted")
			}
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, m := range []*Message{
		{Version: Version, Type: TypeRequest, ID: 1, Op: "hello"},
		{Version: Version, Type: TypeReply, ID: 2, Op: "alloc", Flow: 9, Body: mustEncode(f, map[string]any{"slab": 1, "offset": 256, "size": 1000})},
		{Version: Version, Type: TypeReply, ID: 3, Op: "open", Err: &WireError{Code: "pool.no_such_name", Message: "pool: no such name"}},
		{Version: Version, Type: TypeRequest, ID: 4, Op: "free", Flow: 5, Body: mustEncode(f, map[string]any{"handle": 7}), NoReply: true},
	} {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// Negative and wide integers, which msgpack's reader would wrap.
	f.Add([]byte("\x84\xa1v\x01\xa1t\x01\xa2op\xa2ls\xa2id\xff"))
	f.Add([]byte("\x84\xa1v\xd0\x01\xa1t\x01\xa2op\xa2ls\xa2id\xd3\xff\xff\xff\xff\xff\xff\xff\xfb"))
	f.Add([]byte("\x85\xa1v\x01\xa1t\x02\xa2op\xa2ls\xa2id\xd1\x00\x05\xa4flow\xd2\x80\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The hand-written reader, where it accepts a frame, agrees with
		// msgpack's.
		var fast, slow Message
		if Validate(b) == nil && parseMessage(b, &fast) {
			if err := msgpack.Unmarshal(b, &slow); err != nil {
				t.Fatalf("fast reader accepted what msgpack refuses: %v", err)
			}
			if !messagesEqual(&fast, &slow) {
				t.Fatalf("fast %+v, reflection %+v", fast, slow)
			}
		}
		m, err := Decode(b)
		if err != nil {
			return
		}
		// No integer of the envelope was read around: what msgpack reads
		// generically is the same number, never negative.
		var generic map[string]any
		if msgpack.Unmarshal(b, &generic) == nil {
			for key, got := range map[string]uint64{"v": uint64(m.Version), "t": uint64(m.Type), "id": m.ID, "flow": m.Flow} {
				switch v := generic[key].(type) {
				case int8, int16, int32, int64:
					if n := reflectInt(v); n < 0 || uint64(n) != got {
						t.Fatalf("%s: msgpack reads %d, Decode %d", key, n, got)
					}
				}
			}
		}
		if m.Type == TypeRequest && m.ID == 0 {
			t.Fatalf("a request with id 0 was accepted")
		}
		b2, err := Encode(m)
		if err != nil {
			t.Fatalf("decoded message does not encode: %v", err)
		}
		m2, err := Decode(b2)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if m2.ID != m.ID || m2.Op != m.Op || m2.Flow != m.Flow || !bytes.Equal(m2.Body, m.Body) {
			t.Fatalf("round trip changed %+v to %+v", m, m2)
		}
	})
}

// randMessage is a message with fields of every size class of msgpack.
func randMessage(r *rand.Rand) *Message {
	u := func() uint64 { return r.Uint64() >> r.IntN(64) }
	s := func() string {
		return string(bytes.Repeat([]byte{'x'}, []int{0, 1, 31, 32, 255, 256, 70000}[r.IntN(7)]))
	}
	m := &Message{Version: uint16(u()), Type: Type(u()), ID: u(), Op: s()}
	if r.IntN(2) == 0 {
		m.Flow = u()
	}
	if r.IntN(2) == 0 {
		m.Body, _ = msgpack.Marshal(map[string]any{"size": u(), "name": s()})
	}
	if r.IntN(3) == 0 {
		m.Err = &WireError{Code: s(), Message: s()}
	}
	m.NoReply = r.IntN(3) == 0
	return m
}

// The hand-written envelope encoder writes what msgpack's reflection
// encoder writes, and the hand-written reader reads it back as msgpack does.
func TestEnvelopeMatchesReflection(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for range 2000 {
		m := randMessage(r)
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.UseCompactInts(true)
		if err := enc.Encode(m); err != nil {
			t.Fatal(err)
		}
		got := appendMessage(nil, m)
		if !bytes.Equal(got, buf.Bytes()) {
			t.Fatalf("%+v:\nhand %x\nrefl %x", m, got, buf.Bytes())
		}
		var fast, slow Message
		if !parseMessage(got, &fast) {
			t.Fatalf("%+v: the fast reader refused its own encoding", m)
		}
		if err := msgpack.Unmarshal(got, &slow); err != nil {
			t.Fatal(err)
		}
		if !messagesEqual(&fast, &slow) {
			t.Fatalf("fast %+v, reflection %+v", fast, slow)
		}
	}
}

func messagesEqual(a, b *Message) bool {
	if (a.Err == nil) != (b.Err == nil) || (a.Err != nil && *a.Err != *b.Err) {
		return false
	}
	return a.Version == b.Version && a.Type == b.Type && a.ID == b.ID && a.Op == b.Op &&
		a.Flow == b.Flow && bytes.Equal(a.Body, b.Body) && a.NoReply == b.NoReply
}

func reflectInt(v any) int64 {
	switch n := v.(type) {
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	}
	return 0
}
