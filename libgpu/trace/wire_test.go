package trace

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func randString(r *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz ./_-0123456789αβ"
	var b strings.Builder
	for b.Len() < n {
		b.WriteByte(letters[r.IntN(len(letters))])
	}
	return b.String()
}

func randRecord(r *rand.Rand) Record {
	rec := Record{Kind: Kind(1 + r.IntN(int(maxKind))), Track: r.Uint32(), Start: r.Int64N(math.MaxInt64), Name: randString(r, 1+r.IntN(40))}
	switch rec.Kind {
	case KindSpan, KindInstant:
		rec.Cat = randString(r, r.IntN(10))
		if rec.Kind == KindSpan {
			rec.Dur = r.Int64N(1 << 40)
			rec.FlowDir = uint8(r.IntN(3))
			if rec.FlowDir != FlowNone {
				rec.Flow = 1 + r.Uint64N(math.MaxUint64-1)
			}
		}
		rec.NArgs = uint8(r.IntN(MaxArgs + 1))
		for i := 0; i < int(rec.NArgs); i++ {
			switch r.IntN(3) {
			case 0:
				rec.Args[i] = Int(randString(r, 3), r.Int64())
			case 1:
				rec.Args[i] = Str(randString(r, 3), randString(r, r.IntN(20)))
			default:
				rec.Args[i] = Float(randString(r, 3), r.NormFloat64())
			}
		}
	case KindCounter:
		rec.Value = r.NormFloat64() * 1e9
	}
	return rec
}

func TestBatchRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for iter := 0; iter < 200; iter++ {
		n := r.IntN(50)
		recs := make([]Record, n)
		pid, dropped := r.Uint32(), r.Uint32()
		b := AppendBatchHeader(nil, pid, dropped, uint16(n))
		for i := range recs {
			recs[i] = randRecord(r)
			b = AppendRecord(b, &recs[i])
		}
		got, err := DecodeBatch(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.PID != pid || got.Dropped != dropped || len(got.Records) != n {
			t.Fatalf("header %d %d %d, want %d %d %d", got.PID, got.Dropped, len(got.Records), pid, dropped, n)
		}
		for i := range recs {
			if !reflect.DeepEqual(got.Records[i], recs[i]) {
				t.Fatalf("record %d:\n got %+v\nwant %+v", i, got.Records[i], recs[i])
			}
		}
		// Every strict prefix is refused.
		if n > 0 {
			cut := r.IntN(len(b))
			if _, err := DecodeBatch(b[:cut]); !errors.Is(err, ErrMalformed) {
				t.Fatalf("prefix of %d/%d bytes: %v", cut, len(b), err)
			}
		}
	}
}

func TestLongStringsAreCut(t *testing.T) {
	long := strings.Repeat("x", MaxString+100)
	rec := Record{Kind: KindInstant, Name: long, Cat: "c"}
	b := AppendRecord(AppendBatchHeader(nil, 1, 0, 1), &rec)
	got, err := DecodeBatch(b)
	if err != nil || got.Records[0].Name != long[:MaxString] {
		t.Fatalf("%v, name of %d bytes", err, len(got.Records[0].Name))
	}
}

func TestDecodeRejects(t *testing.T) {
	good := func() []byte {
		rec := Record{Kind: KindSpan, Name: "n", Cat: "c", Dur: 5, FlowDir: FlowOut, Flow: 7}
		return AppendRecord(AppendBatchHeader(nil, 1, 0, 1), &rec)
	}
	if _, err := DecodeBatch(good()); err != nil {
		t.Fatal(err)
	}
	off := batchHeader // start of the record
	cases := map[string]func([]byte) []byte{
		"magic":         func(b []byte) []byte { b[0] = 'X'; return b },
		"kind 0":        func(b []byte) []byte { b[off] = 0; return b },
		"kind 9":        func(b []byte) []byte { b[off] = 9; return b },
		"negative ts":   func(b []byte) []byte { b[off+12] = 0x80; return b },
		"negative dur":  func(b []byte) []byte { b[off+20] = 0x80; return b },
		"trailing":      func(b []byte) []byte { return append(b, 0) },
		"count too big": func(b []byte) []byte { b[12] = 2; return b },
		"flow 0": func([]byte) []byte {
			return AppendRecord(AppendBatchHeader(nil, 1, 0, 1), &Record{Kind: KindSpan, Name: "n", FlowDir: FlowIn})
		},
		"empty name": func([]byte) []byte {
			return AppendRecord(AppendBatchHeader(nil, 1, 0, 1), &Record{Kind: KindTrack})
		},
		"NaN counter": func([]byte) []byte {
			return AppendRecord(AppendBatchHeader(nil, 1, 0, 1), &Record{Kind: KindCounter, Name: "c", Value: math.NaN()})
		},
		"5 args": func([]byte) []byte {
			b := AppendRecord(AppendBatchHeader(nil, 1, 0, 1), &Record{Kind: KindInstant, Name: "n"})
			b[len(b)-1] = MaxArgs + 1
			return b
		},
	}
	for name, mutate := range cases {
		if _, err := DecodeBatch(mutate(good())); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestFloatArgNonFinite(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if a := Float("k", v); a.Type != argStr {
			t.Errorf("Float(%v) has type %d", v, a.Type)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 4; i++ {
		b := AppendBatchHeader(nil, 1, 0, 3)
		for j := 0; j < 3; j++ {
			rec := randRecord(r)
			b = AppendRecord(b, &rec)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		bt, err := DecodeBatch(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// What decodes encodes back to the same bytes.
		out := AppendBatchHeader(nil, bt.PID, bt.Dropped, uint16(len(bt.Records)))
		for i := range bt.Records {
			out = AppendRecord(out, &bt.Records[i])
		}
		if string(out) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}
