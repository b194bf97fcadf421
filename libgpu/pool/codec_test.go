package pool

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/ipc/ipctest"
)

func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return r.Int64N(300) - 150
	case 1:
		return int64(r.Uint64())
	case 2:
		return []int64{math.MinInt64, math.MinInt32, math.MinInt16, math.MinInt8, -33, -32, 127, 128, 255, 256, 65535, 65536, math.MaxInt32, math.MaxInt64}[r.IntN(14)]
	}
	return r.Int64N(1 << 40)
}

func randStr(r *rand.Rand) string {
	if r.IntN(2) == 0 {
		return ""
	}
	return string(bytes.Repeat([]byte{'a' + byte(r.IntN(26))}, []int{1, 31, 32, 255, 256, 70000}[r.IntN(6)]))
}

func randBin(r *rand.Rand) []byte {
	if r.IntN(2) == 0 {
		return nil
	}
	b := make([]byte, []int{1, 64, 255, 256, 70000}[r.IntN(5)])
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func randInts(r *rand.Rand) []int64 {
	if r.IntN(2) == 0 {
		return nil
	}
	v := make([]int64, []int{1, 3, 15, 16, 300}[r.IntN(5)])
	for i := range v {
		v[i] = randInt(r)
	}
	return v
}

func randUints(r *rand.Rand) []uint64 {
	v := randInts(r)
	if v == nil {
		return nil
	}
	u := make([]uint64, len(v))
	for i, n := range v {
		u[i] = uint64(n)
	}
	return u
}

// TestCodecsMatchReflection: the hand-written encoders write exactly what
// reflection writes, and both decoders read it back to the same value, for
// random values of every field (empty and not, every integer width).
func TestCodecsMatchReflection(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for range 500 {
		vals := []any{
			AllocRequest{Name: randStr(r), Size: randInt(r), Keep: r.IntN(2) == 0, Unsealed: r.IntN(2) == 0, Legacy: r.IntN(2) == 0, DType: randStr(r), Shape: randInts(r)},
			Lease{Handle: r.Uint64() >> r.IntN(64), Name: randStr(r), Slab: r.Uint64() >> r.IntN(64), SlabSize: randInt(r), Kind: device.ShareKind(r.IntN(256)),
				Offset: randInt(r), Size: randInt(r), FD: r.IntN(2) == 0, Legacy: randBin(r), Sealed: r.IntN(2) == 0, DType: randStr(r), Shape: randInts(r),
				Event: randBin(r), Dropped: randUints(r)},
			FreeRequest{Handle: r.Uint64() >> r.IntN(65), Name: randStr(r)},
			FreeReply{Dropped: randUints(r)},
		}
		for _, v := range vals {
			want := ipctest.ReflectEncode(t, v)
			got := v.(ipc.BodyAppender).AppendBody(nil)
			if !bytes.Equal(got, want) {
				t.Fatalf("%T %+v:\nhand       %x\nreflection %x", v, v, got, want)
			}
			p := reflect.New(reflect.TypeOf(v))
			if !p.Interface().(ipc.BodyParser).ParseBody(got) {
				t.Fatalf("%T: ParseBody refused its own encoding %x", v, got)
			}
			if !reflect.DeepEqual(p.Elem().Interface(), v) {
				t.Fatalf("%T: read back %+v, wrote %+v", v, p.Elem().Interface(), v)
			}
		}
	}
}

// fuzzBody checks a hand-written decoder against reflection on arbitrary
// bytes: when ParseBody accepts a body, reflection reads the same value;
// when it refuses one, the value is untouched.
func fuzzBody[T any, P interface {
	*T
	ipc.BodyParser
}](t *testing.T, b []byte) {
	if ipc.Validate(b) != nil {
		return
	}
	var hand T
	if !P(&hand).ParseBody(b) {
		var zero T
		if !reflect.DeepEqual(hand, zero) {
			t.Fatalf("ParseBody refused %x but changed the value to %+v", b, hand)
		}
		return
	}
	var refl T
	if err := msgpack.Unmarshal(b, &refl); err != nil {
		t.Fatalf("ParseBody read %x as %+v; reflection fails: %v", b, hand, err)
	}
	if !reflect.DeepEqual(hand, refl) {
		t.Fatalf("%x: ParseBody %+v, reflection %+v", b, hand, refl)
	}
	// The encoder agrees with reflection on the value read, and what it
	// writes reads back to a value that encodes the same (empty and nil
	// slices are both omitted).
	enc := any(hand).(ipc.BodyAppender).AppendBody(nil)
	if want := ipctest.ReflectEncode(t, hand); !bytes.Equal(enc, want) {
		t.Fatalf("%+v: AppendBody %x, reflection %x", hand, enc, want)
	}
	var back T
	if !P(&back).ParseBody(enc) || !bytes.Equal(any(back).(ipc.BodyAppender).AppendBody(nil), enc) {
		t.Fatalf("%+v does not survive AppendBody and ParseBody: %+v", hand, back)
	}
}

func FuzzAllocRequestBody(f *testing.F) {
	f.Add(AllocRequest{Size: 4096}.AppendBody(nil))
	f.Add(AllocRequest{Name: "w", Size: 1 << 40, Keep: true, Unsealed: true, Legacy: true, DType: "f32", Shape: []int64{3, -1, 1 << 33}}.AppendBody(nil))
	f.Add(ipctest.ReflectEncode(f, map[string]any{"size": 1.5, "x": []any{1, "a"}}))
	f.Fuzz(fuzzBody[AllocRequest])
}

func FuzzLeaseBody(f *testing.F) {
	f.Add(Lease{Handle: 7, Slab: 1, SlabSize: 64 << 20, Kind: device.ShareMemfd, Offset: 256, Size: 4096}.AppendBody(nil))
	f.Add(Lease{Handle: 1 << 40, Name: "n", Slab: 300, SlabSize: 1 << 31, Kind: device.ShareLegacyIPC, Size: 9, FD: true, Legacy: make([]byte, 64),
		Sealed: true, DType: "bf16", Shape: []int64{2, 2}, Event: make([]byte, 64), Dropped: []uint64{1, 1 << 63}}.AppendBody(nil))
	f.Add(ipctest.ReflectEncode(f, map[string]any{"handle": -1, "legacy": "str", "dropped": nil}))
	f.Fuzz(fuzzBody[Lease])
}

func FuzzFreeRequestBody(f *testing.F) {
	f.Add(FreeRequest{Handle: 3}.AppendBody(nil))
	f.Add(FreeRequest{Name: "x/y"}.AppendBody(nil))
	f.Add(ipctest.ReflectEncode(f, map[string]any{"handle": uint64(1 << 63), "name": []byte("b")}))
	f.Fuzz(fuzzBody[FreeRequest])
}

func FuzzFreeReplyBody(f *testing.F) {
	f.Add(FreeReply{}.AppendBody(nil))
	f.Add(FreeReply{Dropped: []uint64{4, 5, 1 << 50}}.AppendBody(nil))
	f.Add(ipctest.ReflectEncode(f, map[string]any{"dropped": []any{-1}}))
	f.Fuzz(fuzzBody[FreeReply])
}
